"""A model built on the meta device (deferred initialization: ``torch.device("meta")``, then
``to_empty`` and ``load_state_dict``) can be optimized before its weights exist: optimize's
put-back of the buffers compared them with ``torch.equal``, which has no meta kernel, so it
raised NotImplementedError (new-user audit)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import dnntune.torch as dtt


def _net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4)
    )


def test_a_model_on_the_meta_device_is_optimized_then_materialized(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _net().eval()
    with torch.no_grad():
        ref[1].running_mean.normal_()
        ref[1].running_var.uniform_(0.5, 2.0)
    with torch.device("meta"):
        model = _net().eval()
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == ["<root>: 0 + 1 + relu"]
    model.to_empty(device="cpu")
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
