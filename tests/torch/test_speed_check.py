"""optimize()'s end-to-end check: the eager forward and the optimized one, side by side."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import speed
from dnntune.torch._undo import Undo


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def test_eval_mode_with_example_inputs_reports_both_forwards(tmp_path: Path) -> None:
    model = _model()
    x = torch.randn(4, 16)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.eager_forward_ms is not None and report.eager_forward_ms > 0
    assert report.forward_ms is not None and report.forward_ms > 0
    assert report.speedup == pytest.approx(report.eager_forward_ms / report.forward_ms)
    assert "forward on the example inputs" in str(report)


def test_the_check_is_skipped_in_training_mode_and_on_request(tmp_path: Path) -> None:
    x = torch.randn(4, 16)
    train = _model().train()
    report = dtt.optimize(train, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.eager_forward_ms is None and report.speedup is None
    off = dtt.optimize(
        _model(), (x,), policy="heuristic", overrides=tmp_path / "o.json", check_speed=False
    )
    assert off.forward_ms is None and "forward on the example" not in str(off)
    assert dtt.optimize(_model(), policy="heuristic", overrides=None).forward_ms is None


def test_a_slower_optimized_forward_warns_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    times = iter([1.0, 2.0])  # eager, then optimized
    # the module, not the function of the same name that dnntune.torch exports
    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: next(times))
    # a CPU model: no CUDA-graph replay to advise (it was advised; new-user audit, session 20)
    with pytest.warns(dtt.DnnTuneSlowerWarning, match=r"0\.50x.*optimize's defaults"):
        report = dtt.optimize(
            _model(),
            (torch.randn(4, 16),),
            policy="heuristic",
            overrides=tmp_path / "o.json",
            refine=False,
            revert_if_slower=False,  # the default reverts instead of warning
        )
    assert report.speedup == pytest.approx(0.5)


def test_the_advice_fits_the_device() -> None:
    with pytest.warns(dtt.DnnTuneSlowerWarning, match=r"cuda_graph=True\) replays"):
        speed.warn_if_slower(1.0, 2.0, cuda_graph=False, on_cuda=True)
    with pytest.warns(dtt.DnnTuneSlowerWarning, match=r"refine=True, revert_if_slower=True") as rec:
        speed.warn_if_slower(1.0, 2.0, cuda_graph=False, on_cuda=False)
    assert "cuda_graph" not in str(rec[0].message)


def test_faster_or_within_noise_is_quiet() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        speed.warn_if_slower(1.0, 1.01, cuda_graph=False)
        speed.warn_if_slower(1.0, 0.5, cuda_graph=True)


def test_forward_ms_times_the_module_without_changing_it() -> None:
    model = _model()
    before = copy.deepcopy(model.state_dict())
    ms = speed.forward_ms(model, (torch.randn(2, 16),))
    assert ms > 0
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])


@pytest.mark.gpu
def test_the_check_on_cuda_with_graph_replay(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = _model().cuda().half()
    x = torch.randn(8, 16, device="cuda", dtype=torch.half)
    report = dtt.optimize(
        model, (x,), policy="tune", overrides=tmp_path / "o.json", cuda_graph=True
    )
    assert report.cuda_graph and report.forward_ms is not None and report.forward_ms > 0
    assert report.eager_forward_ms is not None and report.eager_forward_ms > 0


def test_interleaved_forward_ms_times_both_side_by_side_and_ends_optimized() -> None:
    """Rounds alternate which forward goes first; the module is switched between rounds, not
    within them; it is left optimized, also when a forward raises."""
    state = {"optimized": False}
    switches: list[str] = []
    calls = {"e": 0, "o": 0}

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls["o" if state["optimized"] else "e"] += 1
            return x * 2

    def to_eager() -> None:
        state["optimized"] = False
        switches.append("e")

    def to_optimized() -> None:
        state["optimized"] = True
        switches.append("o")

    eager_ms, optimized_ms = speed.interleaved_forward_ms(
        Model(), (torch.randn(2),), to_eager, to_optimized, rounds=4
    )
    assert eager_ms > 0 and optimized_ms > 0 and state["optimized"]
    # warm-up e, o; rounds (o, e), (e, o), (o, e), (e, o); then left optimized
    assert switches == ["e", "o", "o", "e", "e", "o", "o", "e", "e", "o", "o"]
    assert calls["e"] == calls["o"] > 4

    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not state["optimized"]:
                raise RuntimeError("boom")  # in the warm-up already
            return x

    switches.clear()
    with pytest.raises(RuntimeError, match="boom"):
        speed.interleaved_forward_ms(Broken(), (torch.randn(2),), to_eager, to_optimized)
    assert state["optimized"] and switches[-1] == "o"


def test_an_uncaptured_optimized_forward_is_judged_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The revert decision reads the side-by-side re-time, not the before/after figures: each
    switch puts the model wholly on PyTorch's classes, or back on dnntune's."""
    from dnntune.torch.modules import SWAPS

    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "paired_forward_ms", optimize_module.__dict__["_paired"])
    seen: list[tuple[str, ...]] = []
    model = _model()

    def fake_interleaved(
        module: nn.Module, inputs: object, to_eager: object, to_optimized: object
    ) -> tuple[float, float]:
        for switch in (to_eager, to_optimized, to_eager, to_optimized):
            switch()  # type: ignore[operator]
            seen.append(tuple(type(m).__name__ for m in module.modules()))
        return 1.0, 2.0  # dnntune twice as slow, side by side (before/after said equal)

    monkeypatch.setattr(optimize_module, "interleaved_forward_ms", fake_interleaved)
    report = dtt.optimize(
        model, (torch.randn(4, 16),), policy="heuristic", overrides=tmp_path / "o.json"
    )
    pytorch_names = tuple(type(m).__name__ for m in _model().modules())
    assert seen[0] == seen[2] == pytorch_names
    assert seen[1] == seen[3] != pytorch_names
    assert any(name in {t.__name__ for t in SWAPS.values()} for name in seen[1])
    assert report.side_by_side and report.reverted
    assert (report.eager_forward_ms, report.forward_ms) == (1.0, 2.0)
    assert "timed side by side" in str(report)
    assert tuple(type(m).__name__ for m in model.modules()) == pytorch_names  # reverted


def test_the_switch_keeps_the_captured_graph_state(tmp_path: Path) -> None:
    """Back on dnntune's forward, a module has the very capture state it had (graphs are not
    recorded again, signatures found uncapturable stay so)."""
    from dnntune.torch import cuda_graphs

    model = _model()
    undo = Undo(model)
    cuda_graphs.install(model)
    state = cuda_graphs.graphs_of(model)
    to_pytorch, to_optimized = undo.switcher()
    to_pytorch()
    assert type(model) is nn.Sequential
    to_optimized()
    assert type(model) is not nn.Sequential and cuda_graphs.graphs_of(model) is state
    with torch.no_grad():
        model(torch.randn(2, 16))  # CPU: runs uncaptured through the installed forward


def test_the_end_check_times_the_optimized_forward_once_where_the_pair_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uncaptured (the CPU), the side-by-side pair decides: the optimized forward is not also
    timed on its own first (a full check whose figure the pair overwrote, unread)."""
    optimize_module = sys.modules["dnntune.torch.optimize"]
    timed: list[str] = []

    def clock(module: nn.Module, inputs: object) -> float:
        timed.append("alone")  # PyTorch's forward before anything changes, or dnntune's
        return 1.0

    def pair(module: nn.Module, inputs: object, undo: object) -> tuple[float, float]:
        timed.append("pair")
        return 1.0, 1.0

    monkeypatch.setattr(optimize_module, "forward_ms", clock)
    monkeypatch.setattr(optimize_module, "paired_forward_ms", pair)
    report = dtt.optimize(
        _model(),
        (torch.randn(4, 16),),
        policy="heuristic",
        overrides=tmp_path / "o.json",
        refine=False,
    )
    assert timed == ["alone", "pair"]  # the old code: ["alone", "alone", "pair"]
    assert report.side_by_side and not report.reverted


def test_without_a_pair_the_end_check_times_the_optimized_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no pair is timed (the conftest's None), the optimized forward's own timing
    decides, as before."""
    optimize_module = sys.modules["dnntune.torch.optimize"]
    figures = iter([1.0, 2.0])  # PyTorch's 1 ms before, dnntune's 2 ms after
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: next(figures))
    report = dtt.optimize(
        _model(),
        (torch.randn(4, 16),),
        policy="heuristic",
        overrides=tmp_path / "o.json",
        refine=False,
    )
    assert (report.eager_forward_ms, report.forward_ms) == (1.0, 2.0)
    assert report.reverted and not report.side_by_side
