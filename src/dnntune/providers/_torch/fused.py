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

Either fused call, when its (virtual) result feeds only an add of a graph input of its shape
and type (a residual), also absorbs that add: ``torch.add`` of the two computes in float32
and rounds once, one pass, where the general lowering would cast the result up to float32,
add, and cast back (an activation after the add is absorbed too, as below).

A ``matmul`` without a bias whose (virtual) result feeds only an add of a graph input of its
shape and type (LLaMA's ``down_proj`` + the MLP's residual) or a multiply by one (a gated MLP's
``up_proj`` times its activated gate) becomes ``torch.matmul`` and that add or multiply, in the
io type, as eager's ``F.linear(x, w) + r`` runs (session 43: it was the general lowering, the
product cast up to float32, combined and cast back down).

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
from dnntune.providers._torch.elementwise import activation_forms, matmul_tensors, result_dtype
from dnntune.providers._torch.program import LowerContext, Slots, Step

__all__ = ["Fused", "consumers", "lower_conv_bias", "lower_matmul_bias"]

Fn = Callable[..., torch.Tensor]
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


def _sole_add(
    out_t: TensorAttributes, users: dict[int, list[Node]], mode: PointwiseMode = PointwiseMode.ADD
) -> tuple[Node, TensorAttributes, TensorAttributes] | None:
    """(the add, its other operand, its output) when ``out_t`` (virtual) feeds only one
    pointwise ADD (or ``mode``: MUL) whose result has ``out_t``'s dims; else None. The callers
    check that operand: a row or per-channel bias, or a residual of the result's shape."""
    if not out_t.is_virtual:
        return None
    readers = users.get(id(out_t), [])
    if len(readers) != 1:
        return None
    (add,) = readers
    if add.kind is not OpKind.POINTWISE or add.params.get("operation") is not mode:
        return None
    x0, x1 = add.inputs.get("in_0_tensor_uid"), add.inputs.get("in_1_tensor_uid")
    y_t = add.outputs.get("out_0_tensor_uid")
    other = x1 if x0 is out_t else x0 if x1 is out_t else None
    if other is None or y_t is None or list(y_t.dims) != list(out_t.dims):
        return None
    return add, other, y_t


def _activation_after(
    y_t: TensorAttributes, users: dict[int, list[Node]]
) -> tuple[Node, Fn, Fn | None, TensorAttributes] | None:
    """(the activation, its functional and ``out=`` forms, its output) when ``y_t`` (virtual)
    feeds only a unary activation of its shape; else None."""
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
    return act, fn, fn_out, out_t


def _activation_tail(
    ctx: LowerContext, y_t: TensorAttributes, dtype: torch.dtype, users: dict[int, list[Node]]
) -> tuple[Node, Fn, int] | None:
    """(the activation, its ``out=`` form, the caller's buffer slot) when ``y_t`` (virtual, of
    a result computed in ``dtype``) feeds only a unary activation with an ``out=`` form that
    writes a graph output of that type; else None."""
    found = _activation_after(y_t, users)
    if found is None:
        return None
    act, fn, fn_out, out_t = found
    if fn_out is None:
        return None
    out = ctx.out_buffer(out_t, result_dtype(fn, [dtype]))
    return None if out is None else (act, fn_out, out)


def _residual_add(
    ctx: LowerContext,
    y_t: TensorAttributes,
    dtype: torch.dtype,
    users: dict[int, list[Node]],
    mode: PointwiseMode = PointwiseMode.ADD,
) -> tuple[Node, TensorAttributes, TensorAttributes] | None:
    """(the add, its other operand, its output) when ``y_t`` (virtual, the fused call's result
    in ``dtype``) feeds only one ADD of a graph input of its shape and slot type (a residual):
    ``torch.add`` of the two computes in float32 and rounds once, as the graph's float32
    intermediate does, in one pass, where the general lowering casts ``y`` up to float32, adds
    and casts the sum back down (three passes; on the H100 the ViT-B/16 fc2 + residual lost to
    cuDNN's plan that way, 47.5 us for eager's linear and add). With ``mode`` MUL: a multiply
    by such an input (a gated MLP's up projection times its activated gate)."""
    found = _sole_add(y_t, users, mode)
    if found is None:
        return None
    add, other, out_t = found
    if other.is_virtual or other.is_scalar or list(other.dims) != list(y_t.dims):
        return None
    if ctx.slot_dtype(other) != dtype or ctx.dtype(other) != dtype:
        return None
    return add, other, out_t


def _with_residual(
    ctx: LowerContext,
    residual: tuple[Node, TensorAttributes, TensorAttributes],
    dtype: torch.dtype,
    users: dict[int, list[Node]],
    call: Fn,
    taken: list[Node],
    kind: OpKind,
) -> Fused:
    """The fused ``call`` (a GEMM or convolution with its bias) then the residual add (or the
    multiply, by the add node's mode), and the activation after it where one follows
    (:func:`_activation_tail`)."""
    add, other, out_t = residual
    read_r = ctx.read(other, dtype)
    multiply = add.params.get("operation") is PointwiseMode.MUL
    combine = torch.mul if multiply else torch.add
    # into the fused call's own result, in place: ``combine(y, r, out=y)`` is the same ATen
    # call, but Dynamo refuses an ``out=`` tensor that is not contiguous (a channels-last
    # convolution's result), and TORCH_COMPILE_ENGINE lost every NHWC conv + shortcut graph
    combine_into = torch.Tensor.mul_ if multiply else torch.Tensor.add_
    kinds = [kind, OpKind.POINTWISE]
    tail = _activation_tail(ctx, out_t, dtype, users)
    if tail is not None:
        act, act_out, act_slot = tail

        def call_residual_act_out(slots: Slots) -> None:
            y = call(slots)
            act_out(combine_into(y, read_r(slots)), out=slots[act_slot])

        return call_residual_act_out, [*taken, add, act], [*kinds, OpKind.POINTWISE]
    after = _activation_after(out_t, users)
    if after is not None and result_dtype(after[1], [dtype]) == dtype:
        act, act_fn, _, act_t = after
        write_act = ctx.write(act_t)

        def call_residual_act(slots: Slots) -> None:
            y = call(slots)
            write_act(slots, act_fn(combine_into(y, read_r(slots))))

        return call_residual_act, [*taken, add, act], [*kinds, OpKind.POINTWISE]
    slot = ctx.out_buffer(out_t, dtype)
    if slot is not None:

        def call_residual_out(slots: Slots) -> None:
            combine(call(slots), read_r(slots), out=slots[slot])

        return call_residual_out, [*taken, add], kinds
    write = ctx.write(out_t)

    def call_residual(slots: Slots) -> None:
        y = call(slots)
        write(slots, combine_into(y, read_r(slots)))

    return call_residual, [*taken, add], kinds


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
    found = _sole_add(y_t, users)
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

    residual = _residual_add(ctx, out_t, dtype, users)
    if residual is not None:
        return _with_residual(ctx, residual, dtype, users, conv_bias_call, [add], OpKind.CONV_FPROP)
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
    found = _sole_add(c_t, users)
    if found is None or not _row_bias(found[1], c_t):
        return _matmul_operand(ctx, node, users)
    add, bias, y_t = found
    if len(a_t.dims) != len(c_t.dims):
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

    residual = _residual_add(ctx, y_t, dtype, users)
    if residual is not None:
        return _with_residual(
            ctx,
            residual,
            dtype,
            users,
            lambda slots: gemm(read_bias(slots), read_a(slots), read_b(slots)),
            [add],
            OpKind.MATMUL,
        )
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


def _matmul_operand(ctx: LowerContext, node: Node, users: dict[int, list[Node]]) -> Fused | None:
    """A matmul without a bias whose (virtual) result feeds only an add of a residual or a
    multiply by a graph input of its shape and type (LLaMA's ``down_proj`` + the MLP's
    residual, a gated MLP's ``up_proj`` times its activated gate): ``torch.matmul`` then the add
    or multiply in one pass, as eager's ``F.linear(x, w) + r`` runs, where the general lowering
    casts the product up to float32, combines and casts back."""
    a_t, b_t, c_t = matmul_tensors(node)
    dtype = ctx.promote(a_t, b_t)
    found = (
        _residual_add(ctx, c_t, dtype, users, m) for m in (PointwiseMode.ADD, PointwiseMode.MUL)
    )
    operand = next((f for f in found if f is not None), None)
    if operand is None:
        return None
    read_a, read_b = ctx.read(a_t, dtype), ctx.read(b_t, dtype)
    return _with_residual(
        ctx,
        operand,
        dtype,
        users,
        lambda slots: torch.matmul(read_a(slots), read_b(slots)),
        [],
        OpKind.MATMUL,
    )
