"""Conformance cases: norms, batch norms, pooling, reductions, pointwise chains."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from dnntune.graph.tensor import channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode, ReductionMode, ResampleMode
from dnntune.testing._conformance_common import (
    _F32,
    _graph,
    _layout_strides,
    _out,
    _tail,
    _tensor,
    _wide,
)

if TYPE_CHECKING:
    from dnntune.frontend import Graph
    from dnntune.graph.tensor import TensorAttributes


# ---- normalisation ------------------------------------------------------------------------------
def _rows(rng: random.Random, shape_class: str, full: bool, layout: str) -> tuple[int, int]:
    m, n = _rows_of(rng, shape_class, full)
    if layout in ("transposed", "strided") and shape_class != "tiny" and m == 1:
        m = 3  # one row has no layout to get wrong
    return m, n


def _rows_of(rng: random.Random, shape_class: str, full: bool) -> tuple[int, int]:
    if shape_class == "tiny":
        return 1, 1
    if shape_class == "tail":
        return _tail(rng, (3, 7, 37, 100)), _tail(rng, (100, 129, 1000, 1023, 1025, 4097))
    if shape_class == "wide_row":
        return _wide(rng)
    if shape_class == "many_rows":
        return (65536 if full else 4099), rng.choice((1, 3, 5, 7))
    if full:
        return rng.choice(((8192, 4096), (2048, 1024), (16384, 8192)))
    return rng.choice(((64, 512), (96, 768)))


def _norm_x(
    g: Graph, rng: random.Random, shape_class: str, layout: str, full: bool
) -> tuple[TensorAttributes, list[int], int, str]:
    """The input of a layer/RMS norm, the dims of its scale, how many dims it normalizes."""
    m, n = _rows(rng, shape_class, full, layout)
    if layout == "channels_last":
        c = max(2, min(n, 16))  # at least two channels: a layout to get wrong
        hw = max(1, math.isqrt(max(1, n // c)))
        dims = [max(1, m // 4), c, hw, hw + 1] if shape_class != "tiny" else [1, 1, 1, 1]
        x = g.tensor("X", dims, channels_last_strides(dims))
        return x, [1, *dims[1:]], 3, f"x{dims} channels_last over C,H,W"
    if layout == "broadcast":
        bsz = 2 if m % 2 == 0 and m > 1 else 1
        dims = [bsz, m // bsz, n]
        x = g.tensor("X", dims)
        return x, [1, 1, n], 1, f"x{dims} scale [1, 1, {n}]"
    dims = [m, n]
    x = g.tensor("X", dims, _layout_strides(dims, layout))
    return x, [1, n], 1, f"x{dims}"


def _layernorm(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    g = _graph("layernorm", dtype)
    x, sdims, count, what = _norm_x(g, rng, shape_class, layout, full)
    training = rng.random() < 0.3
    phase = NormFwdPhase.TRAINING if training else NormFwdPhase.INFERENCE
    outs = g.layernorm(
        x,
        g.tensor("SCALE", sdims),
        g.tensor("BIAS", sdims),
        epsilon=1e-5,
        forward_phase=phase,
        normalized_dim_count=count,
        name="layernorm",
    )
    for t, name in zip(outs, ("Y", "MEAN", "INV_VARIANCE"), strict=False):
        t.set_name(name).set_output(True)
    return g, f"{what} phase={phase.name.lower()}"


def _rmsnorm(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    g = _graph("rmsnorm", dtype)
    x, sdims, count, what = _norm_x(g, rng, shape_class, layout, full)
    training = rng.random() < 0.3
    with_bias = rng.random() < 0.3
    phase = NormFwdPhase.TRAINING if training else NormFwdPhase.INFERENCE
    outs = g.rmsnorm(
        x,
        g.tensor("SCALE", sdims),
        epsilon=1e-6,
        bias=g.tensor("BIAS", sdims) if with_bias else None,
        forward_phase=phase,
        normalized_dim_count=count,
        name="rmsnorm",
    )
    for t, name in zip(outs, ("Y", "INV_RMS"), strict=False):
        t.set_name(name).set_output(True)
    return g, f"{what} phase={phase.name.lower()} bias={with_bias}"


def _nchw(rng: random.Random, shape_class: str, full: bool) -> list[int]:
    if shape_class == "tiny":
        return [2, 1, 1, 1]  # training statistics need two values per channel
    if shape_class == "tail":
        return [rng.choice((2, 3)), _tail(rng, (3, 7, 13)), rng.choice((5, 7)), rng.choice((9, 13))]
    if shape_class == "wide_row":
        return [1, 3, 1, 65536 if full else 8195]
    if shape_class == "many_rows":
        return [4096 if full else 512, rng.choice((3, 4)), 1, 1]
    if full:
        return rng.choice(([32, 64, 56, 56], [32, 256, 28, 28], [64, 2048, 7, 7]))
    return [4, 16, 8, 8]


def _channel(g: Graph, name: str, c: int, dtype: DataType = _F32) -> TensorAttributes:
    return g.tensor(name, [1, c, 1, 1], data_type=dtype)


def _bn_x(g: Graph, name: str, dims: list[int], layout: str) -> TensorAttributes:
    if layout == "strided":  # rows padded, and a channel of padding
        return g.tensor(
            name, dims, contiguous_strides([dims[0], dims[1] + 1, dims[2], dims[3] + 3])
        )
    return _tensor(g, name, dims, layout)


def _batchnorm_training(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    dims = _nchw(rng, shape_class, full)
    c = dims[1]
    g = _graph("batchnorm", dtype)
    x = _bn_x(g, "X", dims, layout)
    running = rng.random() < 0.5
    outs = g.batchnorm(
        x,
        _channel(g, "SCALE", c),
        _channel(g, "BIAS", c),
        epsilon=1e-5,
        prev_running_mean=_channel(g, "RUNNING_MEAN", c) if running else None,
        prev_running_variance=_channel(g, "RUNNING_VAR", c) if running else None,
        momentum=0.1 if running else None,
        name="batchnorm",
    )
    names = ("Y", "MEAN", "INV_VARIANCE", "NEXT_RUNNING_MEAN", "NEXT_RUNNING_VAR")
    for t, name in zip(outs, names, strict=False):
        t.set_name(name).set_output(True)
    if layout == "channels_last":
        outs[0].set_strides(channels_last_strides(dims))
    return g, f"x{dims} running={running}"


def _batchnorm_inference(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    dims = _nchw(rng, shape_class, full)
    c = dims[1]
    stats_type = _F32 if rng.random() < 0.7 else dtype
    g = _graph("batchnorm_inference", dtype)
    x = _bn_x(g, "X", dims, "contiguous" if layout == "broadcast" else layout)
    names = ("MEAN", "INV_VARIANCE", "SCALE", "BIAS")
    y = g.batchnorm_inference(x, *(_channel(g, s, c, stats_type) for s in names), name="bn")
    epilogue = rng.choice(("none", "relu", "residual_relu"))
    if epilogue == "residual_relu":
        y = g.pointwise(y, _tensor(g, "R", dims, layout), mode=PointwiseMode.ADD, name="residual")
    if epilogue != "none":
        y = g.pointwise(y, mode=PointwiseMode.RELU_FWD, name="relu")
    _out(y, "Y", layout)
    return g, f"x{dims} stats={stats_type.json_name} epilogue={epilogue}"


def _batchnorm_backward(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    dims = _nchw(rng, shape_class, full)
    c = dims[1]
    g = _graph("batchnorm_backward", dtype)
    dy = _tensor(g, "DY", dims, layout)
    x = _tensor(g, "X", dims, layout)
    outs = g.batchnorm_backward(
        dy,
        x,
        _channel(g, "MEAN", c),
        _channel(g, "INV_VARIANCE", c),
        _channel(g, "SCALE", c),
        name="bn_backward",
    )
    for t, name in zip(outs, ("DX", "DSCALE", "DBIAS"), strict=True):
        t.set_name(name).set_output(True)
    if layout == "channels_last":
        outs[0].set_strides(channels_last_strides(dims))
    return g, f"x{dims}"


# ---- pooling, reduction, pointwise --------------------------------------------------------------
def _pooling(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    mode = rng.choice(list(ResampleMode))
    window: list[int]
    if shape_class == "tiny":
        dims, window, stride, pad = [1, 1, 1, 1], [1, 1], [1, 1], [0, 0]
    elif shape_class == "wide_row":
        dims = [1, 3, 1, 65536 if full else 8195]
        r = rng.choice((2, 3))
        window, stride, pad = [1, r], [1, rng.choice((1, 2))], [0, r // 2]
    elif shape_class == "many_rows":
        dims = [512 if full else 128, 16, 4, 4]
        window, stride, pad = [2, 2], [2, 2], [0, 0]
    elif shape_class == "large":
        dims = rng.choice(([32, 64, 112, 112], [32, 2048, 7, 7])) if full else [2, 8, 16, 16]
        if dims[2] == 7:
            window, stride, pad = [7, 7], [1, 1], [0, 0]
        else:
            window, stride, pad = [3, 3], [2, 2], [1, 1]
    else:
        dims = [
            rng.choice((1, 3)),
            _tail(rng, (3, 5, 13)),
            rng.choice((7, 13)),
            rng.choice((9, 17)),
        ]
        r = rng.choice((2, 3, 7))
        r = min(r, dims[2], dims[3])
        p = rng.choice((0, r // 2))
        window, stride, pad = [r, r], [rng.choice((1, 2))] * 2, [p, p]
    g = _graph("pooling", dtype)
    x = _bn_x(g, "X", dims, layout)
    y = g.resample(x, mode=mode, window=window, stride=stride, padding=pad, name="pool")
    _out(y, "Y", layout)
    return g, f"x{dims} {mode.name.lower()} window{window} stride{stride} pad{pad}"


def _reduction(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    g = _graph("reduction", dtype)
    if layout == "channels_last":
        dims = _nchw(rng, shape_class, full)
        x = g.tensor("X", dims, channels_last_strides(dims))
        axes = rng.choice(([2, 3], [0, 2, 3], [1]))
    else:
        m, n = _rows(rng, shape_class, full, layout)
        dims = [m, n]
        x = g.tensor("X", dims, _layout_strides(dims, layout))
        axes = [1] if rng.random() < 0.75 else [0]
    length = math.prod(dims[a] for a in axes)
    modes = [md for md in ReductionMode if md is not ReductionMode.MUL or length <= 16]
    mode = rng.choice(modes)
    y = g.reduction(x, mode=mode, axes=axes, name="reduce")
    _out(y, "Y")
    return g, f"x{dims} {mode.name.lower()} over axes {axes}"


_FIRST_UNARY = (
    PointwiseMode.EXP,
    PointwiseMode.LOG,
    PointwiseMode.SQRT,
    PointwiseMode.RSQRT,
    PointwiseMode.RECIPROCAL,
    PointwiseMode.CEIL,
    PointwiseMode.FLOOR,
)
_FIRST_BINARY = (PointwiseMode.DIV, PointwiseMode.POW, PointwiseMode.CMP_GT)
_SAFE_UNARY = (
    PointwiseMode.RELU_FWD,
    PointwiseMode.GELU_FWD,
    PointwiseMode.GELU_APPROX_TANH_FWD,
    PointwiseMode.TANH_FWD,
    PointwiseMode.SIGMOID_FWD,
    PointwiseMode.SWISH_FWD,
    PointwiseMode.ELU_FWD,
    PointwiseMode.SOFTPLUS_FWD,
    PointwiseMode.NEG,
    PointwiseMode.ABS,
    PointwiseMode.IDENTITY,
    PointwiseMode.SIN,
    PointwiseMode.COS,
    PointwiseMode.ERF,
)
_SAFE_BINARY = (
    PointwiseMode.ADD,
    PointwiseMode.SUB,
    PointwiseMode.MUL,
    PointwiseMode.MAX,
    PointwiseMode.MIN,
)


def _unary(g: Graph, t: TensorAttributes, mode: PointwiseMode, name: str) -> TensorAttributes:
    """``mode(t)``, with the parameter the activations that have one need."""
    if mode is PointwiseMode.SWISH_FWD:
        return g.pointwise(t, mode=mode, name=name, swish_beta=1.0)
    if mode is PointwiseMode.ELU_FWD:
        return g.pointwise(t, mode=mode, name=name, elu_alpha=1.0)
    if mode is PointwiseMode.SOFTPLUS_FWD:
        return g.pointwise(t, mode=mode, name=name, softplus_beta=1.0)
    return g.pointwise(t, mode=mode, name=name)


def _pointwise_dims(rng: random.Random, shape_class: str, layout: str, full: bool) -> list[int]:
    if layout == "channels_last":
        return _nchw(rng, shape_class, full)
    if shape_class == "tiny":
        return [1] if layout == "contiguous" else [1, 1]
    m, n = _rows(rng, shape_class, full, layout)
    return [m, n]


def _pointwise(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    dims = _pointwise_dims(rng, shape_class, layout, full)
    g = _graph("pointwise", dtype)
    inputs = 0

    def operand(broadcast: bool) -> TensorAttributes | float:
        nonlocal inputs
        inputs += 1
        name = f"IN{inputs}"
        if broadcast and len(dims) >= 2:
            form = rng.choice(("row", "col", "stride0"))
            if form == "row":
                return g.tensor(name, [*([1] * (len(dims) - 1)), dims[-1]])
            if form == "col":
                return g.tensor(name, [*dims[:-1], 1])
            return g.tensor(name, dims, [0] * (len(dims) - 1) + [1])
        if rng.random() < 0.15:
            return rng.choice((0.5, 2.0, -1.5))
        return _tensor(g, name, dims, layout if layout != "broadcast" else "contiguous")

    x = _tensor(g, "X", dims, layout if layout != "broadcast" else "contiguous")
    steps: list[str] = []
    first = rng.choice((*_FIRST_UNARY, *_FIRST_BINARY, *_SAFE_UNARY, *_SAFE_BINARY))
    if first is PointwiseMode.CMP_GT:
        other = _tensor(g, "IN0", dims, layout if layout != "broadcast" else "contiguous")
        cond = g.pointwise(x, other, mode=PointwiseMode.CMP_GT, name="cmp_gt")
        y = g.pointwise(x, other, cond, mode=PointwiseMode.BINARY_SELECT, name="select")
        steps += ["cmp_gt", "binary_select"]
    elif first.arity == 2:
        y = g.pointwise(x, operand(layout == "broadcast"), mode=first, name=first.json_name)
        steps.append(first.json_name)
    else:
        y = _unary(g, x, first, first.json_name)
        steps.append(first.json_name)
    for i in range(rng.choice((0, 1, 2, 3))):
        mode = rng.choice((*_SAFE_UNARY, *_SAFE_BINARY))
        name = f"{mode.json_name}_{i}"
        if mode.arity == 2:
            y = g.pointwise(y, operand(layout == "broadcast"), mode=mode, name=name)
        else:
            y = _unary(g, y, mode, name)
        steps.append(mode.json_name)
    _out(y, "Y", layout)
    return g, f"x{dims} chain={'>'.join(steps)}"
