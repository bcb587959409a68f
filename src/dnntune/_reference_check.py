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
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes

__all__ = ["OutputCheck", "OutputsCheck", "check_outputs", "data_scale", "tolerance_within"]


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
    scale: float = 1.0,
) -> OutputsCheck:
    """Compare ``actual`` with ``expected`` (both by uid) for ``outputs`` (default: the
    graph's outputs), each within :func:`tolerance_within` (``tf32``: the plan set a
    ``Knob.tf32`` knob), its absolute parts times ``scale`` (:func:`data_scale`: inputs
    larger than the well-scaled ones the defaults are set for)."""
    checks = []
    for tensor in graph.output_tensors() if outputs is None else outputs:
        uid = tensor.uid
        assert uid is not None, "validate() assigns every uid"
        if uid not in expected:
            continue
        tol = tolerance_within(graph, tensor, rtol, atol, tf32=tf32)
        if scale != 1.0:
            tol = Tolerance(tol.rtol, tol.atol * scale, tol.rms_rtol, tol.rms_atol * scale)
        checks.append(OutputCheck(tensor, tol, compare(actual[uid], expected[uid], tol)))
    return OutputsCheck(tuple(checks))


#: the operands whose products a dot-product node sums: its rounding error grows with the
#: scale of each (a sum of K products of size |a| |b| is off by about sqrt(K) units of that;
#: an attention's output carries its logits' error times its values')
_OPERANDS: dict[OpKind, tuple[str, ...]] = {
    OpKind.CONV_FPROP: ("x_tensor_uid", "w_tensor_uid"),
    OpKind.CONV_DGRAD: ("dy_tensor_uid", "w_tensor_uid"),
    OpKind.CONV_WGRAD: ("x_tensor_uid", "dy_tensor_uid"),
    OpKind.MATMUL: ("a_tensor_uid", "b_tensor_uid"),
    OpKind.SDPA: ("q_tensor_uid", "k_tensor_uid", "v_tensor_uid"),
}
#: nodes that normalize their input: their output's scale is their scale and bias's
_NORMALIZING = frozenset({OpKind.LAYERNORM, OpKind.RMSNORM, OpKind.BATCHNORM})
_AFFINE = ("scale_tensor_uid", "bias_tensor_uid")


def data_scale(graph: OpGraph, pack: Mapping[int, torch.Tensor]) -> float:
    """How much larger than well-scaled inputs (:func:`dnntune.reference.make_inputs`, RMS
    about 1) a call's inputs are, for the absolute part of the tolerance (at least 1).

    The defaults bound the rounding of order-one data. A model's own activations and
    gradients can be hundreds: a convolution of such inputs whose terms cancel to 0.04 is off
    by 5e-4 in honest float32 rounding, which an atol of 1e-4 read as a wrong plan (the first
    real-model conformance sweep, ResNet-50 on the CPU, session 37). Per node: the product of
    its operands' RMS for a convolution, matmul or attention (query, key and value); its
    scale's and bias's for a norm; else its largest input's. Each RMS counts from 1 (smaller
    data keeps the defaults), and an intermediate the pack does not hold counts 1. The
    graph's scale is its largest node's."""
    scale = 1.0
    for node in graph.nodes:
        operands = _OPERANDS.get(node.kind)
        if operands is not None:
            factor = math.prod(_rms(node, name, pack) for name in operands)
        elif node.kind in _NORMALIZING:
            factor = max(_rms(node, name, pack) for name in _AFFINE)
        else:
            factor = max((_rms(node, name, pack) for name in node.inputs), default=1.0)
        scale = max(scale, factor)
    return scale


def _rms(node: Node, name: str, pack: Mapping[int, torch.Tensor]) -> float:
    """The RMS of one input of ``node`` in ``pack``, at least 1 (1 where it is not there)."""
    tensor = node.inputs.get(name)
    value = pack.get(tensor.uid) if tensor is not None and tensor.uid is not None else None
    if value is None or not value.is_floating_point() or value.numel() == 0:
        return 1.0
    norm = float(torch.linalg.vector_norm(value, dtype=torch.float32))
    rms = norm / math.sqrt(value.numel())
    return max(1.0, rms) if math.isfinite(rms) else 1.0
