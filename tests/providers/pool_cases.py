"""Pooling graphs shared by the pooling tests of TORCH_ENGINE and TRITON_ENGINE (CPU and GPU):
the three pooling graphs of the benchmark suite, small odd shapes, and explicit tolerances."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dnntune as dt
from dnntune.graph.tensor import channels_last_strides, contiguous_strides
from dnntune.reference import Tolerance

M = dt.ResampleMode
F, H, BF = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16

SUITE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "suite"
SUITE = (
    "pool_avg_inception_v3_3x3s1_n32_c768_17x17_nhwc_fp16.json",
    "pool_avg_resnet50_global_7x7_n32_c2048_nhwc_fp16.json",
    "pool_max_resnet50_pool1_3x3s2_n32_c64_112x112_nhwc_fp16.json",
)

#: max pooling picks one of its inputs: exact. Averages: the output type's rounding plus an
#: fp32 accumulation of at most a few hundred terms.
AVG_TOLERANCE = {
    F: Tolerance(rtol=1e-5, atol=1e-5),
    H: Tolerance(rtol=2e-3, atol=2e-3),
    BF: Tolerance(rtol=1e-2, atol=1e-2),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)


def suite_graph(name: str) -> dt.Graph:
    """A pooling graph of the benchmark suite, loaded from its JSON file."""
    g = dt.Graph.from_json((SUITE_DIR / name).read_text())
    g.validate()
    return g


def pool_graph(
    dims: Sequence[int],
    mode: dt.ResampleMode,
    window: Sequence[int],
    stride: Sequence[int] | None = None,
    pre: Sequence[int] | None = None,
    post: Sequence[int] | None = None,
    dtype: dt.DataType = H,
    layout: str = "nhwc",
    y_layout: str | None = None,
    y_dtype: dt.DataType | None = None,
) -> dt.Graph:
    """One pooling node; ``layout`` is ``nhwc`` (channels-last) or ``nchw``, for x and (unless
    ``y_layout`` says otherwise) y; padding defaults to none."""
    rank = len(dims)
    n_sp = rank - 2
    g = dt.Graph(
        name=f"pool_{mode.json_name}_{layout}",
        io_data_type=dtype,
        compute_data_type=F,
        intermediate_data_type=F,
    )

    def strides(d: Sequence[int], kind: str) -> list[int]:
        return channels_last_strides(list(d)) if kind == "nhwc" else contiguous_strides(list(d))

    x = g.tensor("X", list(dims), strides=strides(dims, layout), data_type=dtype)
    y = g.resample(
        x,
        mode=mode,
        window=list(window),
        stride=list(stride) if stride is not None else list(window),
        pre_padding=list(pre) if pre is not None else [0] * n_sp,
        post_padding=list(post) if post is not None else [0] * n_sp,
    )
    y.set_output(True)
    g.validate()
    if y_layout is not None:
        y.set_strides(strides(y.dims, y_layout))
    if y_dtype is not None:
        y.set_data_type(y_dtype)
    g.validate()
    return g


#: (dims, mode, window, stride, pre, post): small shapes with odd channel counts, padding on
#: one or both sides, strides that skip pixels, windows that are not square, global windows
ODD: list[tuple[list[int], dt.ResampleMode, list[int], list[int], list[int], list[int]]] = [
    ([2, 5, 7, 6], M.MAXPOOL, [3, 3], [2, 2], [1, 1], [1, 1]),
    ([2, 5, 7, 6], M.AVGPOOL_INCLUDE_PADDING, [3, 3], [2, 2], [1, 1], [1, 1]),
    ([2, 5, 7, 6], M.AVGPOOL_EXCLUDE_PADDING, [3, 3], [2, 2], [1, 1], [1, 1]),
    ([1, 3, 9, 8], M.MAXPOOL, [3, 2], [2, 1], [1, 0], [0, 1]),
    ([1, 3, 9, 8], M.AVGPOOL_EXCLUDE_PADDING, [3, 2], [2, 1], [1, 0], [0, 1]),
    ([1, 3, 9, 8], M.AVGPOOL_INCLUDE_PADDING, [3, 2], [2, 1], [1, 0], [0, 1]),
    ([3, 33, 5, 5], M.AVGPOOL_INCLUDE_PADDING, [5, 5], [1, 1], [0, 0], [0, 0]),
    ([3, 33, 5, 5], M.MAXPOOL, [5, 5], [5, 5], [0, 0], [0, 0]),
    ([2, 17, 4, 6], M.AVGPOOL_EXCLUDE_PADDING, [4, 6], [4, 6], [0, 0], [0, 0]),
    ([1, 4, 10, 10], M.AVGPOOL_EXCLUDE_PADDING, [9, 9], [1, 1], [4, 4], [4, 4]),
    ([2, 1, 6, 6], M.MAXPOOL, [2, 2], [2, 2], [0, 0], [0, 0]),
    ([1, 300, 3, 3], M.AVGPOOL_INCLUDE_PADDING, [2, 2], [1, 1], [0, 0], [0, 0]),
]


def odd_graph(index: int, dtype: dt.DataType = H, layout: str = "nhwc") -> dt.Graph:
    dims, mode, window, stride, pre, post = ODD[index]
    return pool_graph(dims, mode, window, stride, pre, post, dtype=dtype, layout=layout)


def odd_id(index: int) -> str:
    dims, mode, window, stride, pre, post = ODD[index]
    shape = "x".join(map(str, dims))
    return f"{mode.json_name}-{shape}-w{window}-s{stride}-p{pre}{post}".replace(" ", "")


def pool_tolerance(graph: dt.Graph) -> Tolerance:
    """The explicit tolerance of a pooling graph's output."""
    (node,) = graph.nodes
    x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x is not None and y is not None and y.data_type is not None
    assert x.data_type is not None
    if node.params["mode"] is M.MAXPOOL and y.data_type in (x.data_type, F):
        return EXACT
    # an engine may pool in the input's type and widen the result afterwards, as eager does
    return AVG_TOLERANCE[y.data_type].loosest(AVG_TOLERANCE[x.data_type])
