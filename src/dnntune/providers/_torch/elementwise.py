"""Matmul, pointwise and reduction as ATen calls (pooling: :mod:`.pooling`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.graph.node import Node
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import PointwiseMode, ReductionMode
from dnntune.providers._torch.compute_type import EXACT_POINTWISE
from dnntune.providers._torch.program import (
    LowerContext,
    Reader,
    Slots,
    Step,
)

__all__ = [
    "activation_forms",
    "lower_matmul",
    "lower_pointwise",
    "lower_reduction",
    "matmul_tensors",
    "result_dtype",
]

Fn = Callable[..., torch.Tensor]


# ---- matmul ---------------------------------------------------------------------------------
def matmul_tensors(node: Node) -> tuple[TensorAttributes, TensorAttributes, TensorAttributes]:
    """A matmul node's A, B and C."""
    a_t, b_t = node.inputs["a_tensor_uid"], node.inputs["b_tensor_uid"]
    c_t = node.outputs["c_tensor_uid"]
    assert a_t is not None and b_t is not None and c_t is not None
    return a_t, b_t, c_t


def lower_matmul(ctx: LowerContext, node: Node) -> Step:
    a_t, b_t, c_t = matmul_tensors(node)
    dtype = ctx.promote(a_t, b_t)
    read_a, read_b = ctx.read(a_t, dtype), ctx.read(b_t, dtype)
    out = ctx.out_buffer(c_t, dtype, contiguous=True)
    if out is not None:

        def matmul_out(slots: Slots) -> None:
            torch.matmul(read_a(slots), read_b(slots), out=slots[out])

        return matmul_out
    write = ctx.write(c_t)

    def matmul(slots: Slots) -> None:
        write(slots, torch.matmul(read_a(slots), read_b(slots)))

    return matmul


# ---- pointwise ------------------------------------------------------------------------------
def _param(node: Node, name: str, default: float) -> float:
    value = node.params.get(name)
    return default if value is None else float(value)


def _relu(node: Node) -> tuple[Fn, Fn | None]:
    lower = _param(node, "relu_lower_clip", 0.0)
    upper = _param(node, "relu_upper_clip", math.inf)
    slope = _param(node, "relu_lower_clip_slope", 0.0)
    if slope == 0.0:
        # max(x, lower) clamped above at upper
        hi = None if upper == math.inf else upper
        if lower == 0.0 and hi is None:
            return torch.relu, functools.partial(torch.clamp_min, min=0.0)
        clamp = functools.partial(torch.clamp, min=lower, max=hi)
        return clamp, clamp
    if lower == 0.0 and upper == math.inf:
        return (lambda x: F.leaky_relu(x, slope)), None

    def clipped_leaky(x: torch.Tensor) -> torch.Tensor:
        y = torch.where(x > lower, x, (x - lower) * slope + lower)
        return y if upper == math.inf else torch.clamp_max(y, upper)

    return clipped_leaky, None


def activation_forms(node: Node, mode: PointwiseMode) -> tuple[Fn, Fn | None]:
    """(functional form, ``out=`` form or None) of a unary op with node parameters."""
    if mode is PointwiseMode.RELU_FWD:
        return _relu(node)
    if mode is PointwiseMode.SWISH_FWD:
        beta = _param(node, "swish_beta", 1.0)
        if beta == 1.0:
            return F.silu, _silu_out
        return (lambda x: x * torch.sigmoid(x * beta)), None
    if mode is PointwiseMode.ELU_FWD:
        alpha = _param(node, "elu_alpha", 1.0)
        return (lambda x: F.elu(x, alpha)), None
    if mode is PointwiseMode.SOFTPLUS_FWD:
        beta = _param(node, "softplus_beta", 1.0)
        return (lambda x: F.softplus(x, beta)), None
    return _PLAIN[mode]


# ``F.gelu`` and ``F.silu`` take no ``out=``, but the ATen ops under them do: writing a graph
# output in place saves a copy of the whole tensor (on the H200, 18 us of a 98 us fp16
# 4096x1024x4096 linear+gelu)
_NN: Any = torch._C._nn


def _gelu_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    # PyTorch's CPU erf-GELU (float32 and bfloat16, torch 2.13) writes nothing into an ``out=``
    # buffer laid out unlike a contiguous ``x`` (NCHW data into a channels-last output, a
    # transposed or padded one): the buffer kept its old values. Such a buffer gets a copy.
    if out.is_contiguous() or out.stride() == x.stride():
        return _NN.gelu(x, out=out)
    return out.copy_(F.gelu(x))


def _gelu_tanh_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _NN.gelu(x, approximate="tanh", out=out)


def _silu_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _NN.silu(x, out=out)


def _with_out(fn: Fn) -> tuple[Fn, Fn]:
    """An ATen function that takes ``out=`` serves as both forms."""
    return fn, fn


def _select(a: torch.Tensor, b: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    # cuDNN's BINARY_SELECT: in_2 is the predicate (non-zero = true) choosing in_0 over in_1
    return torch.where(cond if cond.dtype == torch.bool else cond != 0, a, b)


_PLAIN: dict[PointwiseMode, tuple[Fn, Fn | None]] = {
    PointwiseMode.ADD: _with_out(torch.add),
    PointwiseMode.SUB: _with_out(torch.sub),
    PointwiseMode.MUL: _with_out(torch.mul),
    PointwiseMode.DIV: _with_out(torch.div),
    PointwiseMode.MAX: _with_out(torch.maximum),
    PointwiseMode.MIN: _with_out(torch.minimum),
    PointwiseMode.POW: _with_out(torch.pow),
    PointwiseMode.GELU_FWD: (F.gelu, _gelu_out),
    PointwiseMode.GELU_APPROX_TANH_FWD: ((lambda x: F.gelu(x, approximate="tanh")), _gelu_tanh_out),
    PointwiseMode.TANH_FWD: _with_out(torch.tanh),
    PointwiseMode.SIGMOID_FWD: _with_out(torch.sigmoid),
    PointwiseMode.EXP: _with_out(torch.exp),
    PointwiseMode.LOG: _with_out(torch.log),
    PointwiseMode.NEG: _with_out(torch.neg),
    PointwiseMode.ABS: _with_out(torch.abs),
    PointwiseMode.SQRT: _with_out(torch.sqrt),
    PointwiseMode.RSQRT: _with_out(torch.rsqrt),
    PointwiseMode.IDENTITY: ((lambda x: x), None),
    PointwiseMode.RECIPROCAL: _with_out(torch.reciprocal),
    PointwiseMode.SIN: _with_out(torch.sin),
    PointwiseMode.COS: _with_out(torch.cos),
    PointwiseMode.CEIL: _with_out(torch.ceil),
    PointwiseMode.FLOOR: _with_out(torch.floor),
    PointwiseMode.ERF: _with_out(torch.erf),
    # comparisons give booleans; the writer casts them to 1.0 / 0.0 in the output's type
    PointwiseMode.CMP_EQ: (torch.eq, None),
    PointwiseMode.CMP_NEQ: (torch.ne, None),
    PointwiseMode.CMP_GT: (torch.gt, None),
    PointwiseMode.CMP_GE: (torch.ge, None),
    PointwiseMode.CMP_LT: (torch.lt, None),
    PointwiseMode.CMP_LE: (torch.le, None),
    PointwiseMode.BINARY_SELECT: (_select, None),
}
#: binary modes that take a Python number as their second operand
_NUMBER_RHS = frozenset(
    {
        PointwiseMode.ADD,
        PointwiseMode.SUB,
        PointwiseMode.MUL,
        PointwiseMode.DIV,
        PointwiseMode.POW,
        PointwiseMode.CMP_EQ,
        PointwiseMode.CMP_NEQ,
        PointwiseMode.CMP_GT,
        PointwiseMode.CMP_GE,
        PointwiseMode.CMP_LT,
        PointwiseMode.CMP_LE,
    }
)
_PW_FIELDS = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")
#: modes whose value on integer (or boolean) operands is exact in their own type; the others
#: read such operands in a floating type (see :func:`_integer_operand_dtype`)
_INTEGER_EXACT = EXACT_POINTWISE | {
    PointwiseMode.ADD,
    PointwiseMode.SUB,
    PointwiseMode.MUL,
    PointwiseMode.DIV,  # torch.div is true division: a floating result
}


#: exact modes whose integer result can leave the operands' type: computed in the type of the
#: result (see :func:`_integer_arithmetic_dtype`)
_INTEGER_ARITHMETIC = frozenset(
    {
        PointwiseMode.ADD,
        PointwiseMode.SUB,
        PointwiseMode.MUL,
        PointwiseMode.NEG,
        PointwiseMode.ABS,
    }
)

#: exact modes whose ATen kernels have no boolean form ("ceil_vml_cpu" not implemented for
#: 'Bool', raised at execute): boolean operands are read as integers
_NO_BOOL_KERNEL = frozenset({PointwiseMode.CEIL, PointwiseMode.FLOOR})


def _integer_arithmetic_dtype(operand: torch.dtype, result: torch.dtype) -> torch.dtype:
    """The type an integer (or boolean) operand of ADD, SUB, MUL, NEG or ABS is read in: the
    result's integer type where it is one (a wider one holds the exact value, overflow of the
    result's own type is the result's), else int64, exact as the reference's float64 and
    cuDNN's float compute for values of these types.

    Read in their own type, ATen wrapped or refused: uint8 3 - 5 into an int32 output was 254,
    -uint8 1 into a float output 255, int8 100 + 100 into a float output -56, bool True + True
    (a logical or) 1 where the reference has 2, and bool SUB or NEG raised.
    """
    if result.is_floating_point or result is torch.bool:
        return torch.int64
    return torch.promote_types(operand, result)


def _integer_operand_dtype(ctx: LowerContext, node: Node) -> torch.dtype:
    """The floating type a non-exact mode reads integer operands in: the node's compute type
    (float32 when it is unset or not floating), as the reference and cuDNN compute.

    Read as integers, ATen gave wrong numbers or none: ``pow`` of int32 tensors 2 ** -1 = 0
    (the reference: 0.5), Inductor's GELU/SiLU of an int32 tensor into a float output were off
    by whole units, and the eager GELU, SiLU, ELU, softplus and clipped ReLU raised on ints.
    """
    compute = node.compute_data_type or ctx.graph.compute_data_type
    if compute is not None and compute.is_floating:
        return compute.to_torch()
    return torch.float32


def _empty_operands(operands: list[Any], numel: int, device: str) -> list[Any]:
    return [
        torch.empty(numel, dtype=o, device=device) if isinstance(o, torch.dtype) else o
        for o in operands
    ]


def result_dtype(fn: Fn, operands: list[Any]) -> torch.dtype:
    """The dtype ``fn`` gives for these operands, found on empty tensors (nothing computed).

    Empty CPU tensors answer first, the meta device only where the CPU kernel refuses the
    types (float8 arithmetic, SUB of booleans): on the meta device most of these ops run
    torch's Python references, whose first call imports ``torch._dynamo`` (torch 2.13: 1.5-2 s
    of a CPU ``dnntune run``), which a TORCH_ENGINE plan never uses. Wherever the CPU answers,
    it gives the meta device's answer, for every mode and operand type the lowering passes
    (tests/providers/test_torch_result_dtype.py).
    """
    try:
        return fn(*_empty_operands(operands, 0, "cpu")).dtype
    except Exception:  # the meta device's answer, as before: its dtype, or its error
        return fn(*_empty_operands(operands, 1, "meta")).dtype


def lower_pointwise(ctx: LowerContext, node: Node) -> Step:
    mode: PointwiseMode = node.params["operation"]
    fn, fn_out = activation_forms(node, mode)
    fields = _PW_FIELDS[: mode.arity]
    tensors: list[TensorAttributes] = []
    for f in fields:
        t = node.inputs[f]
        assert t is not None
        tensors.append(t)
    out_t = node.outputs["out_0_tensor_uid"]
    assert out_t is not None

    # Operands: readers of slots; a scalar in_1 of an arithmetic op stays a Python number.
    readers: list[Reader | None] = []
    numbers: list[Any] = []
    for i, t in enumerate(tensors):
        if t.is_scalar and i == 1 and mode in _NUMBER_RHS:
            readers.append(None)
            value = ctx.scalar_value(t)
            if mode not in _INTEGER_EXACT and not isinstance(value, float):
                value = float(value)  # an int tensor ** -1 raises in ATen
            numbers.append(value)
            continue
        dtype = ctx.dtype(t)
        if not dtype.is_floating_point:
            if mode not in _INTEGER_EXACT:
                dtype = _integer_operand_dtype(ctx, node)
            elif mode in _INTEGER_ARITHMETIC or (dtype is torch.bool and mode in _NO_BOOL_KERNEL):
                dtype = _integer_arithmetic_dtype(dtype, ctx.slot_dtype(out_t))
        readers.append(ctx.read(t, dtype))
        numbers.append(dtype)
    out = None
    if fn_out is not None:
        scalar_shaped = [
            t.is_scalar and r is not None for t, r in zip(tensors, readers, strict=True)
        ]
        # a 0-dim scalar operand does not promote like a tensor; keep out= to tensor operands
        if not any(scalar_shaped):
            out = ctx.out_buffer(out_t, result_dtype(fn, numbers))
    write = ctx.write(out_t)

    if len(tensors) == 1:
        (maybe_r0,) = readers
        assert maybe_r0 is not None
        r0: Reader = maybe_r0
        if out is not None:
            assert fn_out is not None
            unary_out = fn_out

            def pointwise_unary_out(slots: Slots) -> None:
                unary_out(r0(slots), out=slots[out])

            return pointwise_unary_out

        def pointwise_unary(slots: Slots) -> None:
            write(slots, fn(r0(slots)))

        return pointwise_unary

    if len(tensors) == 2 and readers[1] is None:
        maybe_r0, number = readers[0], numbers[1]
        assert maybe_r0 is not None
        r0 = maybe_r0
        if out is not None:
            assert fn_out is not None
            number_out = fn_out

            def pointwise_number_out(slots: Slots) -> None:
                number_out(r0(slots), number, out=slots[out])

            return pointwise_number_out

        def pointwise_number(slots: Slots) -> None:
            write(slots, fn(r0(slots), number))

        return pointwise_number

    if len(tensors) == 2:
        maybe_r0, maybe_r1 = readers
        assert maybe_r0 is not None and maybe_r1 is not None
        r0, r1 = maybe_r0, maybe_r1
        if out is not None:
            assert fn_out is not None
            binary_out = fn_out

            def pointwise_binary_out(slots: Slots) -> None:
                binary_out(r0(slots), r1(slots), out=slots[out])

            return pointwise_binary_out

        def pointwise_binary(slots: Slots) -> None:
            write(slots, fn(r0(slots), r1(slots)))

        return pointwise_binary

    all_readers = [r for r in readers if r is not None]

    def pointwise_nary(slots: Slots) -> None:
        write(slots, fn(*(r(slots) for r in all_readers)))

    return pointwise_nary


# ---- reduction ------------------------------------------------------------------------------
def _prod(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    for d in dims:
        x = torch.prod(x, d, keepdim=True)
    return x


_REDUCE: dict[ReductionMode, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    ReductionMode.ADD: lambda x, d: torch.sum(x, d, keepdim=True),
    ReductionMode.MUL: _prod,
    ReductionMode.MAX: lambda x, d: torch.amax(x, d, keepdim=True),
    ReductionMode.MIN: lambda x, d: torch.amin(x, d, keepdim=True),
    ReductionMode.AVG: lambda x, d: torch.mean(x, d, keepdim=True),
    ReductionMode.NORM1: lambda x, d: torch.linalg.vector_norm(x, 1, d, keepdim=True),
    ReductionMode.NORM2: lambda x, d: torch.linalg.vector_norm(x, 2, d, keepdim=True),
    ReductionMode.AMAX: lambda x, d: torch.linalg.vector_norm(x, math.inf, d, keepdim=True),
}
#: with no axis to reduce, what is left of each mode is elementwise
_ELEMENTWISE_PART = {ReductionMode.NORM1, ReductionMode.NORM2, ReductionMode.AMAX}


def lower_reduction(ctx: LowerContext, node: Node) -> Step:
    x_t, y_t = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x_t is not None and y_t is not None
    mode: ReductionMode = node.params["mode"]
    dims = [
        i for i, (xd, yd) in enumerate(zip(x_t.dims, y_t.dims, strict=True)) if yd == 1 and xd != 1
    ]
    # a floating x whose sum is kept wider (fp16 summed into float32) arrives in that type
    # (ctx.dtype: the compute-type contract of .compute_type)
    dtype = ctx.dtype(x_t)
    if not dtype.is_floating_point and mode in (ReductionMode.AVG, *_ELEMENTWISE_PART):
        y_dtype = ctx.dtype(y_t)
        dtype = y_dtype if y_dtype.is_floating_point else torch.float32
    elif (
        not dtype.is_floating_point
        and mode is ReductionMode.MUL
        and ctx.dtype(y_t).is_floating_point
    ):
        # a product of integers into a floating output is taken in float64, as the reference
        # takes it: ATen's integer product is int64, which wrapped past 2**63 (39 uint8 values
        # up to 16: 3.9e18 where the reference and a float32 output hold 2.7e33), and a float32
        # one overflows to inf before a later zero factor (inf * 0: NaN where the answer is 0)
        dtype = torch.float64
    read_x = ctx.read(x_t, dtype)
    write = ctx.write(y_t)
    if not dims:
        if mode in _ELEMENTWISE_PART:

            def reduction_abs(slots: Slots) -> None:
                write(slots, torch.abs(read_x(slots)))

            return reduction_abs

        def reduction_identity(slots: Slots) -> None:
            write(slots, read_x(slots))

        return reduction_identity
    reduce = _REDUCE[mode]

    def reduction(slots: Slots) -> None:
        write(slots, reduce(read_x(slots), dims))

    return reduction
