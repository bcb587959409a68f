"""optimize()'s default refinement (issue 23): same-signature modules decided as one group, side
by side, and the whole-model revert only as the last resort. Clocks are scripted: each reads
which modules carry the PyTorch flag, so the decisions are deterministic."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch.refine import PAIR_ORDER

optimize_module = sys.modules["dnntune.torch.optimize"]


def _stack() -> nn.Module:
    """Three same-signature Linear(16, 16) + ReLU blocks, a LayerNorm, a Linear(16, 4) head."""
    torch.manual_seed(0)
    blocks = [m for _ in range(3) for m in (nn.Linear(16, 16), nn.ReLU())]
    return nn.Sequential(*blocks, nn.LayerNorm(16), nn.Linear(16, 4)).eval()


def _flagged(module: nn.Module) -> set[str]:
    return {n for n, m in module.named_modules() if m.__dict__.get(PYTORCH_FLAG)}


def _clock(cost: dict[str, float], base: float = 10.0) -> Any:
    """Forward ms = base + the sum of cost[name] over flagged modules; counts the calls."""

    def clock(module: nn.Module, inputs: Sequence[Any]) -> float:
        clock.calls += 1  # type: ignore[attr-defined]
        return base + sum(cost.get(n, 0.0) for n in _flagged(module))

    clock.calls = 0  # type: ignore[attr-defined]
    return clock


def test_same_signature_modules_are_one_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each of the three hidden Linears saves 1 ms on PyTorch's ops; the head costs 1 ms more
    clock = _clock({"0": -1.0, "2": -1.0, "4": -1.0, "7": +1.0})
    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    model = _stack()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    by_name = {r.name: r for r in report.swapped}
    assert [by_name[n].pytorch for n in ("0", "2", "4")] == [True, True, True]
    assert not by_name["7"].pytorch and not by_name["6"].pytorch
    assert _flagged(model) == {"0", "2", "4"}
    # three groups (the hidden Linears, the LayerNorm, the head): one side-by-side decision
    # each, plus the eager and final forwards of the end-to-end check
    assert clock.calls == 3 * len(PAIR_ORDER) + 2
    assert len(report.refined) == 3
    assert report.refined[0].startswith("Linear x3 (0, 2, 4) on PyTorch's ops: forward")
    assert "refine: Linear x3" in str(report) and not report.reverted
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_refine_is_the_default_only_where_it_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _clock({"0": -1.0})
    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    x = torch.randn(5, 16)
    on = dtt.optimize(_stack(), (x,), policy="heuristic", overrides=tmp_path / "a.json")
    assert on.refined
    off = dtt.optimize(
        _stack(), (x,), policy="heuristic", overrides=tmp_path / "b.json", refine=False
    )
    assert not off.refined and not any(r.pytorch for r in off.swapped)
    train = dtt.optimize(_stack().train(), (x,), policy="heuristic", overrides=None)
    assert not train.refined  # training mode: no end-to-end check, nothing to refine on
    no_inputs = dtt.optimize(_stack(), policy="heuristic", overrides=None)
    assert not no_inputs.refined


def test_a_decision_is_side_by_side_and_noise_keeps_dnntune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's timings alternate on/off/off/on; a 1 % difference (inside the 2 % noise
    band) leaves the group on dnntune."""
    order: list[bool] = []

    def clock(module: nn.Module, inputs: Sequence[Any]) -> float:
        flagged = bool(_flagged(module))
        order.append(flagged)
        return 9.9 if flagged else 10.0

    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    model = nn.Sequential(nn.Linear(16, 4)).eval()
    report = dtt.optimize(model, (torch.randn(2, 16),), policy="heuristic", overrides=None)
    assert order[1 : 1 + len(PAIR_ORDER)] == list(PAIR_ORDER)
    assert not report.swapped[0].pytorch and not _flagged(model)


def test_revert_is_the_last_resort_and_a_result_not_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Still slower after refine (no group helps): the model is put back, the report says so,
    and no DnnTuneSlowerWarning is raised; with revert_if_slower=False it warns instead."""
    calls = {"n": 0}

    def clock(module: nn.Module, inputs: Sequence[Any]) -> float:
        calls["n"] += 1
        return 5.0 if calls["n"] == 1 else 10.0  # eager 5 ms; every optimized state 10 ms

    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    model = _stack()
    classes = [type(m) for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = dtt.optimize(model, (torch.randn(5, 16),), policy="heuristic", overrides=None)
    assert report.reverted and "reverted" in str(report)
    assert [type(m) for m in model.modules()] == classes
    assert not any(r.pytorch for r in report.swapped)  # refine ran and kept nothing

    calls["n"] = 0
    with pytest.warns(dtt.DnnTuneSlowerWarning):
        kept = dtt.optimize(
            _stack(),
            (torch.randn(5, 16),),
            policy="heuristic",
            overrides=None,
            revert_if_slower=False,
        )
    assert not kept.reverted


def test_a_groups_line_names_both_forwards() -> None:
    """The report's refine line says which forward each time is (the second read as a bare
    number: "0.299 ms on dnntune, 0.947 ms"; new-user audit, session 20)."""
    from dnntune.torch.optimize_report import SwapRecord
    from dnntune.torch.refine import RefineGroup

    group = RefineGroup(("k",), [SwapRecord("stem.0", "Conv2d")], 0.299, 0.947)
    assert group.describe() == (
        "Conv2d x1 (stem.0) on dnntune: forward 0.299 ms on dnntune, 0.947 ms on PyTorch's ops"
    )


def test_refine_leaves_out_layers_that_ran_none_of_their_calls_on_dnntune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float64 model runs PyTorch's op in every layer: nothing to decide. Before, each layer
    was timed on and off anyway (four forwards of noise each) and a noisy "faster on PyTorch's
    ops" replaced the report's true line (new-user audit)."""
    clock = _clock({"0": -1.0, "7": -1.0})  # scripted: PyTorch's ops would read faster
    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    model = _stack().double()
    x = torch.randn(5, 16, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)  # float64: expected
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.refined == [] and _flagged(model) == set()
    assert clock.calls == 2  # the check's two forwards, no refine timings
    assert not any(r.pytorch for r in report.swapped)
    lines = [line for line in str(report).splitlines() if line.startswith("  7: Linear")]
    assert len(lines) == 1 and "ran none of its calls on dnntune" in lines[0]


def _optimized_kept(block: nn.Module, tmp_path: Path) -> Any:
    """``Sequential(block, LayerNorm(16))`` optimized under the scripted clock, never reverted;
    its outputs checked against eager's. Returns the report."""
    torch.manual_seed(0)
    model = nn.Sequential(block, nn.LayerNorm(16)).eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneSlowerWarning)  # the scripted clock's
        report = dtt.optimize(
            model, (x,), policy="heuristic", overrides=tmp_path / "o.json", revert_if_slower=False
        )
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
    return report


class _GeluBlock(nn.Module):
    """``x + out(gelu(fc(x)))``: two traced fusions, ``fc + gelu`` and ``out + residual add``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.nn.functional.gelu(self.fc(x)))


def test_a_fusion_whose_layer_refine_put_on_pytorchs_ops_is_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its fused call runs PyTorch's separate ops: a new-user audit read ``fused: 0: fc + gelu``
    beside ``0.fc: ... -> PyTorch's own ops``. The other fusion, on dnntune, stays listed."""
    monkeypatch.setattr(optimize_module, "forward_ms", _clock({"0.fc": -1.0}))
    report = _optimized_kept(_GeluBlock(), tmp_path)
    assert [r.name for r in report.swapped if r.pytorch] == ["0.fc"]
    assert report.fusions == ["0: out + residual add"]
    assert "fused: 0: fc + gelu" not in str(report)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _TailBlock(nn.Module):
    """``x + mlp(x)``: the child's last Linear takes the parent's add (``._module_tails``)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


@pytest.mark.parametrize("refined", [False, True])
def test_a_childs_projection_that_takes_the_add_says_so_and_refine_unlists_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refined: bool
) -> None:
    """The projection's row names the add it took (``0.mlp.fc2: Linear + residual add``; before,
    only the fusion's own line, under the child's name, did), and where refine puts that
    projection on PyTorch's ops, the fusion it ran is not listed (session 58's audit)."""
    cost = {"0.mlp.fc2": -1.0 if refined else 0.0}
    monkeypatch.setattr(optimize_module, "forward_ms", _clock(cost))
    report = _optimized_kept(_TailBlock(), tmp_path)
    rows = {r.name: r for r in report.swapped}
    assert rows["0.mlp.fc2"].fused == ["residual add"]
    assert rows["0.mlp.fc2"].pytorch is refined
    assert ("0: mlp + residual add" in report.fusions) is not refined
