"""``optimize(..., cuda_graph="auto")``: replay the forward as a CUDA graph where that is faster.

A CUDA-graph replay removes the per-layer host cost of an uncaptured forward, which decides the
speed of most inference forwards on a fast GPU; but not every forward can be recorded (a host
sync, a data-dependent shape), and a replay copies the inputs in and the outputs out. So with
example inputs on CUDA in eval mode, ``optimize`` times what the user could run instead, in the
same way (:func:`dnntune.torch.speed.forward_ms`), and keeps the fastest:

* PyTorch's forward, uncaptured (the check's eager time);
* PyTorch's forward replayed as a CUDA graph (:func:`eager_replay_ms`, timed before anything
  changes: the plain capture a user could do themselves);
* dnntune's forward, replayed when it records, else uncaptured (the check's optimized time).

The three are timed again at the end, side by side (:func:`side_by_side_times`: the model
switched between its three forms, one burst of each per round), and the decision reads
:func:`doubt_to_pytorch` of both timings: timed minutes apart, the eager forward of a BERT-base
read 5.11 ms at the start of ``optimize`` against 4.65 ms in the benchmark's side-by-side
rounds (H200, session 16), and "auto" kept PyTorch's replay (5.01 ms), 7 % slower than the
eager forward it was meant to beat.

dnntune's forward is kept only where it is faster than the best PyTorch option beyond the
check's noise tolerance (:data:`dnntune.torch.speed.TOLERANCE`), as a tuned winner must beat the
default plan: within noise, PyTorch's own forward (replayed when that is its faster option) is
the one kept. On the H200 (session 8) a LLaMA-style decode step replayed on dnntune's plans
measured 1.380 ms against PyTorch's replay at 1.361 ms, inside the band, and the side-by-side
benchmark then read it 3 % slower: a tie must not go to the more complex option. Which was kept,
and each time, are in the report (``OptimizeReport.choice``): a result, not a warning.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dnntune.errors import InvalidValueError
from dnntune.torch._example import Example, as_example
from dnntune.torch._forms import Forms
from dnntune.torch._undo import Undo
from dnntune.torch.cuda_graphs import forget, graphs_of, install
from dnntune.torch.speed import is_slower, side_by_side_ms, warn_if_slower

if TYPE_CHECKING:
    from dnntune.torch.optimize_report import OptimizeReport

__all__ = [
    "AUTO",
    "Choice",
    "GraphTimes",
    "apply_choice",
    "can_choose",
    "choose",
    "eager_replay_ms",
    "graph_setting",
    "doubt_to_pytorch",
    "readings",
    "recorded",
    "side_by_side_times",
]

_log = logging.getLogger(__name__)

#: the ``cuda_graph`` value that lets ``optimize`` decide
AUTO = "auto"


class Choice(StrEnum):
    """What an optimized module runs, as ``OptimizeReport.choice`` names it."""

    DNNTUNE = "dnntune"
    DNNTUNE_GRAPH = "dnntune+cuda_graph"
    PYTORCH = "pytorch"
    PYTORCH_GRAPH = "pytorch+cuda_graph"


def graph_setting(cuda_graph: object) -> bool | str:
    """``cuda_graph`` checked: True, False or "auto" (InvalidValueError with what to pass)."""
    if isinstance(cuda_graph, bool) or cuda_graph == AUTO:
        return cuda_graph
    raise InvalidValueError(
        f"optimize(cuda_graph={cuda_graph!r}): expected True, False or 'auto' (replay the "
        "forward as a CUDA graph when it records and is faster; the default)"
    )


def can_choose(
    module: nn.Module, example_inputs: Example | Sequence[Any] | None, check: bool
) -> bool:
    """Whether "auto" can measure its options: example inputs (positional or keyword) with a
    CUDA tensor, eval mode and the speed check on. Otherwise "auto" runs uncaptured (as
    ``cuda_graph=False``)."""
    if not check or example_inputs is None or module.training:
        return False
    return as_example(example_inputs).is_cuda


def recorded(module: nn.Module) -> bool:
    """The installed module recorded a graph and no signature failed to record."""
    state = graphs_of(module)
    return state.records > 0 and not state.uncapturable


def eager_replay_ms(
    module: nn.Module, example_inputs: Example | Sequence[Any], time_forward: Callable[..., float]
) -> float | None:
    """Per-forward ms of ``module``'s own forward replayed as a CUDA graph (the same replay
    path and timing as an optimized module's), or None when it cannot be recorded. The module
    is left exactly as it was."""
    # every class, not only the module's: a forward that cannot be recorded whole installs
    # its blocks to be recorded on their own (``cuda_graphs``' pieces, forgotten with it)
    classes = [(m, type(m)) for m in module.modules()]
    example = as_example(example_inputs)
    install(module)
    try:
        with torch.no_grad():
            example(module)  # records, or finds that it cannot
        return time_forward(module, example) if recorded(module) else None
    finally:
        forget(module)
        for m, cls in classes:
            m.__class__ = cls


@dataclass(frozen=True)
class GraphTimes:
    """The per-forward times ``choose`` decides on (None: that option cannot run)."""

    pytorch_ms: float
    pytorch_graph_ms: float | None
    dnntune_ms: float
    dnntune_replayed: bool


def choose(times: GraphTimes) -> Choice:
    """dnntune's forward where it beats the best PyTorch option beyond noise, else that one."""
    best_pytorch, choice = times.pytorch_ms, Choice.PYTORCH
    if times.pytorch_graph_ms is not None and times.pytorch_graph_ms < best_pytorch:
        best_pytorch, choice = times.pytorch_graph_ms, Choice.PYTORCH_GRAPH
    if not is_slower(times.dnntune_ms, best_pytorch):  # dnntune not faster beyond noise
        return choice
    return Choice.DNNTUNE_GRAPH if times.dnntune_replayed else Choice.DNNTUNE


def doubt_to_pytorch(
    before: GraphTimes, side_by_side: tuple[float, float | None, float]
) -> GraphTimes:
    """The times "auto" decides on: each PyTorch option at the better of its two timings
    (before ``optimize`` changed anything, and side by side at the end), dnntune's forward at
    its side-by-side time. A timing an artifact slowed (a first call's lazy set-up, a host
    busy elsewhere) then never argues for dnntune's forward: doubt goes to PyTorch's own, as a
    tie does, the direction that keeps a model never slower than eager. PyTorch's forward
    replayed is an option only where the side-by-side recorded it: that recording is the one
    "auto" would keep (a forward it cannot record would run uncaptured under that name)."""
    eager, graph, ours = side_by_side
    graphs = [] if graph is None else [t for t in (before.pytorch_graph_ms, graph) if t is not None]
    return GraphTimes(
        min(before.pytorch_ms, eager),
        min(graphs) if graphs else None,
        ours,
        before.dnntune_replayed,
    )


def readings(
    before: GraphTimes, side_by_side: tuple[float, float | None, float]
) -> dict[str, list[float]]:
    """Each option's two timings, before ``optimize`` changed anything and side by side at the
    end (what :func:`doubt_to_pytorch` decides from), in ms: for the report, so that a host
    whose speed moved between them shows it (BERT-base's eager forward read 4.74 ms inside
    ``optimize`` and 9.13 ms in the benchmark minutes later, H200, session 29)."""
    eager, graph, ours = side_by_side
    pairs = {
        Choice.PYTORCH.value: (before.pytorch_ms, eager),
        Choice.PYTORCH_GRAPH.value: (before.pytorch_graph_ms, graph),
        "dnntune": (before.dnntune_ms, ours),
    }
    return {k: [t for t in pair if t is not None] for k, pair in pairs.items()}


def side_by_side_times(
    module: nn.Module, example_inputs: Example | Sequence[Any], undo: Undo
) -> tuple[float, float | None, float] | None:
    """(PyTorch's forward, PyTorch's forward replayed or None where it does not record,
    dnntune's forward) per-forward ms, timed side by side on the model switched between the
    three (:func:`dnntune.torch.speed.side_by_side_ms`); the model is left optimized. None
    when a form could not be timed (the decision then reads the times taken before)."""
    example = as_example(example_inputs)
    forms = Forms([m for m, _ in undo.classes])
    optimized = forms.take()
    undo.to_pytorch()
    eager = forms.take()
    replayed = None
    try:
        # "auto" chose to time this: a forward that cannot be recorded is a result (logged),
        # not cuda_graph=True's warning (to_pytorch took the flag with the other attributes)
        module.__dict__["_dnntune_graph_auto"] = True
        install(module)
        with torch.no_grad():
            example(module)  # records PyTorch's forward, or finds that it cannot
        if recorded(module):
            replayed = forms.take()
        else:
            forms.take().free()
        order = [eager, optimized] if replayed is None else [eager, replayed, optimized]
        times = side_by_side_ms(
            module,
            example,
            [functools.partial(forms.put, form) for form in order],
            lambda: forms.put(optimized),
        )
    except Exception as exc:  # a form that fails here: decide on the times taken before
        forms.put(optimized)
        _log.info("dnntune.torch.optimize: no side-by-side timing of the three forwards (%s)", exc)
        return None
    finally:
        if replayed is not None:
            replayed.free()
    if replayed is None:
        return times[0], None, times[1]
    return times[0], times[1], times[2]


def apply_choice(
    module: nn.Module,
    example: Example,
    report: OptimizeReport,
    undo: Undo,
    revert_if_slower: bool,
) -> None:
    """``cuda_graph="auto"``'s decision, once the three forwards are timed (``report``'s
    ``eager_forward_ms``, ``eager_graph_ms`` and ``forward_ms``): the choice and its time go into
    ``report``; a PyTorch option reverts the model (``undo``) and, replayed, records PyTorch's
    forward now."""
    assert report.eager_forward_ms is not None and report.forward_ms is not None
    times = GraphTimes(
        report.eager_forward_ms, report.eager_graph_ms, report.forward_ms, report.cuda_graph
    )
    choice = choose(times)
    if choice in (Choice.PYTORCH, Choice.PYTORCH_GRAPH) and not revert_if_slower:
        choice = Choice.DNNTUNE_GRAPH if report.cuda_graph else Choice.DNNTUNE
        warn_if_slower(report.eager_forward_ms, report.forward_ms, report.cuda_graph)
    report.choice = choice.value
    report.chosen_forward_ms = {
        Choice.PYTORCH: report.eager_forward_ms,
        Choice.PYTORCH_GRAPH: report.eager_graph_ms,
    }.get(choice, report.forward_ms)
    if choice in (Choice.PYTORCH, Choice.PYTORCH_GRAPH):
        undo.revert()
        report.reverted, report.pieces, report.fusions = True, [], []  # nothing fused runs
        report.cuda_graph = choice is Choice.PYTORCH_GRAPH
        if report.cuda_graph:
            module.__dict__["_dnntune_graph_auto"] = True
            install(module)
            with torch.no_grad():
                example(module)  # record now, not in the user's first call
            if not recorded(module):  # it runs uncaptured: the report says so
                undo.revert()
                report.cuda_graph = False
                choice = Choice.PYTORCH
                report.choice = choice.value
                report.chosen_forward_ms = report.eager_forward_ms
    _log.info("dnntune.torch.optimize: cuda_graph='auto' kept %s", choice.value)
