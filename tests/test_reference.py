"""The reference against independent computations: conv, matmul, pointwise, reduction, pooling.

Each expected value is computed another way (im2col + einsum, autograd, NumPy, explicit loops)
on the same inputs, in float64.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import dnntune as dt
from dnntune import reference as ref
from dnntune.graph import (
    ConvMode,
    DataType,
    GraphBuilder,
    OpKind,
    PointwiseMode,
    ReductionMode,
    ResampleMode,
    TensorAttributes,
    channels_last_strides,
)

F64 = torch.float64


def uid(t: TensorAttributes) -> int:
    """The tensor's uid (assigned once the graph is validated)."""
    assert t.uid is not None
    return t.uid


def _graph(name: str = "g", io: DataType = DataType.FLOAT) -> GraphBuilder:
    return GraphBuilder(
        name=name,
        io_data_type=io,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )


def _run(g: GraphBuilder, seed: int = 0) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    g.validate()
    pack = ref.make_inputs(g, seed=seed)
    return pack, ref.run(g, pack)


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-10) -> None:
    torch.testing.assert_close(actual.to(F64), expected.to(F64), rtol=tol, atol=tol)


def _x(pack: dict[int, torch.Tensor], t: TensorAttributes) -> torch.Tensor:
    assert t.uid is not None
    return pack[uid(t)].to(F64)


# ---- convolution: im2col written out ----------------------------------------------------------
def _pad(x: torch.Tensor, pre: list[int], post: list[int], value: float = 0.0) -> torch.Tensor:
    n = len(pre)
    shape = [*x.shape[:2], *(x.shape[2 + i] + pre[i] + post[i] for i in range(n))]
    out = torch.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None), *(slice(pre[i], pre[i] + x.shape[2 + i]) for i in range(n)))] = x
    return out


def conv_im2col(
    x: torch.Tensor,
    w: torch.Tensor,
    pre: list[int],
    post: list[int],
    stride: list[int],
    dilation: list[int],
    flip: bool = False,
) -> torch.Tensor:
    """Grouped N-D convolution as windows (unfold) times the filter, summed with einsum."""
    n = x.dim() - 2
    if flip:
        w = w.flip(list(range(2, 2 + n)))
    cols = _pad(x, pre, post)
    for i in range(n):
        cols = cols.unfold(2 + i, dilation[i] * (w.shape[2 + i] - 1) + 1, stride[i])
    every: tuple[Any, ...] = (..., *(slice(None, None, dilation[i]) for i in range(n)))
    cols = cols[every]
    batch, channels = x.shape[:2]
    k, cg = w.shape[:2]
    groups = channels // cg
    out_sp, k_sp = list(cols.shape[2 : 2 + n]), list(w.shape[2:])
    cols = cols.reshape(batch, groups, cg, *out_sp, *k_sp)
    wg = w.reshape(groups, k // groups, cg, *k_sp)
    o, kk = string.ascii_lowercase[8 : 8 + n], string.ascii_lowercase[16 : 16 + n]
    y = torch.einsum(f"zgc{o}{kk},gyc{kk}->zgy{o}", cols, wg)
    return y.reshape(batch, k, *out_sp)


CONV_CASES = [
    # x dims, w dims, pre, post, stride, dilation, channels_last, conv_mode
    ([2, 4, 7, 8], [6, 4, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], False, ConvMode.CROSS_CORRELATION),
    ([2, 4, 9, 8], [6, 2, 3, 2], [1, 0], [2, 1], [2, 1], [2, 1], True, ConvMode.CROSS_CORRELATION),
    ([1, 6, 6, 6], [6, 1, 3, 3], [0, 2], [1, 0], [1, 2], [1, 1], False, ConvMode.CROSS_CORRELATION),
    ([2, 3, 6, 5], [4, 3, 2, 3], [1, 1], [0, 1], [1, 1], [1, 1], True, ConvMode.CONVOLUTION),
    (
        [1, 4, 5, 6, 5],
        [4, 2, 3, 2, 3],
        [1, 0, 1],
        [0, 1, 2],
        [1, 2, 1],
        [1, 1, 2],
        False,
        ConvMode.CROSS_CORRELATION,
    ),
    (
        [1, 2, 4, 5, 4],
        [3, 2, 2, 3, 2],
        [0, 1, 0],
        [1, 1, 1],
        [2, 1, 1],
        [1, 1, 1],
        True,
        ConvMode.CONVOLUTION,
    ),
]


def _strides(dims: list[int], channels_last: bool) -> list[int] | None:
    return channels_last_strides(dims) if channels_last else None


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{len(c[0]) - 2}d")
def test_conv_fprop_matches_im2col(case: tuple[Any, ...]) -> None:
    xd, wd, pre, post, stride, dil, nhwc, mode = case
    g = _graph()
    x = g.tensor("x", xd, _strides(xd, nhwc))
    w = g.tensor("w", wd, _strides(wd, nhwc))
    y = g.conv_fprop(
        x, w, pre_padding=pre, post_padding=post, stride=stride, dilation=dil, conv_mode=mode
    ).set_output(True)
    pack, out = _run(g)
    assert pack[uid(x)].stride() == tuple(x.strides)
    expected = conv_im2col(
        _x(pack, x), _x(pack, w), pre, post, stride, dil, flip=mode is ConvMode.CONVOLUTION
    )
    _close(out[uid(y)], expected)


def _autograd_conv(
    case: tuple[Any, ...], x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, pre, post, stride, dil, _, mode = case
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = conv_im2col(x, w, pre, post, stride, dil, flip=mode is ConvMode.CONVOLUTION)
    y.backward(dy)
    assert x.grad is not None and w.grad is not None
    return x.grad, w.grad


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{len(c[0]) - 2}d")
def test_conv_dgrad_and_wgrad_match_autograd(case: tuple[Any, ...]) -> None:
    xd, wd, pre, post, stride, dil, nhwc, mode = case
    probe = _graph()
    ydims = probe.conv_fprop(
        probe.tensor("x", xd),
        probe.tensor("w", wd),
        pre_padding=pre,
        post_padding=post,
        stride=stride,
        dilation=dil,
    ).dims
    geometry = {
        "pre_padding": pre,
        "post_padding": post,
        "stride": stride,
        "dilation": dil,
        "conv_mode": mode,
    }

    gd = _graph("dgrad")
    dy = gd.tensor("dy", ydims, _strides(ydims, nhwc))
    w = gd.tensor("w", wd)
    dx = gd.conv_dgrad(dy, w, dx_dims=xd, **geometry).set_output(True)
    pack_d, out_d = _run(gd, seed=3)

    gw = _graph("wgrad")
    dy2 = gw.tensor("dy", ydims, _strides(ydims, nhwc))
    x2 = gw.tensor("x", xd, _strides(xd, nhwc))
    dw = gw.conv_wgrad(dy2, x2, dw_dims=wd, **geometry).set_output(True)
    pack_w, out_w = _run(gw, seed=4)

    x_any = torch.randn(xd, dtype=F64)
    dx_expected, _ = _autograd_conv(case, x_any, _x(pack_d, w), _x(pack_d, dy))
    _close(out_d[uid(dx)], dx_expected)
    _, dw_expected = _autograd_conv(
        case, _x(pack_w, x2), torch.randn(wd, dtype=F64), _x(pack_w, dy2)
    )
    _close(out_w[uid(dw)], dw_expected)


# ---- matmul -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("adims", "bdims", "b_transposed"),
    [([3, 5], [5, 4], False), ([2, 1, 3, 5], [4, 5, 6], True), ([2, 3, 4, 5], [1, 5, 2], False)],
)
def test_matmul_matches_einsum_with_broadcast(
    adims: list[int], bdims: list[int], b_transposed: bool
) -> None:
    g = _graph()
    a = g.tensor("a", adims)
    bstrides = None
    if b_transposed:  # column-major inner matrices: the layout lives in the strides
        k, n = bdims[-2:]
        bstrides = [*([k * n] * (len(bdims) - 2)), 1, k]
    b = g.tensor("b", bdims, bstrides)
    c = g.matmul(a, b).set_output(True)
    pack, out = _run(g)
    ta, tb = _x(pack, a), _x(pack, b)
    batch = torch.broadcast_shapes(ta.shape[:-2], tb.shape[:-2])
    expected = torch.einsum(
        "...mk,...kn->...mn", ta.expand(*batch, *ta.shape[-2:]), tb.expand(*batch, *tb.shape[-2:])
    )
    assert list(out[uid(c)].shape) == c.dims
    _close(out[uid(c)], expected)


# ---- pointwise --------------------------------------------------------------------------------
_ERF = np.vectorize(math.erf)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


NUMPY_POINTWISE: dict[PointwiseMode, Callable[..., Any]] = {
    PointwiseMode.ADD: lambda a, b: a + b,
    PointwiseMode.SUB: lambda a, b: a - b,
    PointwiseMode.MUL: lambda a, b: a * b,
    PointwiseMode.DIV: lambda a, b: a / b,
    PointwiseMode.MAX: np.maximum,
    PointwiseMode.MIN: np.minimum,
    PointwiseMode.POW: np.power,
    PointwiseMode.RELU_FWD: lambda a: np.maximum(a, 0.0),
    PointwiseMode.GELU_FWD: lambda a: 0.5 * a * (1.0 + _ERF(a / math.sqrt(2.0))),
    PointwiseMode.GELU_APPROX_TANH_FWD: lambda a: (
        0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))
    ),
    PointwiseMode.TANH_FWD: np.tanh,
    PointwiseMode.SIGMOID_FWD: _sigmoid,
    PointwiseMode.SWISH_FWD: lambda a: a * _sigmoid(a),
    PointwiseMode.ELU_FWD: lambda a: np.where(a > 0, a, np.exp(a) - 1.0),
    PointwiseMode.SOFTPLUS_FWD: lambda a: np.log1p(np.exp(a)),
    PointwiseMode.EXP: np.exp,
    PointwiseMode.LOG: np.log,
    PointwiseMode.NEG: np.negative,
    PointwiseMode.ABS: np.abs,
    PointwiseMode.SQRT: np.sqrt,
    PointwiseMode.RSQRT: lambda a: 1.0 / np.sqrt(a),
    PointwiseMode.IDENTITY: lambda a: a,
    PointwiseMode.RECIPROCAL: lambda a: 1.0 / a,
    PointwiseMode.SIN: np.sin,
    PointwiseMode.COS: np.cos,
    PointwiseMode.CEIL: np.ceil,
    PointwiseMode.FLOOR: np.floor,
    PointwiseMode.ERF: _ERF,
    PointwiseMode.CMP_EQ: lambda a, b: (a == b).astype(np.float64),
    PointwiseMode.CMP_NEQ: lambda a, b: (a != b).astype(np.float64),
    PointwiseMode.CMP_GT: lambda a, b: (a > b).astype(np.float64),
    PointwiseMode.CMP_GE: lambda a, b: (a >= b).astype(np.float64),
    PointwiseMode.CMP_LT: lambda a, b: (a < b).astype(np.float64),
    PointwiseMode.CMP_LE: lambda a, b: (a <= b).astype(np.float64),
    PointwiseMode.BINARY_SELECT: lambda a, b, c: np.where(c != 0, a, b),
}


def test_every_pointwise_mode_has_an_independent_check() -> None:
    assert set(NUMPY_POINTWISE) == set(PointwiseMode)


@pytest.mark.parametrize("mode", list(PointwiseMode), ids=lambda m: m.json_name)
def test_pointwise_matches_numpy(mode: PointwiseMode) -> None:
    g = _graph()
    shapes = ([2, 3, 4], [1, 3, 1], [2, 1, 4])[: mode.arity]  # in_1/in_2 broadcast
    ins = [g.tensor(f"in{i}", s) for i, s in enumerate(shapes)]
    out = g.pointwise(*ins, mode=mode).set_output(True)
    g.validate()
    pack = ref.make_inputs(g, seed=7)
    if mode.is_comparison:  # small integers so that equal pairs occur
        for i, t in enumerate(ins):
            pack[uid(t)] = torch.randint(
                -1, 2, t.dims, generator=torch.Generator().manual_seed(i)
            ).float()
    result = ref.run(g, pack)[uid(out)]
    args = [_x(pack, t).numpy() for t in ins]
    expected = np.broadcast_to(NUMPY_POINTWISE[mode](*args), out.dims)
    assert list(result.shape) == out.dims == [2, 3, 4]
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("mode", "params", "expected"),
    [
        (
            PointwiseMode.RELU_FWD,
            {"relu_lower_clip": 0.2, "relu_upper_clip": 0.6, "relu_lower_clip_slope": 0.1},
            lambda a: np.where(a > 0.2, np.minimum(a, 0.6), 0.2 + 0.1 * (a - 0.2)),
        ),
        (
            PointwiseMode.RELU_FWD,
            {"relu_lower_clip_slope": 0.01},
            lambda a: np.where(a > 0, a, 0.01 * a),
        ),
        (PointwiseMode.SWISH_FWD, {"swish_beta": 1.5}, lambda a: a * _sigmoid(1.5 * a)),
        (
            PointwiseMode.ELU_FWD,
            {"elu_alpha": 0.5},
            lambda a: np.where(a > 0, a, 0.5 * np.expm1(a)),
        ),
        (
            PointwiseMode.SOFTPLUS_FWD,
            {"softplus_beta": 2.0},
            lambda a: np.log1p(np.exp(2.0 * a)) / 2.0,
        ),
    ],
)
def test_pointwise_parameters(mode: PointwiseMode, params: dict[str, Any], expected: Any) -> None:
    g = _graph()
    x = g.tensor("x", [4, 8])
    y = g.pointwise(x, mode=mode, **params).set_output(True)
    pack, out = _run(g)
    np.testing.assert_allclose(out[uid(y)].numpy(), expected(_x(pack, x).numpy()), rtol=1e-12)


@pytest.mark.parametrize(
    "params", [{}, {"relu_lower_clip_slope": 0.01}, {"relu_upper_clip": 2.0}], ids=str
)
def test_relu_of_infinities_and_nan_is_pytorchs(params: dict[str, Any]) -> None:
    """max(-inf, 0) is 0, not the NaN of 0 * -inf (an additive -inf mask before a ReLU made
    every correct engine fail verification, new-user audit, session 15); NaN stays NaN."""
    g = _graph()
    x = g.tensor("x", [1, 5])
    y = g.pointwise(x, mode=PointwiseMode.RELU_FWD, **params).set_output(True)
    g.validate()
    values = torch.tensor([[-math.inf, -2.0, 3.0, math.inf, math.nan]])
    out = ref.run(g, {uid(x): values})[uid(y)]
    slope = params.get("relu_lower_clip_slope", 0.0)
    want = torch.where(values > 0, values, slope * values) if slope else torch.relu(values)
    want = want.clamp(max=params.get("relu_upper_clip", math.inf))
    torch.testing.assert_close(out.float(), want, equal_nan=True)


def test_pointwise_scalar_operand_and_boolean_select() -> None:
    g = _graph()
    a, b = g.tensor("a", [3, 4]), g.tensor("b", [3, 4])
    cond = g.tensor("cond", [3, 1], data_type=DataType.BOOLEAN)
    scaled = g.pointwise(a, 2.5, mode=PointwiseMode.MUL)
    y = g.pointwise(scaled, b, cond, mode=PointwiseMode.BINARY_SELECT).set_output(True)
    pack, out = _run(g)
    assert pack[uid(cond)].dtype == torch.bool
    expected = torch.where(pack[uid(cond)], 2.5 * _x(pack, a), _x(pack, b))
    _close(out[uid(y)], expected)


def test_a_boolean_output_holds_whether_the_value_is_nonzero(cpu_handle: dt.Handle) -> None:
    """Truncated first, 0.5 became False; PyTorch's conversion (and TORCH_ENGINE's output) make
    it True, so verification failed every engine on a float op with a boolean output."""
    g = dt.Graph("relu_mask", io_data_type=DataType.FLOAT)
    x = g.tensor("x", [2, 4])
    y = g.pointwise(x, mode=PointwiseMode.RELU_FWD).set_output(True)
    y.set_data_type(DataType.BOOLEAN)
    values = torch.tensor([[0.5, -0.5, 0.0, 2.0], [0.25, -3.0, 1.0, 1e-3]])
    expected = torch.relu(values).to(torch.bool)
    assert ref.run(g, {x: values})[uid(y)].to(torch.bool).equal(expected)
    g.build(cpu_handle)
    out = torch.empty(2, 4, dtype=torch.bool)
    g.execute(cpu_handle, {x: values, y: out})
    assert out.equal(expected)
    assert ref.check_outputs(g, {uid(y): out}, ref.run(g, {x: values})).ok


def test_an_output_holds_what_its_type_stores(cpu_handle: dt.Handle) -> None:
    """The reference kept -6 for a uint8 output and -82324 for a half one, so the check blamed
    an engine that stored 250 and -inf, what a conversion to those types gives (new-user audit,
    session 56). Both now match TORCH_ENGINE's outputs."""
    g = dt.Graph("sub_u8", io_data_type=DataType.INT32, compute_data_type=DataType.FLOAT)
    a, b = (
        g.tensor("a", [4], data_type=DataType.INT32),
        g.tensor("b", [4], data_type=DataType.INT32),
    )
    y = g.pointwise(a, b, mode=PointwiseMode.SUB).set_output(True)
    y.set_data_type(DataType.UINT8)
    i32 = torch.int32
    pack = {a: torch.tensor([1, 9, 0, 300], dtype=i32), b: torch.tensor([7, 2, 0, 0], dtype=i32)}
    expected = ref.run(g, pack)[uid(y)]
    assert expected.tolist() == [250.0, 7.0, 0.0, 44.0]  # -6 and 300 wrap, as uint8 stores them
    g.build(cpu_handle)
    out = torch.empty(4, dtype=torch.uint8)
    g.execute(cpu_handle, {**pack, y: out})
    assert ref.check_outputs(g, {uid(y): out}, ref.run(g, pack)).ok

    h = dt.Graph("scale_half", io_data_type=DataType.HALF, compute_data_type=DataType.FLOAT)
    x = h.tensor("x", [3])
    z = h.pointwise(x, 1e5, mode=PointwiseMode.MUL).set_output(True)
    values = {x: torch.tensor([-0.82324, 0.5, 1e-3], dtype=torch.float16)}
    stored = ref.run(h, values)[uid(z)]
    assert stored[0].item() == -math.inf and math.isfinite(stored[1].item())
    h.build(cpu_handle)
    half = torch.empty(3, dtype=torch.float16)
    h.execute(cpu_handle, {**values, z: half})
    assert ref.check_outputs(h, {uid(z): half}, ref.run(h, values)).ok


# ---- reduction --------------------------------------------------------------------------------
NUMPY_REDUCE: dict[ReductionMode, Callable[[np.ndarray, Any], Any]] = {
    ReductionMode.ADD: lambda x, ax: x.sum(axis=ax, keepdims=True),
    ReductionMode.MUL: lambda x, ax: x.prod(axis=ax, keepdims=True),
    ReductionMode.MAX: lambda x, ax: x.max(axis=ax, keepdims=True),
    ReductionMode.MIN: lambda x, ax: x.min(axis=ax, keepdims=True),
    ReductionMode.AVG: lambda x, ax: x.mean(axis=ax, keepdims=True),
    ReductionMode.NORM1: lambda x, ax: np.abs(x).sum(axis=ax, keepdims=True),
    ReductionMode.NORM2: lambda x, ax: np.sqrt((x * x).sum(axis=ax, keepdims=True)),
    ReductionMode.AMAX: lambda x, ax: np.abs(x).max(axis=ax, keepdims=True),
}


@pytest.mark.parametrize("mode", list(ReductionMode), ids=lambda m: m.json_name)
@pytest.mark.parametrize("axes", [(0,), (1, 2), (0, 1, 2), ()], ids=str)
def test_reduction_matches_numpy(mode: ReductionMode, axes: tuple[int, ...]) -> None:
    g = _graph()
    x = g.tensor("x", [3, 4, 5])
    y_dims = [1 if i in axes else d for i, d in enumerate(x.dims)]
    y = g.reduction(x, mode=mode, y_dims=y_dims).set_output(True)
    pack, out = _run(g)
    xs = _x(pack, x).numpy()
    expected = NUMPY_REDUCE[mode](xs, axes) if axes else NUMPY_REDUCE[mode](xs[None], 0)[0]
    assert list(out[uid(y)].shape) == y_dims
    np.testing.assert_allclose(out[uid(y)].numpy(), expected, rtol=1e-12)


# ---- resample (pooling) -----------------------------------------------------------------------
def _pool_loops(
    x: np.ndarray,
    mode: ResampleMode,
    window: list[int],
    stride: list[int],
    pre: list[int],
    out_sp: list[int],
) -> np.ndarray:
    """Pooling written as loops over every output position and every window element."""
    n = len(window)
    out = np.zeros([*x.shape[:2], *out_sp])
    for nb in range(x.shape[0]):
        for c in range(x.shape[1]):
            for o in np.ndindex(*out_sp):
                real = []
                for k in np.ndindex(*window):
                    pos = [o[i] * stride[i] + k[i] - pre[i] for i in range(n)]
                    if all(0 <= pos[i] < x.shape[2 + i] for i in range(n)):
                        real.append(x[(nb, c, *pos)])
                if mode is ResampleMode.MAXPOOL:
                    value = max(real)
                elif mode is ResampleMode.AVGPOOL_INCLUDE_PADDING:
                    value = sum(real) / math.prod(window)
                else:
                    value = sum(real) / len(real)
                out[(nb, c, *o)] = value
    return out


@pytest.mark.parametrize("mode", list(ResampleMode), ids=lambda m: m.json_name)
@pytest.mark.parametrize(
    ("dims", "window", "stride", "pre", "post"),
    [
        ([2, 2, 5, 6], [3, 2], [2, 1], [1, 0], [1, 1]),
        ([1, 2, 4, 3, 5], [2, 2, 3], [1, 2, 2], [1, 0, 1], [0, 1, 1]),
    ],
    ids=["2d", "3d"],
)
def test_pooling_matches_explicit_windows(
    mode: ResampleMode,
    dims: list[int],
    window: list[int],
    stride: list[int],
    pre: list[int],
    post: list[int],
) -> None:
    g = _graph()
    x = g.tensor("x", dims, channels_last_strides(dims))
    y = g.resample(
        x, mode=mode, window=window, stride=stride, pre_padding=pre, post_padding=post
    ).set_output(True)
    pack, out = _run(g)
    expected = _pool_loops(_x(pack, x).numpy(), mode, window, stride, pre, y.dims[2:])
    np.testing.assert_allclose(out[uid(y)].numpy(), expected, rtol=1e-12)


# ---- multi-node graphs ------------------------------------------------------------------------
def test_conv_bias_relu_graph_through_public_facade() -> None:
    g = dt.Graph(
        name="cbr",
        io_data_type=dt.DataType.HALF,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[2, 8, 6, 6], strides=channels_last_strides([2, 8, 6, 6]))
    w = g.tensor(name="W", dims=[4, 8, 3, 3], strides=channels_last_strides([4, 8, 3, 3]))
    b = g.tensor(name="B", dims=[1, 4, 1, 1])
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    pack, out = _run(g)
    assert set(out) == {y.uid}
    expected = torch.relu(
        conv_im2col(_x(pack, x), _x(pack, w), [1, 1], [1, 1], [1, 1], [1, 1]) + _x(pack, b)
    )
    assert out[uid(y)].dtype == F64
    _close(out[uid(y)], expected)


def test_intermediates_keep_the_compute_precision() -> None:
    # (x + 1000) - 1000 in half would lose x's low bits; the reference keeps them.
    g = _graph(io=DataType.HALF)
    x = g.tensor("x", [64])
    y = g.pointwise(
        g.pointwise(x, 1000.0, mode=PointwiseMode.ADD), 1000.0, mode=PointwiseMode.SUB
    ).set_output(True)
    pack, out = _run(g)
    _close(out[uid(y)], _x(pack, x), tol=1e-12)


def test_every_op_kind_has_a_reference() -> None:
    from dnntune._reference_ops import OPS

    assert set(OPS) == set(OpKind)


# ---- CUDA: float32 without TF32 -----------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_reference_is_exact_float32_without_tf32() -> None:
    """On CUDA the reference computes in float32 with TF32 off: it matches float64 to ~1e-6.

    TF32 rounds products to 10 mantissa bits; on these sizes it misses by ~1e-4, which the
    check below would catch (and does, when TF32 is switched on around the same matmul).
    """
    g = _graph()
    x = g.tensor("x", [4, 64, 28, 28], channels_last_strides([4, 64, 28, 28]))
    w = g.tensor("w", [64, 64, 3, 3])
    y = g.conv_fprop(x, w, padding=1).set_output(True)
    gm = _graph()
    a, b = gm.tensor("a", [512, 2048]), gm.tensor("b", [2048, 512])
    c = gm.matmul(a, b).set_output(True)
    gs = _graph()
    q, k, v = (gs.tensor(n, [2, 8, 256, 64]) for n in "qkv")
    o = gs.sdpa(q, k, v, causal_mask=True)[0].set_output(True)
    tight = ref.Tolerance(rtol=1e-5, atol=1e-5)
    for graph, out in ((g, y), (gm, c), (gs, o)):
        graph.validate()
        cpu_pack = ref.make_inputs(graph, "cpu", seed=1)
        cuda_pack = ref.make_inputs(graph, "cuda", seed=1, draw_on="cpu")
        assert all(torch.equal(cpu_pack[u], cuda_pack[u].cpu()) for u in cpu_pack)
        expected = ref.run(graph, cpu_pack, precision=torch.float64)[uid(out)]
        actual = ref.run(graph, cuda_pack)[uid(out)]
        assert actual.device.type == "cuda" and actual.dtype == torch.float32
        result = ref.compare(actual, expected, tight)
        assert result.ok, result.message
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        pack = ref.make_inputs(gm, "cuda", seed=1)
        tf32 = pack[uid(a)] @ pack[uid(b)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    expected = ref.run(gm, ref.make_inputs(gm, "cpu", seed=1), precision=torch.float64)[uid(c)]
    assert not ref.compare(tf32, expected, tight).ok


def test_a_cast_is_rounded_for_what_reads_it() -> None:
    """cuDNN frontend's mixed-precision idiom (test_matmul_bias_relu.py): an identity node
    whose output is set to bfloat16 is a cast, and the matmul reads the cast values. The
    reference read the float32 values: it failed TORCH_ENGINE, which casts (0.12 off), and
    verified TORCH_COMPILE_ENGINE, which fused the cast away. A type the graph's types give
    (the intermediate type) is still never rounded."""
    torch.manual_seed(0)
    a_, b_ = torch.randn(4, 32, 128), torch.randn(4, 128, 64)
    f, bf16 = DataType.FLOAT, DataType.BFLOAT16
    g = dt.Graph("cast", io_data_type=f, intermediate_data_type=f, compute_data_type=f)
    a, b = g.tensor_like(a_), g.tensor_like(b_)
    a16 = g.pointwise(a, mode=PointwiseMode.IDENTITY).set_data_type(bf16)
    b16 = g.pointwise(b, mode=PointwiseMode.IDENTITY).set_data_type(bf16)
    c = g.matmul(a16, b16)
    c.set_output(True)
    got = ref.run(g, {a: a_, b: b_})[c.uid]
    expected = a_.bfloat16().double() @ b_.bfloat16().double()  # the sample's reference
    torch.testing.assert_close(got, expected)
    # the graph's own intermediate type: not a cast, never rounded
    g16 = dt.Graph("typed", io_data_type=f, intermediate_data_type=bf16, compute_data_type=f)
    a, b = g16.tensor_like(a_), g16.tensor_like(b_)
    c = g16.matmul(g16.pointwise(a, mode=PointwiseMode.IDENTITY), b)
    c.set_output(True)
    torch.testing.assert_close(ref.run(g16, {a: a_, b: b_})[c.uid], a_.double() @ b_.double())


def test_an_output_of_a_narrower_type_is_read_rounded() -> None:
    """cuDNN frontend's sample 23 (layernorm with pointwise add fusion): the sum is a bfloat16
    output of a float graph, and the layer norm reads it as stored."""
    torch.manual_seed(1)
    x_, r_ = torch.randn(64, 256), torch.randn(64, 256)
    f = DataType.FLOAT
    g = dt.Graph("ln_add", io_data_type=f, intermediate_data_type=f, compute_data_type=f)
    x, r = g.tensor_like(x_), g.tensor_like(r_)
    s, b = g.tensor("scale", [1, 256]), g.tensor("bias", [1, 256])
    added = g.pointwise(x, r, mode=PointwiseMode.ADD)
    added.set_output(True).set_data_type(DataType.BFLOAT16)
    (y,) = g.layernorm(added, s, b, 1e-3)
    y.set_output(True)
    ones, zeros = torch.ones(1, 256), torch.zeros(1, 256)
    got = ref.run(g, {x: x_, r: r_, s: ones, b: zeros})[y.uid]
    stored = (x_ + r_).bfloat16().double()
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(stored, [256], eps=1e-3))
