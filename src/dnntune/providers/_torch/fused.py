"""Peephole fusions of the ATen lowering: a node pair that eager code writes as one ATen call.

``matmul`` whose (virtual) result feeds only a bias ``add`` becomes ``torch.addmm`` (2-D) or
``torch.baddbmm`` (3-D), as ``F.linear`` runs it: one GEMM with the bias in its epilogue (a
[1, N] bias is passed as a 1-D view, which is what selects cuBLASLt's bias epilogue), no
intermediate tensor, no second pass over the output. The bias must broadcast along the rows
(dims ``[1, N]``, ``[N]`` or ``[1, 1, N]``). The GEMM accumulates in float32 and rounds once
after the bias add, which is at least as close to the graph's float32 intermediate as the
unfused path.
"""

from __future__ import annotations

import torch

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import PointwiseMode
from dnntune.providers._torch.program import LowerContext, Slots, Step

__all__ = ["consumers", "lower_matmul_bias"]


def consumers(graph: OpGraph) -> dict[int, list[Node]]:
    """Node(s) reading each tensor, by ``id`` of the tensor."""
    out: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for t in node.inputs.values():
            if t is not None:
                out.setdefault(id(t), []).append(node)
    return out


def _row_bias(bias: TensorAttributes, out: TensorAttributes) -> bool:
    """``bias`` broadcasts along every dim of ``out`` but the last, which it matches."""
    if bias.is_scalar or bias.is_virtual or not bias.dims or bias.dims[-1] != out.dims[-1]:
        return False
    return all(d == 1 for d in bias.dims[:-1]) and len(bias.dims) <= len(out.dims)


def lower_matmul_bias(
    ctx: LowerContext, node: Node, users: dict[int, list[Node]]
) -> tuple[Step, Node] | None:
    """The fused step for ``node`` (a matmul) and the add it absorbs, or None."""
    if node.kind is not OpKind.MATMUL:
        return None
    a_t, b_t, c_t = (
        node.inputs["a_tensor_uid"],
        node.inputs["b_tensor_uid"],
        node.outputs["c_tensor_uid"],
    )
    if a_t is None or b_t is None or c_t is None or not c_t.is_virtual:
        return None
    readers = users.get(id(c_t), [])
    if len(readers) != 1 or len(c_t.dims) not in (2, 3):
        return None
    (add,) = readers
    if add.kind is not OpKind.POINTWISE or add.params.get("operation") is not PointwiseMode.ADD:
        return None
    x0, x1 = add.inputs.get("in_0_tensor_uid"), add.inputs.get("in_1_tensor_uid")
    y_t = add.outputs.get("out_0_tensor_uid")
    bias = x1 if x0 is c_t else x0 if x1 is c_t else None
    if bias is None or y_t is None or list(y_t.dims) != list(c_t.dims):
        return None
    if not _row_bias(bias, c_t) or len(a_t.dims) != len(c_t.dims):
        return None
    if len(b_t.dims) != len(c_t.dims) or list(a_t.dims[:-2]) != list(b_t.dims[:-2]):
        return None  # baddbmm does not broadcast batch dims
    dtype = ctx.promote(a_t, b_t)
    read_a, read_b, read_bias = ctx.read(a_t, dtype), ctx.read(b_t, dtype), ctx.read(bias, dtype)
    # the bias broadcasts as it is ([1, N], [N] or [1, 1, N]): addmm/baddbmm take any input
    # that broadcasts to the product's shape
    gemm = torch.addmm if len(c_t.dims) == 2 else torch.baddbmm
    if len(c_t.dims) == 2 and len(bias.dims) == 2:
        # addmm puts a 1-D bias into cuBLASLt's GEMM epilogue (what F.linear gets); a [1, N]
        # one is first copied into the whole output and the GEMM accumulates onto it, one
        # more pass over the output (47 -> 57 us on the H200 for 4096x4096x1024 fp16)
        read_row = read_bias

        def read_bias(slots: Slots) -> torch.Tensor:
            return read_row(slots).reshape(-1)

    out = ctx.out_buffer(y_t, dtype, contiguous=True)
    if out is not None:

        def matmul_bias_out(slots: Slots) -> None:
            gemm(read_bias(slots), read_a(slots), read_b(slots), out=slots[out])

        return matmul_bias_out, add
    write = ctx.write(y_t)

    def matmul_bias(slots: Slots) -> None:
        write(slots, gemm(read_bias(slots), read_a(slots), read_b(slots)))

    return matmul_bias, add
