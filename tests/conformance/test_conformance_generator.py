"""dnntune.testing.conformance: deterministic, valid, and covering every cell it promises."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

import dnntune as dt
from dnntune.graph import OpKind, contiguous_strides
from dnntune.graph.ops.shapes import is_channels_last
from dnntune.testing.conformance import (
    DTYPES,
    LAYOUTS,
    OPS,
    SHAPE_CLASSES,
    build_case,
    cell_of,
    generate_case,
    generate_cases,
    layouts_for,
)

_KIND = {
    "conv_fprop": OpKind.CONV_FPROP,
    "conv_dgrad": OpKind.CONV_DGRAD,
    "conv_wgrad": OpKind.CONV_WGRAD,
    "matmul": OpKind.MATMUL,
    "sdpa": OpKind.SDPA,
    "layernorm": OpKind.LAYERNORM,
    "rmsnorm": OpKind.RMSNORM,
    "batchnorm_training": OpKind.BATCHNORM,
    "batchnorm_inference": OpKind.BATCHNORM_INFERENCE,
    "batchnorm_backward": OpKind.BATCHNORM_BACKWARD,
    "pooling": OpKind.RESAMPLE,
    "reduction": OpKind.REDUCTION,
    "pointwise": OpKind.POINTWISE,
}
_IO = {"fp32": dt.DataType.FLOAT, "fp16": dt.DataType.HALF, "bf16": dt.DataType.BFLOAT16}
CELLS = len(OPS) * len(DTYPES) * len(SHAPE_CLASSES)


def _permuted_or_padded(t: dt.TensorAttributes) -> bool:
    """Not row-major in some dim of size > 1."""
    dense = contiguous_strides(t.dims)
    return any(d > 1 and s != c for d, s, c in zip(t.dims, t.strides, dense, strict=True))


def test_every_op_kind_of_the_ir_is_generated() -> None:
    assert set(_KIND) == set(OPS)
    assert set(_KIND.values()) == set(OpKind)


def test_same_seed_and_index_give_the_same_graph() -> None:
    for index in (0, 7, 200, 1499):
        a, b = generate_case(3, index, "small"), generate_case(3, index, "small")
        assert a == b
    assert generate_case(3, 77).graph_json != generate_case(4, 77).graph_json


@pytest.mark.parametrize("size", ["small", "full"])
def test_1500_cases_validate_and_cover_every_cell_and_layout(size: str) -> None:
    cases = list(generate_cases(seed=0, count=1500, size=size))
    assert [c.index for c in cases] == list(range(1500))
    cells = Counter(c.cell for c in cases[:CELLS])
    assert len(cells) == CELLS  # the first 195 indices hit every (op, dtype, shape class) once
    layouts = {(c.op, c.layout) for c in cases}
    assert layouts == {(op, layout) for op in OPS for layout in layouts_for(op)}
    assert {layout for _, layout in layouts} == set(LAYOUTS)
    for case in cases[:CELLS]:  # round trip through the JSON every tool reads
        graph = dt.Graph.from_json(json.loads(case.graph_json))
        graph.validate()
        assert graph.core_node().kind is _KIND[case.op], case.name
        assert graph.io_data_type is _IO[case.dtype]
        assert graph.output_tensors(), case.name


def test_tags_say_what_the_graph_is() -> None:
    for index in range(0, 1500, 7):
        case = generate_case(1, index)
        graph = case.graph()
        dims = [t.dims for t in graph.tensors if not t.is_virtual]
        numel = max(math.prod(d) for d in dims)
        if case.shape_class == "tiny":
            assert numel <= 16, case.detail  # one element, or one short row
        assert numel < 1 << 22, f"{case.name} is too large for the small size: {dims}"
        rows = case.op in ("layernorm", "rmsnorm", "reduction") and case.layout != "channels_last"
        if case.shape_class == "wide_row" and rows:
            assert any(d[-1] in (65536, 100003) for d in dims), case.detail
        if case.shape_class == "tiny":
            continue  # size-1 dims take any stride: every layout of a 1x1 tensor is the same
        if case.layout == "channels_last":
            assert any(len(t.dims) == 4 and is_channels_last(t) for t in graph.tensors), case.name
        if case.layout in ("transposed", "strided"):
            assert any(_permuted_or_padded(t) for t in graph.tensors), case.name


def test_special_cases_are_there() -> None:
    details = " ".join(c.detail for c in generate_cases(0, 1500))
    for needle in (
        "causal=bottom_right",
        "gqa=True",
        "mask=bool",
        "mask=additive",
        "g3",
        "d(2, 2)",
    ):
        assert needle in details
    for epilogue in ("bias_relu", "bias_gelu", "gelu_tanh", "bias_swish", "residual"):
        assert f"epilogue={epilogue}" in details
    assert "phase=training" in details and "running=True" in details


@pytest.mark.parametrize(
    ("op", "dtype", "shape_class", "layout", "message"),
    [
        ("fft", "fp32", "tiny", "contiguous", "unknown op"),
        ("matmul", "fp64", "tiny", "contiguous", "unknown dtype"),
        ("matmul", "fp32", "huge", "contiguous", "unknown shape class"),
        ("matmul", "fp32", "tiny", "channels_last", "has no 'channels_last' layout"),
    ],
)
def test_bad_arguments_are_refused(
    op: str, dtype: str, shape_class: str, layout: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_case(op, dtype, shape_class, layout)


def test_cell_of_walks_op_then_dtype_then_shape() -> None:
    assert cell_of(0) == ("conv_fprop", "fp32", "tiny", "contiguous")
    assert cell_of(len(OPS)) == ("conv_fprop", "fp16", "tiny", "contiguous")
    assert cell_of(len(OPS) * len(DTYPES))[2] == "tail"
    assert cell_of(CELLS)[3] == layouts_for("conv_fprop")[1]
    with pytest.raises(ValueError):
        generate_case(0, -1)
