"""The one output check: an engine's outputs against the reference, one tolerance policy.

Autotune's verification, ``dnntune run``, ``dnntune bench`` and ``dnntune.testing.check_plan``
all call :func:`check_outputs`, so a plan that passes one passes them all: each output is
compared with :func:`~dnntune.reference.compare` within :func:`tolerance_for` (the loosest
default over the graph's nodes and intermediate types, long reductions included), which a
caller may override with an explicit ``rtol`` / ``atol``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from dnntune._reference_tolerance import Comparison, Tolerance, compare, tolerance_for
from dnntune.graph.ir import OpGraph
from dnntune.graph.tensor import TensorAttributes

__all__ = ["OutputCheck", "OutputsCheck", "check_outputs", "tolerance_within"]


def tolerance_within(
    graph: OpGraph,
    tensor: TensorAttributes,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    tf32: bool = False,
) -> Tolerance:
    """:func:`tolerance_for` ``tensor``, with ``rtol`` / ``atol`` replacing it where given."""
    tol = tolerance_for(graph, tensor, tf32=tf32)
    if rtol is None and atol is None:
        return tol
    new_rtol = tol.rtol if rtol is None else rtol
    return Tolerance(
        rtol=new_rtol,
        atol=tol.atol if atol is None else atol,
        # the whole-output bound stays where the type has one, at the rtol asked for (it is
        # what keeps a long reduction's grown atol from hiding a wrong scale)
        rms_rtol=new_rtol if math.isfinite(tol.rms_rtol) else math.inf,
        rms_atol=tol.rms_atol,
    )


@dataclass(frozen=True)
class OutputCheck:
    """One output's comparison with the reference."""

    tensor: TensorAttributes
    tolerance: Tolerance
    comparison: Comparison

    @property
    def uid(self) -> int:
        assert self.tensor.uid is not None
        return self.tensor.uid


@dataclass(frozen=True)
class OutputsCheck:
    """Every compared output of one run (outputs the reference did not compute are left out)."""

    outputs: tuple[OutputCheck, ...]

    @property
    def ok(self) -> bool:
        return all(o.comparison.ok for o in self.outputs)

    @property
    def max_abs_error(self) -> float:
        return max((float(o.comparison.max_abs_error) for o in self.outputs), default=0.0)

    @property
    def failed(self) -> list[OutputCheck]:
        return [o for o in self.outputs if not o.comparison.ok]


def check_outputs(
    graph: OpGraph,
    actual: Mapping[int, torch.Tensor],
    expected: Mapping[int, torch.Tensor],
    outputs: Iterable[TensorAttributes] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    tf32: bool = False,
) -> OutputsCheck:
    """Compare ``actual`` with ``expected`` (both by uid) for ``outputs`` (default: the
    graph's outputs), each within :func:`tolerance_within` (``tf32``: the plan set a
    ``Knob.tf32`` knob)."""
    checks = []
    for tensor in graph.output_tensors() if outputs is None else outputs:
        uid = tensor.uid
        assert uid is not None, "validate() assigns every uid"
        if uid not in expected:
            continue
        tol = tolerance_within(graph, tensor, rtol, atol, tf32=tf32)
        checks.append(OutputCheck(tensor, tol, compare(actual[uid], expected[uid], tol)))
    return OutputsCheck(tuple(checks))
