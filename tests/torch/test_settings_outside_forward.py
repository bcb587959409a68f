"""An optimized model's settings (its policy, override file, ranking clock: what ``optimize``
was given) are in force through its forward, put there by a context variable. Work of the
model's that runs outside that forward must run under them too, not under the process's
(``dtt.configure``): the backward pass of dnntune's training kernels, which autograd runs
after the forward has returned."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch_models import kernel_plan

import dnntune as dt
import dnntune.torch as dtt
from dnntune.backend.engine import Plan
from dnntune.torch import runtime
from dnntune.torch.config import current


def _record_choices(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str | None]]:
    """Every kernel choice from now on as (graph, policy, override file) in force there, each
    choice taking its kernel path (``kernel_plan``: dnntune's training kernels run)."""
    seen: list[tuple[str, str, str | None]] = []

    def heuristic(graph: dt.Graph, handle: dt.Handle) -> Plan:
        seen.append((graph.name, current().policy, current().overrides))
        return kernel_plan(graph, handle)

    monkeypatch.setattr(runtime, "_heuristic", heuristic)
    return seen


_MODELS = {
    "linear": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (4, 16)),
    "conv2d": (
        lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)),
        (2, 3, 8, 8),
    ),
}


@pytest.mark.parametrize("kind", list(_MODELS))
def test_backward_chooses_its_kernels_under_the_models_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The dgrad and wgrad kernels of a training step are chosen in ``backward``, which
    autograd runs after the model's forward returned: they were chosen under the process's
    policy and override file, not the model's."""
    seen = _record_choices(monkeypatch)
    dtt.configure(policy="heuristic", overrides=tmp_path / "process.json")
    ours = str(tmp_path / "model.json")
    make, shape = _MODELS[kind]
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref)
    x = torch.randn(*shape)
    dtt.optimize(model, (x,), policy="cached", overrides=ours, check_speed=False)
    seen.clear()
    for m in (model, ref):
        m.train()
        m(x).pow(2).sum().backward()
    backward = [s for s in seen if s[0].endswith(("_dgrad", "_wgrad"))]
    assert backward, seen  # the step ran dnntune's backward kernels
    assert all(s[1:] == ("cached", ours) for s in backward), backward
    for mine, theirs in zip(model.parameters(), ref.parameters(), strict=True):
        assert mine.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)
