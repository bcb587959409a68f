"""optimize(..., cuda_graph="auto"), the default: replay where that is faster (issue 23)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.errors import InvalidValueError
from dnntune.torch.cuda_graphs import graphs_of
from dnntune.torch.graph_choice import (
    Choice,
    GraphTimes,
    can_choose,
    choose,
    doubt_to_pytorch,
    graph_setting,
    readings,
)


def _model(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)
        )
        .to(device)
        .eval()
    )


class _HostSync(nn.Module):
    """Reads a value on the host mid-forward: cannot be recorded as a CUDA graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum().item() > 1e9:  # a host sync, as mask building often has
            h = h * 0
        return self.b(h)


# ---- the decision, without a GPU --------------------------------------------------------------
@pytest.mark.parametrize(
    ("times", "want"),
    [
        # dnntune faster than PyTorch's best beyond noise: dnntune's, replayed when it records
        (GraphTimes(2.0, 1.0, 0.9, True), Choice.DNNTUNE_GRAPH),
        (GraphTimes(1.0, None, 0.9, False), Choice.DNNTUNE),
        # within noise of PyTorch's best: PyTorch's (a tie goes to the simpler option)
        (GraphTimes(1.0, 1.0, 1.0, True), Choice.PYTORCH),
        (GraphTimes(2.0, 1.0, 0.99, True), Choice.PYTORCH_GRAPH),
        (GraphTimes(1.0, None, 0.99, False), Choice.PYTORCH),
        # PyTorch's replay faster: PyTorch's forward, replayed
        (GraphTimes(2.0, 0.5, 0.8, True), Choice.PYTORCH_GRAPH),
        # eager cannot be recorded and is faster: PyTorch's forward, uncaptured
        (GraphTimes(1.0, None, 1.5, False), Choice.PYTORCH),
        # the replay is slower than eager (copies in and out of a tiny forward): eager is the bar
        (GraphTimes(1.0, 1.2, 1.1, True), Choice.PYTORCH),
        (GraphTimes(1.0, 1.2, 0.9, True), Choice.DNNTUNE_GRAPH),
    ],
)
def test_dnntune_is_kept_only_where_it_is_faster_beyond_noise(
    times: GraphTimes, want: Choice
) -> None:
    assert choose(times) is want


def test_the_report_keeps_both_readings_of_each_option() -> None:
    """The decision takes PyTorch's better reading; the report keeps both (a host whose speed
    moved between them shows it)."""
    before = GraphTimes(9.1, 5.05, 4.9, True)
    end = (4.74, 5.04, 4.89)
    assert readings(before, end) == {
        "pytorch": [9.1, 4.74],
        "pytorch+cuda_graph": [5.05, 5.04],
        "dnntune": [4.9, 4.89],
    }
    assert doubt_to_pytorch(before, end) == GraphTimes(4.74, 5.04, 4.89, True)
    # an option not timed before (or not recordable at the end) keeps the readings it has
    assert readings(GraphTimes(2.0, None, 1.0, False), (1.5, None, 1.1))["pytorch+cuda_graph"] == []


def test_the_setting_is_checked() -> None:
    assert graph_setting("auto") == "auto"
    assert graph_setting(True) is True and graph_setting(False) is False
    with pytest.raises(InvalidValueError, match=r"True, False or 'auto'"):
        graph_setting("sometimes")
    with pytest.raises(InvalidValueError, match="sometimes"):
        dtt.optimize(_model(), cuda_graph="sometimes", overrides=None)  # type: ignore[arg-type]


def test_auto_runs_uncaptured_where_it_cannot_measure(tmp_path: Path) -> None:
    x = torch.randn(2, 4, 6, 6)
    assert not can_choose(_model(), (x,), check=True)  # CPU inputs
    assert not can_choose(_model(), None, check=True)
    report = dtt.optimize(_model(), (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.choice is None and not report.cuda_graph
    assert "cuda_graph='auto'" not in str(report)


# ---- on the GPU -------------------------------------------------------------------------------
@pytest.fixture
def scripted_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """forward_ms returns these in order: eager, eager replayed, dnntune (then refine's)."""
    times: list[float] = []
    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: times.pop(0))
    yield times


def _optimized_on_cuda(
    tmp_path: Path,
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, dtt.OptimizeReport]:
    """The conv model on CUDA, its eager output, and optimize()'s default ("auto") applied."""
    model = _model("cuda")
    x = torch.randn(2, 4, 6, 6, device="cuda")
    with torch.no_grad():
        want = model(x)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    return model, x, want, report


@pytest.mark.gpu
def test_auto_keeps_dnntune_replayed_when_it_is_faster(
    tmp_path: Path, scripted_clock: list[float]
) -> None:
    scripted_clock.extend([2.0, 1.0, 0.5])  # eager, eager replayed, dnntune replayed
    model, x, want, report = _optimized_on_cuda(tmp_path)
    assert report.choice == Choice.DNNTUNE_GRAPH and report.cuda_graph and not report.reverted
    assert report.eager_graph_ms == 1.0 and report.chosen_forward_ms == 0.5
    replays = graphs_of(model).replays
    with torch.no_grad():
        got = model(x * 1.0)
    assert graphs_of(model).replays == replays + 1
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    assert "cuda_graph='auto': runs dnntune+cuda_graph" in str(report)


@pytest.mark.gpu
def test_auto_keeps_pytorch_on_a_tie(tmp_path: Path) -> None:
    model, _, _, report = _optimized_on_cuda(tmp_path)  # the neutral clock: all forwards tie
    assert report.eager_graph_ms is not None and report.reverted
    assert report.choice == Choice.PYTORCH  # the replay is not faster than eager either
    assert not any(type(m).__name__.startswith("DnnTune") for m in model.modules())


@pytest.mark.gpu
def test_auto_falls_back_to_pytorch_replayed_when_that_is_faster(
    tmp_path: Path, scripted_clock: list[float]
) -> None:
    scripted_clock.extend([2.0, 0.5, 0.9])  # eager, eager replayed, dnntune replayed
    model, x, want, report = _optimized_on_cuda(tmp_path)
    assert report.choice == Choice.PYTORCH_GRAPH and report.reverted and report.cuda_graph
    assert report.chosen_forward_ms == 0.5
    assert not any(type(m).__name__.startswith("DnnTune") for m in model.modules())
    records = graphs_of(model).records
    assert records >= 1  # recorded inside optimize, not in the user's first call
    with torch.no_grad():
        got = model(x)
    assert graphs_of(model).records == records
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "replayed as a CUDA graph" in str(report)


@pytest.mark.gpu
def test_auto_with_a_host_sync_runs_uncaptured_without_a_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _HostSync().cuda().eval()
    x = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        want = model(x)
    theirs = torch.cuda.Stream()  # the caller's stream stays current after failed captures
    with torch.cuda.stream(theirs):
        # pytest runs with warnings as errors: an uncapturable forward is a result, not a warning
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
        assert torch.cuda.current_stream() == theirs
        assert report.eager_graph_ms is None
        assert report.choice == Choice.PYTORCH and not report.cuda_graph  # a tie: PyTorch's
        assert "PyTorch replayed cannot be recorded" in str(report)
        with torch.no_grad():
            torch.testing.assert_close(model(x), want, atol=2e-3, rtol=2e-3)
        assert torch.cuda.current_stream() == theirs


# ---- the three options re-timed side by side (session 16) -------------------------------------
@pytest.mark.parametrize(
    ("before", "side", "want"),
    [
        # the side-by-side times decide where the earlier ones were slower
        (GraphTimes(2.0, 2.0, 0.5, True), (1.0, 1.2, 0.9), GraphTimes(1.0, 1.2, 0.9, True)),
        # an earlier timing that read PyTorch faster wins: doubt goes to PyTorch's forward
        (GraphTimes(1.0, 0.8, 0.5, True), (1.5, 1.2, 0.9), GraphTimes(1.0, 0.8, 0.9, True)),
        # a replay that recorded only once still counts
        (GraphTimes(1.0, None, 0.5, False), (1.1, 0.7, 0.9), GraphTimes(1.0, 0.7, 0.9, False)),
        # one that does not record side by side is no option: auto's replay of it would run
        # uncaptured (audit, session 17)
        (GraphTimes(1.0, 0.7, 0.5, True), (1.1, None, 0.9), GraphTimes(1.0, None, 0.9, True)),
    ],
)
def test_doubt_goes_to_pytorch(
    before: GraphTimes, side: tuple[float, float | None, float], want: GraphTimes
) -> None:
    from dnntune.torch.graph_choice import doubt_to_pytorch

    assert doubt_to_pytorch(before, side) == want


def test_forms_put_back_classes_attributes_and_graphs() -> None:
    from dnntune.torch._forms import Forms
    from dnntune.torch.cuda_graphs import attach, detach

    model = _model()
    conv = model[0]
    forms = Forms(list(model.modules()))
    conv.__dict__["_dnntune_mark"] = "a"
    state = graphs_of(conv)  # a capture state, as a recorded module has
    first = forms.take()
    assert detach(conv) is None and "_dnntune_mark" in conv.__dict__
    conv.__class__ = type("Other", (nn.Conv2d,), {})
    conv.__dict__["_dnntune_mark"] = "b"
    second = forms.take()
    forms.put(first)
    assert type(conv) is nn.Conv2d and conv.__dict__["_dnntune_mark"] == "a"
    assert graphs_of(conv) is state
    forms.put(second)
    assert type(conv).__name__ == "Other" and conv.__dict__["_dnntune_mark"] == "b"
    assert detach(conv) is None  # the second form had no graphs; the first keeps its own
    forms.put(first)
    assert graphs_of(conv) is state
    third = forms.take()  # taken while the first is on: the graphs go with the new form only
    assert first.states == [None] * len(first.states) and state in third.states
    forms.put(first)
    assert detach(conv) is None
    forms.put(third)
    assert graphs_of(conv) is state
    attach(conv, None)


def test_auto_times_its_three_options_side_by_side_and_ends_optimized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each switch puts the whole model on one form (PyTorch's classes, dnntune's); on the CPU
    PyTorch's forward does not record, so two forms are timed and the model ends optimized."""
    from dnntune.torch import graph_choice
    from dnntune.torch._undo import Undo
    from dnntune.torch.modules import SWAPS

    model = _model()
    undo = Undo(model)
    conv = model[0]
    conv.__class__ = SWAPS[nn.Conv2d]
    conv.__dict__["_dnntune_mark"] = True
    seen: list[tuple[str, bool]] = []

    def fake(
        module: nn.Module, inputs: Any, switches: list[Any], end: Any, rounds: int = 5
    ) -> list[float]:
        for switch in switches:
            switch()
            seen.append((type(conv).__name__, "_dnntune_mark" in conv.__dict__))
        end()
        return [1.0 + i for i in range(len(switches))]

    flagged: list[object] = []
    real_install = graph_choice.install

    def install(module: nn.Module) -> None:
        flagged.append(module.__dict__.get("_dnntune_graph_auto"))
        real_install(module)

    monkeypatch.setattr(graph_choice, "install", install)
    monkeypatch.setattr(graph_choice, "side_by_side_ms", fake)
    times = graph_choice.side_by_side_times(model, (torch.randn(2, 4, 6, 6),), undo)
    assert times == (1.0, None, 2.0)
    # PyTorch's forward is recorded as "auto" records it: a failure is logged, not warned
    assert flagged == [True]
    assert seen == [("Conv2d", False), (SWAPS[nn.Conv2d].__name__, True)]
    assert type(conv) is SWAPS[nn.Conv2d] and conv.__dict__["_dnntune_mark"] is True
    assert type(model).__name__ == "Sequential"  # PyTorch's recording attempt left no trace


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("times", "want_choice"),
    [
        ([1.0, 2.0, 3.0], Choice.PYTORCH),
        ([3.0, 1.0, 2.0], Choice.PYTORCH_GRAPH),
        ([3.0, 2.0, 1.0], Choice.DNNTUNE_GRAPH),
    ],
)
def test_auto_decides_on_the_side_by_side_times_and_every_form_is_right(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scripted_clock: list[float],
    times: list[float],
    want_choice: Choice,
) -> None:
    """The decision reads the side-by-side times (the ones taken before say all tie); every
    form the model is switched to computes the eager result, and so does the one kept."""
    from dnntune.torch import graph_choice
    from dnntune.torch._example import as_example

    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "side_by_side_forward_ms", graph_choice.side_by_side_times)
    outputs: list[torch.Tensor] = []

    def fake(
        module: nn.Module, inputs: Any, switches: list[Any], end: Any, rounds: int = 5
    ) -> list[float]:
        for switch in [*switches, *switches]:
            switch()
            with torch.no_grad():
                outputs.append(as_example(inputs)(module).clone())
        end()
        return list(times)

    monkeypatch.setattr(graph_choice, "side_by_side_ms", fake)
    scripted_clock.extend([10.0, 10.0, 10.0])  # before: slower than every side-by-side time
    model, x, want, report = _optimized_on_cuda(tmp_path)
    assert report.side_by_side and report.choice == want_choice
    assert report.eager_graph_ms == times[1]
    assert len(outputs) == 6
    for got in outputs:
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x * 1.0), want, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
def test_auto_times_side_by_side_for_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dnntune.torch import graph_choice

    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "side_by_side_forward_ms", graph_choice.side_by_side_times)
    model, x, want, report = _optimized_on_cuda(tmp_path)
    assert report.side_by_side and report.eager_graph_ms is not None
    with torch.no_grad():
        torch.testing.assert_close(model(x * 1.0), want, atol=2e-3, rtol=2e-3)
