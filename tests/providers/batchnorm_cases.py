"""Batch-norm inference graphs shared by the TRITON_ENGINE batch-norm tests (CPU and GPU): the
two batch-norm graphs of the benchmark suite, small odd shapes, epilogues, and explicit
tolerances."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dnntune as dt
from dnntune.graph.tensor import channels_last_strides, contiguous_strides
from dnntune.reference import Tolerance

P = dt.PointwiseMode
F, H, BF = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16

SUITE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "suite"
SUITE = (
    "batchnorm_inference_resnet50_bn_conv1_n32_c64_112x112_nhwc_fp16.json",
    "batchnorm_inference_resnet50_res3_n32_c512_28x28_nhwc_fp16.json",
)

#: the output type's rounding of a value computed in fp32 (a subtraction and an FMA, plus the
#: epilogue's few ops): half an ulp of the output type and a little more
TOLERANCE = {
    F: Tolerance(rtol=1e-5, atol=1e-5),
    H: Tolerance(rtol=2e-3, atol=2e-3),
    BF: Tolerance(rtol=1e-2, atol=1e-2),
}

#: (dims, io dtype): odd channel counts (1, 3, 37, 300), pixel counts no block divides,
#: 3-D and 5-D tensors
ODD: list[list[int]] = [
    [2, 1, 3, 5],
    [3, 3, 5, 7],
    [2, 37, 4, 3],
    [2, 300, 3, 3],
    [1, 300, 5, 1],
    [2, 8, 7],
    [2, 8, 3, 2, 3],
    [1, 64, 1, 1],
]


def suite_graph(name: str, dtype: dt.DataType = H) -> dt.Graph:
    """A batch-norm graph of the benchmark suite (its x and y in ``dtype``; stats stay fp32)."""
    g = dt.Graph.from_json((SUITE_DIR / name).read_text())
    if dtype is not H:
        for t in g.tensors:
            if t.data_type is H:
                t.set_data_type(dtype)
    g.validate()
    return g


def _strides(dims: Sequence[int], layout: str) -> list[int]:
    d = list(dims)
    return channels_last_strides(d) if layout == "nhwc" else contiguous_strides(d)


def bn_graph(
    dims: Sequence[int],
    dtype: dt.DataType = H,
    epilogue: Sequence[str] = (),
    layout: str = "nhwc",
    y_layout: str | None = None,
    y_dtype: dt.DataType | None = None,
    stat_dtype: dt.DataType = F,
    keep_y: bool = False,
) -> dt.Graph:
    """One batchnorm_inference node, then the ``epilogue``: relu, res (add a full tensor),
    chan (times a per-channel tensor), pix (minus a per-pixel tensor), one (max with a
    one-element tensor), scale (times 0.5); ``keep_y`` stores the batch norm's output as
    well."""
    g = dt.Graph(
        name=f"bn_{layout}_{'_'.join(epilogue) or 'plain'}",
        io_data_type=dtype,
        compute_data_type=F,
        intermediate_data_type=F,
    )
    x = g.tensor("X", list(dims), strides=_strides(dims, layout), data_type=dtype)
    per = [1, dims[1], *([1] * (len(dims) - 2))]
    stats = [g.tensor(n, per, data_type=stat_dtype) for n in ("MEAN", "INV_VAR", "SCALE", "BIAS")]
    y = g.batchnorm_inference(x, *stats)
    bn_out = y
    for step in epilogue:
        if step == "relu":
            y = g.pointwise(y, mode=P.RELU_FWD)
        elif step == "res":
            r = g.tensor("RES", list(dims), strides=_strides(dims, "nhwc"), data_type=dtype)
            y = g.pointwise(y, r, mode=P.ADD)
        elif step == "chan":
            y = g.pointwise(y, g.tensor("CHAN", per, data_type=dtype), mode=P.MUL)
        elif step == "pix":
            pix = [dims[0], 1, *dims[2:]]
            t = g.tensor("PIX", pix, strides=_strides(pix, "nhwc"), data_type=dtype)
            y = g.pointwise(y, t, mode=P.SUB)
        elif step == "one":
            y = g.pointwise(y, g.tensor("ONE", [1] * len(dims), data_type=F), mode=P.MAX)
        elif step == "scale":
            y = g.pointwise(y, 0.5, mode=P.MUL)
        else:
            raise ValueError(step)
    y.set_output(True)
    if keep_y and bn_out is not y:
        bn_out.set_output(True)
    g.validate()
    if y_layout is not None:
        y.set_strides(_strides(y.dims, y_layout))
    if y_dtype is not None:
        y.set_data_type(y_dtype)
    g.validate()
    return g


def odd_id(dims: Sequence[int]) -> str:
    return "x".join(map(str, dims))


def bn_tolerance(tensor: dt.TensorAttributes) -> Tolerance:
    """The explicit tolerance of one output: its type's rounding (the kernel computes in fp32
    from the same rounded inputs as the reference)."""
    assert tensor.data_type is not None
    return TOLERANCE[tensor.data_type]
