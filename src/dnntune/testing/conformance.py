"""Conformance cases: deterministic graphs over every op kind, dtype, layout and shape class.

``generate_case(seed, index, size)`` always returns the same graph for the same arguments (pure
Python and the graph builder; nothing runs, no GPU needed). The index walks the cells in a
fixed order, so the first ``len(OPS) * len(DTYPES) * len(SHAPE_CLASSES)`` indices of any seed
cover every (op, dtype, shape class) cell once, and the layout turns over every 195 indices;
the remaining details (kernel size, stride, groups, epilogue, mask, GQA...) come from a
generator seeded by ``(seed, index)``.

Every case is a hipDNN graph JSON document that :meth:`dnntune.Graph.validate` accepts, tagged
with what it covers::

    from dnntune.testing.conformance import generate_case

    case = generate_case(seed=0, index=7, size="small")
    case.op, case.dtype, case.layout, case.shape_class   # ("layernorm", "fp32", ...)
    graph = case.graph()                                 # a fresh dnntune.Graph

``size="small"`` keeps every case cheap enough for the CPU reference (CI); ``size="full"`` uses
near-realistic shapes for the GPU sweep (``benchmarks/conformance.py``). Wide rows (1 x 65536,
3 x 100003) and many short rows appear at both sizes: they are the shapes block-based kernels
get wrong.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dnntune.graph.tensor import channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode, ReductionMode, ResampleMode

if TYPE_CHECKING:
    from dnntune.frontend import Graph
    from dnntune.graph.tensor import TensorAttributes

__all__ = [
    "DTYPES",
    "LAYOUTS",
    "OPS",
    "SHAPE_CLASSES",
    "SIZES",
    "ConformanceCase",
    "build_case",
    "generate_case",
    "generate_cases",
    "layouts_for",
]

OPS = (
    "conv_fprop",
    "conv_dgrad",
    "conv_wgrad",
    "matmul",
    "sdpa",
    "layernorm",
    "rmsnorm",
    "batchnorm_training",
    "batchnorm_inference",
    "batchnorm_backward",
    "pooling",
    "reduction",
    "pointwise",
)
DTYPES = ("fp32", "fp16", "bf16")
SHAPE_CLASSES = ("tiny", "tail", "wide_row", "many_rows", "large")
LAYOUTS = ("contiguous", "channels_last", "transposed", "strided", "broadcast")
SIZES = ("small", "full")

_DTYPE = {"fp32": DataType.FLOAT, "fp16": DataType.HALF, "bf16": DataType.BFLOAT16}
_F32 = DataType.FLOAT
#: the row widths of the wide-row class: wider than any kernel's block
WIDE_ROWS = ((1, 65536), (3, 100003))

_LAYOUTS: dict[str, tuple[str, ...]] = {
    "conv_fprop": ("contiguous", "channels_last", "strided", "broadcast"),
    "conv_dgrad": ("contiguous", "channels_last", "strided"),
    "conv_wgrad": ("contiguous", "channels_last", "strided"),
    "matmul": ("contiguous", "transposed", "strided", "broadcast"),
    "sdpa": ("contiguous", "transposed", "strided", "broadcast"),
    "layernorm": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
    "rmsnorm": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
    "batchnorm_training": ("contiguous", "channels_last", "strided"),
    "batchnorm_inference": ("contiguous", "channels_last", "strided", "broadcast"),
    "batchnorm_backward": ("contiguous", "channels_last"),
    "pooling": ("contiguous", "channels_last", "strided"),
    "reduction": ("contiguous", "channels_last", "transposed", "strided"),
    "pointwise": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
}


def layouts_for(op: str) -> tuple[str, ...]:
    """The layouts a case of ``op`` can have (channels-last only where a rank-4 tensor fits)."""
    return _LAYOUTS[op]


@dataclass(frozen=True)
class ConformanceCase:
    """One generated graph and what it covers."""

    seed: int
    index: int
    size: str
    op: str
    dtype: str
    layout: str
    shape_class: str
    #: the details drawn for this case (kernel, stride, groups, epilogue, mask...)
    detail: str
    #: the hipDNN graph JSON document, as text
    graph_json: str

    @property
    def name(self) -> str:
        where = f"c{self.index:05d}" if self.index >= 0 else f"s{self.seed}"
        return f"{where}_{self.op}_{self.dtype}_{self.layout}_{self.shape_class}"

    @property
    def cell(self) -> tuple[str, str, str]:
        """The (op, dtype, shape class) cell of the coverage matrix."""
        return (self.op, self.dtype, self.shape_class)

    def doc(self) -> dict[str, Any]:
        """The graph JSON document (a fresh dict)."""
        out: dict[str, Any] = json.loads(self.graph_json)
        return out

    def graph(self) -> Graph:
        """A fresh, validated :class:`dnntune.Graph` of this case."""
        from dnntune.frontend import Graph

        g = Graph.from_json(self.graph_json)
        g.validate()
        return g

    def tags(self) -> dict[str, Any]:
        """Everything but the graph: what a results row names."""
        return {
            "seed": self.seed,
            "index": self.index,
            "size": self.size,
            "op": self.op,
            "dtype": self.dtype,
            "layout": self.layout,
            "shape_class": self.shape_class,
            "detail": self.detail,
            "name": self.name,
        }


# ---- shared helpers -----------------------------------------------------------------------------
def _graph(name: str, dtype: DataType) -> Graph:
    from dnntune.frontend import Graph

    return Graph(name=name, io_data_type=dtype, compute_data_type=_F32, intermediate_data_type=_F32)


def _padded(dims: list[int], pad: int = 3) -> list[int]:
    """Strides of a view of the first ``dims[-1]`` columns of rows ``dims[-1] + pad`` wide."""
    return contiguous_strides([*dims[:-1], dims[-1] + pad])


def _transposed(dims: list[int]) -> list[int]:
    """Strides of a [..., M, N] view of a [..., N, M] row-major buffer."""
    m, n = dims[-2], dims[-1]
    base = contiguous_strides([*dims[:-2], n, m])
    return [*base[:-2], 1, m]


def _layout_strides(dims: list[int], layout: str) -> list[int] | None:
    if layout == "channels_last" and len(dims) >= 3:
        return channels_last_strides(dims)
    if layout == "strided":
        return _padded(dims)
    if layout == "transposed" and len(dims) >= 2:
        return _transposed(dims)
    return None


def _tensor(
    g: Graph, name: str, dims: list[int], layout: str = "contiguous", dtype: DataType | None = None
) -> TensorAttributes:
    return g.tensor(name, dims, _layout_strides(dims, layout), data_type=dtype)


def _out(t: TensorAttributes, name: str, layout: str = "contiguous") -> None:
    t.set_name(name).set_output(True)
    if layout == "channels_last" and len(t.dims) >= 3:
        t.set_strides(channels_last_strides(t.dims))


def _tail(rng: random.Random, values: tuple[int, ...] = (3, 7, 13, 37, 100, 129, 257)) -> int:
    return rng.choice(values)


def _wide(rng: random.Random) -> tuple[int, int]:
    return rng.choice(WIDE_ROWS)


# ---- convolutions -------------------------------------------------------------------------------
@dataclass
class _ConvShape:
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    groups: int = 1
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)

    def out_hw(self) -> tuple[int, int]:
        dims = []
        for size, k, p, st, d in zip(
            (self.h, self.w), (self.r, self.s), self.pad, self.stride, self.dilation, strict=True
        ):
            dims.append((size + 2 * p - d * (k - 1) - 1) // st + 1)
        return dims[0], dims[1]

    def fits(self) -> bool:
        return min(self.out_hw()) >= 1

    def describe(self) -> str:
        return (
            f"n{self.n} c{self.c} {self.h}x{self.w} k{self.k} f{self.r}x{self.s} "
            f"g{self.groups} s{self.stride} d{self.dilation} p{self.pad}"
        )


def _conv_shape(rng: random.Random, shape_class: str, full: bool) -> _ConvShape:
    if shape_class == "tiny":
        r = rng.choice((1, 3))
        return _ConvShape(1, 1, 1, 1, 1, r, r, pad=(r // 2, r // 2))
    if shape_class == "wide_row":
        r = rng.choice((1, 3, 7))
        width = rng.choice((65536, 65536 + 3)) if full else rng.choice((8192, 8195))
        st = rng.choice((1, 2))
        return _ConvShape(1, rng.choice((1, 3)), 1, width, 4, 1, r, stride=(1, st), pad=(0, r // 2))
    if shape_class == "many_rows":
        r = rng.choice((1, 3))
        n = 4096 if full else 256
        return _ConvShape(n, 3, 3, 3, 8, r, r, pad=(r // 2, r // 2))
    if shape_class == "large":
        options = (
            [
                (32, 64, 56, 64, 3, 1, 1),
                (32, 256, 56, 64, 1, 1, 1),
                (16, 128, 28, 128, 3, 2, 1),
                (8, 3, 224, 64, 7, 2, 1),
                (32, 512, 7, 512, 3, 1, 1),
                (32, 96, 56, 96, 3, 1, 96),
            ]
            if full
            else [(2, 16, 16, 16, 3, 1, 1), (1, 3, 32, 8, 7, 2, 1), (2, 8, 12, 8, 3, 1, 8)]
        )
        n, c, hw, k, r, st, groups = rng.choice(options)
        return _ConvShape(n, c, hw, hw, k, r, r, groups, (st, st), pad=(r // 2, r // 2))
    # tail: non-powers of two, groups, dilation, stride
    r = rng.choice((1, 3, 7))
    groups = rng.choice((1, 1, 2, 3))
    c = groups * rng.choice((1, 3, 5))
    k = groups * rng.choice((1, 2, 5))
    if rng.random() < 0.2:  # depthwise
        groups, c = 6, 6
        k = 6
    st = rng.choice((1, 2))
    d = rng.choice((1, 2)) if r > 1 else 1
    pad = rng.choice((0, d * (r // 2)))
    shape = _ConvShape(
        rng.choice((1, 3)),
        c,
        rng.choice((7, 13, 17)),
        rng.choice((9, 15, 31)),
        k,
        r,
        r,
        groups,
        (st, st),
        (d, d),
        (pad, pad),
    )
    if not shape.fits():
        shape.dilation, shape.pad = (1, 1), (r // 2, r // 2)
    return shape


def _conv_fprop(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    cs = _conv_shape(rng, shape_class, full)
    g = _graph("conv_fprop", dtype)
    x = _tensor(g, "X", [cs.n, cs.c, cs.h, cs.w], layout)
    w = _tensor(g, "W", [cs.k, cs.c // cs.groups, cs.r, cs.s], layout)
    y = g.conv_fprop(
        x, w, padding=list(cs.pad), stride=list(cs.stride), dilation=list(cs.dilation), name="conv"
    )
    epilogue = "bias_relu" if layout == "broadcast" or rng.random() < 0.4 else "none"
    if epilogue == "bias_relu":
        bias = g.tensor("BIAS", [1, cs.k, 1, 1])
        y = g.pointwise(y, bias, mode=PointwiseMode.ADD, name="bias")
        y = g.pointwise(y, mode=PointwiseMode.RELU_FWD, name="relu")
    _out(y, "Y", layout)
    return g, f"{cs.describe()} epilogue={epilogue}"


def _conv_dgrad(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    cs = _conv_shape(rng, shape_class, full)
    ho, wo = cs.out_hw()
    g = _graph("conv_dgrad", dtype)
    dy = _tensor(g, "DY", [cs.n, cs.k, ho, wo], layout)
    w = _tensor(g, "W", [cs.k, cs.c // cs.groups, cs.r, cs.s], layout)
    dx = g.conv_dgrad(
        dy,
        w,
        padding=list(cs.pad),
        stride=list(cs.stride),
        dilation=list(cs.dilation),
        dx_dims=[cs.n, cs.c, cs.h, cs.w],
        name="dgrad",
    )
    _out(dx, "DX", layout)
    return g, cs.describe()


def _conv_wgrad(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    cs = _conv_shape(rng, shape_class, full)
    ho, wo = cs.out_hw()
    g = _graph("conv_wgrad", dtype)
    dy = _tensor(g, "DY", [cs.n, cs.k, ho, wo], layout)
    x = _tensor(g, "X", [cs.n, cs.c, cs.h, cs.w], layout)
    dw = g.conv_wgrad(
        dy,
        x,
        padding=list(cs.pad),
        stride=list(cs.stride),
        dilation=list(cs.dilation),
        dw_dims=[cs.k, cs.c // cs.groups, cs.r, cs.s],
        name="wgrad",
    )
    _out(dw, "DW", layout)
    return g, cs.describe()


# ---- matmul -------------------------------------------------------------------------------------
_EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu", "gelu_tanh", "bias_swish", "residual")


def _matmul(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    if shape_class == "tiny":
        m = n = k = 1
    elif shape_class == "tail":
        m, n, k = (_tail(rng, (3, 17, 33, 100, 129, 255, 1000)) for _ in range(3))
    elif shape_class == "wide_row":
        if rng.random() < 0.5:
            m, k, n = rng.choice((1, 3)), 65536, rng.choice((8, 16))
        else:
            m, k, n = rng.choice((1, 3)), 64, 100003 if full else 10007
    elif shape_class == "many_rows":
        m, k, n = 65536 if full else 4099, rng.choice((3, 8, 16)), rng.choice((3, 8))
    elif full:
        big = 2048 if dtype is _F32 else 4096
        m, n, k = rng.choice(((big, big, big), (8192, 1024, 4096), (512, 4096, 11008)))
    else:
        m, n, k = rng.choice(((128, 96, 64), (64, 48, 200)))
    batched = layout == "broadcast" or (shape_class in ("tail", "tiny") and rng.random() < 0.4)
    b = (rng.choice((2, 3, 5)) if shape_class != "tiny" else 1) if batched else 0
    if shape_class == "large" and b:
        m, n, k = (max(16, v // 4) for v in (m, n, k))
    lead_a = [b] if b else []
    lead_b = ([1] if layout == "broadcast" else [b]) if b else []
    g = _graph("matmul", dtype)
    a_dims, b_dims = [*lead_a, m, k], [*lead_b, k, n]
    transpose_a = layout == "transposed" and rng.random() < 0.4
    a_strides = _transposed(a_dims) if transpose_a else None
    if layout == "strided":
        a_strides = _padded(a_dims, 5)
    a = g.tensor("A", a_dims, a_strides)
    b_strides = _transposed(b_dims) if layout == "transposed" and not transpose_a else None
    if layout == "strided":
        b_strides = _padded(b_dims, 5)
    bt = g.tensor("B", b_dims, b_strides)
    c = g.matmul(a, bt, name="matmul")
    epilogue = rng.choice(_EPILOGUES[1:] if layout == "broadcast" else _EPILOGUES)
    ones = [1] * len(lead_a)
    if epilogue.startswith("bias"):
        c = g.pointwise(c, g.tensor("BIAS", [*ones, 1, n]), mode=PointwiseMode.ADD, name="bias")
    if epilogue == "bias_relu":
        c = g.pointwise(c, mode=PointwiseMode.RELU_FWD, name="relu")
    elif epilogue == "bias_gelu":
        c = g.pointwise(c, mode=PointwiseMode.GELU_FWD, name="gelu")
    elif epilogue == "gelu_tanh":
        c = g.pointwise(c, mode=PointwiseMode.GELU_APPROX_TANH_FWD, name="gelu_tanh")
    elif epilogue == "bias_swish":
        c = g.pointwise(c, mode=PointwiseMode.SWISH_FWD, swish_beta=1.0, name="silu")
    elif epilogue == "residual":
        c = g.pointwise(c, g.tensor("R", [*lead_a, m, n]), mode=PointwiseMode.ADD, name="residual")
    _out(c, "C")
    where = "a" if transpose_a else "b"
    return g, f"batch {b or '-'} m{m} n{n} k{k} epilogue={epilogue} transposed={where}"


# ---- attention ----------------------------------------------------------------------------------
def _bshd(dims: list[int]) -> list[int]:
    """Strides of a [B, H, S, D] view of a [B, S, H, D] buffer."""
    _, h, s, d = dims
    return [s * h * d, d, h * d, 1]


def _sdpa(
    rng: random.Random, dtype: DataType, shape_class: str, layout: str, full: bool
) -> tuple[Graph, str]:
    gqa = rng.random() < 0.35
    if shape_class == "tiny":
        b, h, sq, skv, d = 1, 1, 1, 1, rng.choice((8, 16))
        gqa = False
    elif shape_class == "tail":
        b, h = rng.choice((1, 2)), rng.choice((2, 4, 6))
        sq, skv = _tail(rng, (17, 37, 129, 255)), _tail(rng, (17, 37, 129, 255))
        d = rng.choice((16, 32, 40, 64))
    elif shape_class == "wide_row":
        b, h = 1, rng.choice((2, 4))
        sq, skv = rng.choice((1, 16)), (65536 if full else 4099)
        d = rng.choice((32, 64)) if full else 16
    elif shape_class == "many_rows":
        b, h = (64, 8) if full else (16, 4)
        sq = skv = rng.choice((3, 7, 9))
        d = rng.choice((16, 32))
    elif full:
        b, h, sq, d = rng.choice(((4, 16, 1024, 64), (2, 32, 2048, 128), (8, 12, 512, 64)))
        skv = sq
    else:
        b, h, sq, skv, d = 1, 2, 64, 64, 32
    hk = h // rng.choice([x for x in (2, h) if h % x == 0 and x > 1]) if gqa and h > 1 else h
    gqa = hk != h
    causal = rng.choice(("none", "top_left", "bottom_right"))
    if causal == "bottom_right" and sq > skv:
        causal = "top_left"  # bottom-right rows with no key at all are undefined
    mask = layout == "broadcast" or rng.random() < 0.25
    g = _graph("sdpa", dtype)
    q_dims, kv_dims = [b, h, sq, d], [b, hk, skv, d]

    def strides(dims: list[int]) -> list[int] | None:
        if layout == "transposed":
            return _bshd(dims)
        if layout == "strided":
            return _padded(dims, 8)
        return None

    q = g.tensor("Q", q_dims, strides(q_dims))
    k = g.tensor("K", kv_dims, strides(kv_dims))
    v = g.tensor("V", kv_dims, strides(kv_dims))
    attn_mask = None
    mask_kind = "-"
    if mask:
        bool_mask = rng.random() < 0.5
        mask_dims = (
            [1, 1, sq, skv] if layout == "broadcast" or rng.random() < 0.5 else [b, h, sq, skv]
        )
        mask_type = DataType.BOOLEAN if bool_mask else dtype
        attn_mask = g.tensor("MASK", mask_dims, data_type=mask_type)
        mask_kind = f"{'bool' if bool_mask else 'additive'}{mask_dims}"
    scale = 1.0 / math.sqrt(d) if rng.random() < 0.5 else None
    (o,) = g.sdpa(
        q,
        k,
        v,
        attn_mask=attn_mask,
        causal_mask=causal == "top_left",
        causal_mask_bottom_right=causal == "bottom_right",
        attn_scale=scale,
        name="sdpa",
    )
    o.set_name("O").set_output(True)
    if layout == "transposed":
        o.set_strides(_bshd(o.dims))
    return g, (
        f"b{b} h{h} hkv{hk} sq{sq} skv{skv} d{d} causal={causal} mask={mask_kind} "
        f"gqa={gqa} scale={'default' if scale is None else 'explicit'}"
    )


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


_BUILDERS: dict[str, Callable[[random.Random, DataType, str, str, bool], tuple[Graph, str]]] = {
    "conv_fprop": _conv_fprop,
    "conv_dgrad": _conv_dgrad,
    "conv_wgrad": _conv_wgrad,
    "matmul": _matmul,
    "sdpa": _sdpa,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm_training": _batchnorm_training,
    "batchnorm_inference": _batchnorm_inference,
    "batchnorm_backward": _batchnorm_backward,
    "pooling": _pooling,
    "reduction": _reduction,
    "pointwise": _pointwise,
}


# ---- public entry points ------------------------------------------------------------------------
def build_case(
    op: str,
    dtype: str,
    shape_class: str,
    layout: str,
    *,
    seed: int = 0,
    index: int = -1,
    size: str = "small",
) -> ConformanceCase:
    """The case of one cell and layout; the details are drawn from ``(seed, index)``.

    Raises:
        ValueError: an unknown op, dtype, shape class, size, or a layout the op does not have.
    """
    if op not in _BUILDERS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if dtype not in _DTYPE:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if shape_class not in SHAPE_CLASSES:
        raise ValueError(f"unknown shape class {shape_class!r}; known: {', '.join(SHAPE_CLASSES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if layout not in _LAYOUTS[op]:
        raise ValueError(f"{op} has no {layout!r} layout; it has {', '.join(_LAYOUTS[op])}")
    rng = random.Random(f"dnntune-conformance/{seed}/{index}/{op}/{dtype}/{shape_class}/{layout}")
    graph, detail = _BUILDERS[op](rng, _DTYPE[dtype], shape_class, layout, size == "full")
    where = f"c{index:05d}" if index >= 0 else f"s{seed}"
    graph.name = f"{where}_{op}_{dtype}_{layout}_{shape_class}"
    graph.validate()
    return ConformanceCase(
        seed=seed,
        index=index,
        size=size,
        op=op,
        dtype=dtype,
        layout=layout,
        shape_class=shape_class,
        detail=detail,
        graph_json=graph.to_json(),
    )


def cell_of(index: int) -> tuple[str, str, str, str]:
    """(op, dtype, shape class, layout) of case ``index``: every cell within 195 indices."""
    op = OPS[index % len(OPS)]
    j = index // len(OPS)
    dtype = DTYPES[j % len(DTYPES)]
    shape_class = SHAPE_CLASSES[(j // len(DTYPES)) % len(SHAPE_CLASSES)]
    layouts = _LAYOUTS[op]
    layout = layouts[(j // (len(DTYPES) * len(SHAPE_CLASSES))) % len(layouts)]
    return op, dtype, shape_class, layout


def generate_case(seed: int, index: int, size: str = "small") -> ConformanceCase:
    """Case ``index`` of ``seed``: the same graph on every machine and every run."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    op, dtype, shape_class, layout = cell_of(index)
    return build_case(op, dtype, shape_class, layout, seed=seed, index=index, size=size)


def generate_cases(
    seed: int, count: int, size: str = "small", start: int = 0
) -> Iterator[ConformanceCase]:
    """Cases ``start .. start + count - 1`` of ``seed``."""
    for index in range(start, start + count):
        yield generate_case(seed, index, size)
