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

dnntune's forward is kept only where it is faster than the best PyTorch option beyond the
check's noise tolerance (:data:`dnntune.torch.speed.TOLERANCE`), as a tuned winner must beat the
default plan: within noise, PyTorch's own forward (replayed when that is its faster option) is
the one kept. On the H200 (session 8) a LLaMA-style decode step replayed on dnntune's plans
measured 1.380 ms against PyTorch's replay at 1.361 ms, inside the band, and the side-by-side
benchmark then read it 3 % slower: a tie must not go to the more complex option. Which was kept,
and each time, are in the report (``OptimizeReport.choice``): a result, not a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from dnntune.errors import InvalidValueError
from dnntune.torch.cuda_graphs import forget, graphs_of, install
from dnntune.torch.speed import is_slower

__all__ = [
    "AUTO",
    "Choice",
    "GraphTimes",
    "can_choose",
    "choose",
    "eager_replay_ms",
    "graph_setting",
    "recorded",
]

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


def can_choose(module: nn.Module, example_inputs: Sequence[Any] | None, check: bool) -> bool:
    """Whether "auto" can measure its options: example inputs with a CUDA tensor, eval mode and
    the speed check on. Otherwise "auto" runs uncaptured (as ``cuda_graph=False``)."""
    if not check or example_inputs is None or module.training:
        return False
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)


def recorded(module: nn.Module) -> bool:
    """The installed module recorded a graph and no signature failed to record."""
    state = graphs_of(module)
    return state.records > 0 and not state.uncapturable


def eager_replay_ms(
    module: nn.Module, example_inputs: Sequence[Any], time_forward: Callable[..., float]
) -> float | None:
    """Per-forward ms of ``module``'s own forward replayed as a CUDA graph (the same replay
    path and timing as an optimized module's), or None when it cannot be recorded. The module
    is left exactly as it was."""
    # every class, not only the module's: a forward that cannot be recorded whole installs
    # its blocks to be recorded on their own (``cuda_graphs``' pieces, forgotten with it)
    classes = [(m, type(m)) for m in module.modules()]
    install(module)
    try:
        with torch.no_grad():
            module(*example_inputs)  # records, or finds that it cannot
        return time_forward(module, example_inputs) if recorded(module) else None
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
