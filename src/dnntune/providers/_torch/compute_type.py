"""Which nodes compute wider than their operands: cuDNN's compute type, where ATen would round.

cuDNN runs every operation in its compute type (the node's ``compute_data_type``, else the
graph's; dnntune lowers an unset one as float, as CUDNN_ENGINE does): the operands are
converted to it and the result is converted once, to the output's type. ATen runs an op in the
promoted type of its operands: fp16/bf16 operands are computed in float32 inside the kernel
(opmath) and the result is rounded to 16 bits. Where the result is kept in that 16-bit type the
two agree; where it is kept wider (fp16 data into a float32 output), ATen's answer carries a
16-bit rounding that cuDNN's does not (2e-4 to 4e-3 relative: outside float32's tolerance, so
TORCH_ENGINE failed verification on fp16-in / float-out pointwise ops, pools and norms). Such a
node reads its floating operands in the wider type instead, and the ATen kernel computes there.

"Kept" looks through intermediates: a virtual tensor holds no more precision than the outputs
it flows into need, so a float32 intermediate between fp16 inputs and fp16 outputs (the usual
io half / intermediate float graph) widens nothing: rounding it to 16 bits early is within the
output's tolerance, and its nodes keep their 16-bit kernels (no cast, no cost). A node with
several floating results (a norm's y and its float32 statistics) is widened only for the
narrowest of them: ATen's norm kernels already give their statistics in float32.

A result of an integer or boolean type is kept at the compute type too, unless the op is exact
in its operands' type (a comparison, a select, max, floor...): converting to an integer
truncates, so a sum or a cosine rounded to 16 bits first (2.996 to 3.0 in bfloat16) lands on the
next integer, where cuDNN's float32 value and the reference's do not.

All of this is decided once, while lowering; a step pays only the casts of a widened node.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, PointwiseMode, ReductionMode

__all__ = ["EXACT_POINTWISE", "widened_operands"]

SlotDtype = Callable[[TensorAttributes], torch.dtype]


def _narrower(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None or b is None:
        return a if b is None else b
    return b if b.itemsize < a.itemsize else a


def _wider(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None or b is None:
        return a if b is None else b
    return b if b.itemsize > a.itemsize else a


def _compute_type(graph: OpGraph, node: Node) -> torch.dtype | None:
    """The node's floating compute type (unset: float, as CUDNN_ENGINE lowers it); None for an
    integer one, which widens nothing."""
    compute = node.compute_data_type or graph.compute_data_type or DataType.FLOAT
    return compute.to_torch() if compute.is_floating else None


#: pointwise modes whose result is exact in the type of their operands
EXACT_POINTWISE = frozenset(
    {
        PointwiseMode.MAX,
        PointwiseMode.MIN,
        PointwiseMode.NEG,
        PointwiseMode.ABS,
        PointwiseMode.IDENTITY,
        PointwiseMode.CEIL,
        PointwiseMode.FLOOR,
        PointwiseMode.CMP_EQ,
        PointwiseMode.CMP_NEQ,
        PointwiseMode.CMP_GT,
        PointwiseMode.CMP_GE,
        PointwiseMode.CMP_LT,
        PointwiseMode.CMP_LE,
        PointwiseMode.BINARY_SELECT,
    }
)
_EXACT_REDUCTION = frozenset({ReductionMode.MAX, ReductionMode.MIN, ReductionMode.AMAX})


def _exact(node: Node) -> bool:
    """Whether ``node``'s result is exact in its operands' type (no rounding to widen away)."""
    if node.kind is OpKind.POINTWISE:
        return node.params.get("operation") in EXACT_POINTWISE
    if node.kind is OpKind.REDUCTION:
        return node.params.get("mode") in _EXACT_REDUCTION
    return False


def widened_operands(graph: OpGraph, slot_dtype: SlotDtype) -> dict[int, dict[int, torch.dtype]]:
    """``{id(node): {id(operand): dtype to read it in}}`` for the nodes whose results are kept
    wider than their floating operands (see the module docstring); other nodes are absent.

    Args:
        graph: a validated graph.
        slot_dtype: the torch dtype the lowering holds each tensor in.
    """
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for t in node.inputs.values():
            if t is not None:
                readers.setdefault(id(t), []).append(node)
    #: per node, the width its narrowest floating result is kept in (None: no floating result)
    kept_width: dict[int, torch.dtype | None] = {}
    widened: dict[int, dict[int, torch.dtype]] = {}
    for node in reversed(graph.topological_nodes()):
        width: torch.dtype | None = None
        for t in node.outputs.values():
            if t is None:
                continue
            if not slot_dtype(t).is_floating_point:
                # truncated to an integer: computed at the compute type (module docstring)
                if not _exact(node):
                    width = _narrower(width, _compute_type(graph, node))
                continue
            kept: torch.dtype | None = slot_dtype(t)
            if t.is_virtual:
                # no wider than the widest need of the nodes reading it (if any of them has a
                # floating result; a comparison's boolean keeps the declared type)
                need: torch.dtype | None = None
                for reader in readers.get(id(t), []):
                    need = _wider(need, kept_width.get(id(reader)))
                kept = _narrower(kept, need)
            width = _narrower(width, kept)
        width = _narrower(width, _compute_type(graph, node)) if width is not None else None
        kept_width[id(node)] = width
        operands = [
            t
            for t in node.inputs.values()
            if t is not None and not t.is_scalar and slot_dtype(t).is_floating_point
        ]
        if width is None or not operands:
            continue
        promoted = slot_dtype(operands[0])
        for t in operands[1:]:
            promoted = torch.promote_types(promoted, slot_dtype(t))
        # the type that holds both: float32 for half data kept in bfloat16 or the other way
        # round (same size, neither holds the other: a width test read them as equal, so ATen
        # computed half data for a bfloat16 output in half, 300 * 400 = inf, and bfloat16 data
        # for a half output carried bfloat16's rounding)
        target = torch.promote_types(promoted, width)
        if target != promoted:
            widened[id(node)] = {id(t): target for t in operands if slot_dtype(t) != target}
    return widened
