"""Peephole fusions of the ATen lowering: a node chain that eager code writes as one ATen call.

``matmul`` whose (virtual) result feeds only a bias ``add`` becomes ``torch.addmm`` (2-D) or
``torch.baddbmm`` (3-D), as ``F.linear`` runs it: one GEMM with the bias in its epilogue (a
[1, N] bias is passed as a 1-D view, which is what selects cuBLASLt's bias epilogue), no
intermediate tensor, no second pass over the output. The bias must broadcast along the rows
(dims ``[1, N]``, ``[N]`` or ``[1, 1, N]``). The GEMM accumulates in float32 and rounds once
after the bias add, which is at least as close to the graph's float32 intermediate as the
unfused path.

A convolution whose (virtual) result feeds only a per-channel bias ``add`` (a ``[1, C, 1, 1]``
bias of the convolution's type) becomes one ``conv2d(x, w, bias)``, as ``F.conv2d`` with a bias
runs it.

Either fused call, when its (virtual) result feeds only a unary activation with an ``out=``
form that writes a graph output of the call's type, also absorbs the activation:
``relu(conv2d(x, w, b), out=y)`` as ``F.relu(F.conv2d(x, w, b))`` runs, with no cast of the
result to the graph's intermediate type in between (an activation reads fp16/bf16 in float32
and rounds once, so that cast buys no precision) and no copy into the caller's buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import PointwiseMode
from dnntune.providers._torch.conv import conv_parts
from dnntune.providers._torch.elementwise import activation_forms, result_dtype
from dnntune.providers._torch.program import LowerContext, Slots, Step

__all__ = ["Fused", "consumers", "lower_conv_bias", "lower_matmul_bias"]

Fn = Callable[..., torch.Tensor]
#: ``addmm`` with a ReLU or (tanh) GELU in cuBLASLt's epilogue: PyTorch's own op, private by name
_ADDMM_ACTIVATION: Fn = torch._addmm_activation  # noqa: SLF001
#: a fused step, the nodes it absorbs besides its own, and the kinds of the ATen calls it makes
Fused = tuple[Step, list[Node], list[OpKind]]


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


def _bias_add(
    node: Node, out_t: TensorAttributes, users: dict[int, list[Node]]
) -> tuple[Node, TensorAttributes, TensorAttributes] | None:
    """(the add, its bias operand, its output) when ``out_t`` (virtual) feeds only one
    pointwise ADD whose result has ``out_t``'s dims; else None."""
    if not out_t.is_virtual:
        return None
    readers = users.get(id(out_t), [])
    if len(readers) != 1:
        return None
    (add,) = readers
    if add.kind is not OpKind.POINTWISE or add.params.get("operation") is not PointwiseMode.ADD:
        return None
    x0, x1 = add.inputs.get("in_0_tensor_uid"), add.inputs.get("in_1_tensor_uid")
    y_t = add.outputs.get("out_0_tensor_uid")
    bias = x1 if x0 is out_t else x0 if x1 is out_t else None
    if bias is None or y_t is None or list(y_t.dims) != list(out_t.dims):
        return None
    return add, bias, y_t


def _activation_tail(
    ctx: LowerContext, y_t: TensorAttributes, dtype: torch.dtype, users: dict[int, list[Node]]
) -> tuple[Node, Fn, int] | None:
    """(the activation, its ``out=`` form, the caller's buffer slot) when ``y_t`` (virtual, of
    a result computed in ``dtype``) feeds only a unary activation with an ``out=`` form that
    writes a graph output of that type; else None."""
    if not y_t.is_virtual:
        return None
    readers = users.get(id(y_t), [])
    if len(readers) != 1:
        return None
    (act,) = readers
    if act.kind is not OpKind.POINTWISE or act.inputs.get("in_0_tensor_uid") is not y_t:
        return None
    mode: PointwiseMode = act.params["operation"]
    out_t = act.outputs.get("out_0_tensor_uid")
    if mode.arity != 1 or out_t is None or list(out_t.dims) != list(y_t.dims):
        return None
    fn, fn_out = activation_forms(act, mode)
    if fn_out is None:
        return None
    out = ctx.out_buffer(out_t, result_dtype(fn, [dtype]))
    return None if out is None else (act, fn_out, out)


def _blas_activation(
    ctx: LowerContext, y_t: TensorAttributes, users: dict[int, list[Node]]
) -> tuple[Node, bool, TensorAttributes] | None:
    """(the activation, whether it is the GELU, its output) when ``y_t`` (virtual) feeds only a
    plain ReLU or a tanh-approximated GELU on CUDA: ``torch._addmm_activation`` runs either in
    cuBLASLt's GEMM epilogue (on CUDA its GELU is the tanh form, in the epilogue and in its
    fallback alike; on the CPU it is the erf form, so the CPU keeps the two calls). On the H100,
    bf16 6304x768x3072: 57.0 us against 80.0 us for ``addmm`` then ``gelu`` (session 40)."""
    if ctx.device.type != "cuda" or not y_t.is_virtual:
        return None
    readers = users.get(id(y_t), [])
    if len(readers) != 1:
        return None
    (act,) = readers
    if act.kind is not OpKind.POINTWISE or act.inputs.get("in_0_tensor_uid") is not y_t:
        return None
    mode: PointwiseMode = act.params["operation"]
    if mode is PointwiseMode.RELU_FWD:
        fn, _ = activation_forms(act, mode)
        if fn is not torch.relu:  # clipped or leaky
            return None
    elif mode is not PointwiseMode.GELU_APPROX_TANH_FWD:
        return None
    out_t = act.outputs.get("out_0_tensor_uid")
    if out_t is None or list(out_t.dims) != list(y_t.dims):
        return None
    return act, mode is PointwiseMode.GELU_APPROX_TANH_FWD, out_t


def lower_conv_bias(ctx: LowerContext, node: Node, users: dict[int, list[Node]]) -> Fused | None:
    """The fused step for ``node`` (a convolution), the nodes it absorbs and the kinds of the
    ATen calls it makes, or None."""
    if node.kind is not OpKind.CONV_FPROP:
        return None
    parts = conv_parts(ctx, node)
    if parts is None:  # asymmetric padding or a flipped filter: the general lowering
        return None
    conv, read_x, read_w, stride, padding, dilation, groups, dtype = parts
    y_t = node.outputs["y_tensor_uid"]
    assert y_t is not None
    found = _bias_add(node, y_t, users)
    if found is None:
        return None
    add, bias, out_t = found
    channels = y_t.dims[1]
    if bias.is_scalar or bias.is_virtual or len(bias.dims) != len(y_t.dims):
        return None
    if bias.dims[1] != channels or any(d != 1 for i, d in enumerate(bias.dims) if i != 1):
        return None
    if ctx.dtype(bias) != dtype:  # conv2d takes a bias of its own type: no rounding of another
        return None
    read_b = ctx.read(bias)

    def conv_bias_call(slots: Slots) -> torch.Tensor:
        # a [1, C, 1, 1] tensor views as [C] whatever its strides
        b = read_b(slots).view(-1)
        return conv(read_x(slots), read_w(slots), b, stride, padding, dilation, groups)

    tail = _activation_tail(ctx, out_t, dtype, users)
    if tail is not None:
        act, act_out, out = tail

        def conv_bias_act_out(slots: Slots) -> None:
            act_out(conv_bias_call(slots), out=slots[out])

        return conv_bias_act_out, [add, act], [OpKind.CONV_FPROP, OpKind.POINTWISE]
    write = ctx.write(out_t)

    def conv_bias(slots: Slots) -> None:
        write(slots, conv_bias_call(slots))

    return conv_bias, [add], [OpKind.CONV_FPROP]


def lower_matmul_bias(ctx: LowerContext, node: Node, users: dict[int, list[Node]]) -> Fused | None:
    """The fused step for ``node`` (a matmul), the nodes it absorbs and the kinds of the ATen
    calls it makes, or None."""
    if node.kind is not OpKind.MATMUL:
        return None
    a_t, b_t, c_t = (
        node.inputs["a_tensor_uid"],
        node.inputs["b_tensor_uid"],
        node.outputs["c_tensor_uid"],
    )
    if a_t is None or b_t is None or c_t is None or len(c_t.dims) not in (2, 3):
        return None
    found = _bias_add(node, c_t, users)
    if found is None:
        return None
    add, bias, y_t = found
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

    blas = _blas_activation(ctx, y_t, users) if gemm is torch.addmm else None
    if blas is not None:
        act, use_gelu, act_t = blas
        kinds = [OpKind.MATMUL, OpKind.POINTWISE]
        slot = ctx.out_buffer(act_t, dtype, contiguous=True)
        if slot is not None:

            def matmul_bias_epilogue_out(slots: Slots) -> None:
                a, b, bias_ = read_a(slots), read_b(slots), read_bias(slots)
                _ADDMM_ACTIVATION(bias_, a, b, use_gelu=use_gelu, out=slots[slot])

            return matmul_bias_epilogue_out, [add, act], kinds
        write_act = ctx.write(act_t)

        def matmul_bias_epilogue(slots: Slots) -> None:
            a, b, bias_ = read_a(slots), read_b(slots), read_bias(slots)
            write_act(slots, _ADDMM_ACTIVATION(bias_, a, b, use_gelu=use_gelu))

        return matmul_bias_epilogue, [add, act], kinds
    tail = _activation_tail(ctx, y_t, dtype, users)
    if tail is not None:
        act, act_out, act_slot = tail

        def matmul_bias_act_out(slots: Slots) -> None:
            y = gemm(read_bias(slots), read_a(slots), read_b(slots))
            act_out(y, out=slots[act_slot])

        return matmul_bias_act_out, [add, act], [OpKind.MATMUL, OpKind.POINTWISE]
    out = ctx.out_buffer(y_t, dtype, contiguous=True)
    if out is not None:

        def matmul_bias_out(slots: Slots) -> None:
            gemm(read_bias(slots), read_a(slots), read_b(slots), out=slots[out])

        return matmul_bias_out, [add], [OpKind.MATMUL]
    write = ctx.write(y_t)

    def matmul_bias(slots: Slots) -> None:
        write(slots, gemm(read_bias(slots), read_a(slots), read_b(slots)))

    return matmul_bias, [add], [OpKind.MATMUL]
