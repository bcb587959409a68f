"""``model_conformance.py --zoo``: real model code (torchvision, timm, transformers) through
the same checks as the random models. CI has none of those libraries, so the zoo's plumbing is
tested here with models written in PyTorch alone, entered as the zoo enters a real one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_helpers import REPO, run_benchmark
from torch import nn

sys.path.insert(0, str(REPO / "benchmarks"))

import _real_models
import model_conformance
from _real_models import ZOO, Entry, Main, available, perturbed_state, zoo_case, zoo_entries


class _Block(nn.Module):
    """A residual conv + batch norm block, as torchvision writes one."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.5)  # the zoo turns it off: a train step must be deterministic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.drop(self.bn(self.conv(x))) + x)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(_Block(8), _Block(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


_MINI = Entry("mini_cnn", "torch", _Net, lambda b: (b, 3, 8, 8), cnn=True)


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return model_conformance.parse_args(["--out", str(tmp_path), *extra])


def test_zoo_names_pick_models_or_libraries() -> None:
    assert zoo_entries("all") == ZOO
    assert {e.library for e in zoo_entries("torchvision")} == {"torchvision"}
    assert [e.name for e in zoo_entries("hf_llama, timm_dla")] == ["timm_dla", "hf_llama"]
    with pytest.raises(SystemExit, match=r"unknown model or library nope.*hf_llama"):
        zoo_entries("hf_llama,nope")


def test_models_whose_library_is_missing_are_left_out_with_the_reason() -> None:
    missing = Entry("x", "no_such_library_here", _Net, _MINI.shape)
    kept, why = available((_MINI, missing))
    assert kept == [_MINI]
    assert "ModuleNotFoundError" in why["no_such_library_here"]


def test_the_entry_point_says_which_names_exist(tmp_path: Path) -> None:
    result = run_benchmark(
        "model_conformance.py", "--zoo", "nope", "--out", str(tmp_path / "o"), out=tmp_path
    )
    assert result.returncode != 0
    assert "unknown model or library nope" in result.stderr and "tv_resnet50" in result.stderr


def test_a_zoo_model_passes_every_check_on_the_kernel_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zoo's case of a residual CNN: dropout off, new weights near its own, gradients over
    draws in float32 too, every condition checked on dnntune's kernel path."""
    from dnntune.torch import runtime

    monkeypatch.setattr(runtime, "_heuristic", model_conformance.kernel_path_heuristic)
    case = zoo_case(3, [_MINI], "cpu", torch.float32)
    assert case.float32_draws and case.relative_edits and case.new_state is perturbed_state
    drops = [m.p for m in case.model.modules() if isinstance(m, nn.Dropout)]
    assert drops == [0.0, 0.0]
    args = _args(tmp_path, "--policy", "heuristic", "--kernel-path")
    result = model_conformance.check_model(3, args, tmp_path, lambda s: case)
    assert (result.status, result.failed) == ("ok", [])
    assert result.fusions >= 2 and result.rejected == 0
    runtime.cache().clear()


def test_new_weights_keep_the_modules_versions_and_valid_statistics() -> None:
    """MNASNet reads its version from the state dict's metadata on load."""
    model = _Net()
    state = perturbed_state(model, torch.Generator().manual_seed(0))
    assert state._metadata == model.state_dict()._metadata  # type: ignore[attr-defined]
    assert all(v.min() >= 0.5 for k, v in state.items() if k.endswith("running_var"))
    weight = model.stem.weight.detach()
    moved = (state["stem.weight"] - weight).abs().mean() / weight.abs().mean()
    assert 0.1 < moved < 1.0  # near its own scale, not a unit-scale draw
    model.load_state_dict(state)


def test_main_takes_one_tensor_and_gives_the_main_output() -> None:
    """A transformers model: ``x`` as its keyword, a padding mask from ``x``'s shape, the
    output's ``last_hidden_state`` (else its first element)."""
    seen: dict[str, Any] = {}

    class Output(dict):
        last_hidden_state: torch.Tensor

    class Model(nn.Module):
        def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            seen["mask"] = attention_mask
            out = Output()
            out.last_hidden_state = inputs_embeds * 2
            return out

    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(Main(Model(), "inputs_embeds", mask=True)(x), x * 2)
    assert seen["mask"].tolist() == [[1, 1, 1, 1, 0]] * 2
    assert Main(nn.LSTM(4, 3, batch_first=True))(x).shape == (2, 5, 3)  # a tuple's first


def test_every_zoo_entry_is_named_once_with_a_known_library() -> None:
    names = [e.name for e in _real_models.ZOO]
    assert len(names) == len(set(names)) >= 40
    assert {e.library for e in ZOO} == {"torchvision", "timm", "transformers"}
