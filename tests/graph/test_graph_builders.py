"""Every builder: valid and invalid attributes, and the shapes it infers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune.graph import channels_last_strides, contiguous_strides

F32 = dt.DataType.FLOAT


def graph(io: dt.DataType = F32) -> dt.Graph:
    return dt.Graph(name="g", io_data_type=io, compute_data_type=F32, intermediate_data_type=F32)


def raises(match: str) -> Any:
    """Expect an InvalidValueError whose message contains ``match`` (a regex)."""
    return pytest.raises(dt.InvalidValueError, match=match)


# ---- tensors --------------------------------------------------------------------------------
def test_tensor_defaults_to_row_major_strides() -> None:
    g = graph()
    t = g.tensor("X", [2, 3, 4, 5])
    assert t.strides == [60, 20, 5, 1] == contiguous_strides([2, 3, 4, 5])
    assert channels_last_strides([2, 3, 4, 5]) == [60, 1, 15, 3]
    assert channels_last_strides([2, 3, 4, 5, 6]) == [360, 1, 90, 18, 3]


def test_tensor_like_reads_dims_strides_and_dtype() -> None:
    g = graph()
    src = torch.empty(2, 8, 4, 4, dtype=torch.float16).to(memory_format=torch.channels_last)
    t = g.tensor_like(src, name="X")
    assert (t.dims, t.strides, t.data_type) == ([2, 8, 4, 4], list(src.stride()), dt.DataType.HALF)


def test_tensor_rejects_bad_arguments() -> None:
    g = graph()
    with raises("dims and strides must be sequences of integers"):
        g.tensor("X", ["a", 2])  # type: ignore[list-item]
    with raises("data_type must be a DataType"):
        g.tensor("X", [1], data_type="float")  # type: ignore[arg-type]
    with raises("has no dnntune DataType"):
        g.tensor_like(torch.empty(2, dtype=torch.complex64))


def test_scalar_is_pass_by_value() -> None:
    g = graph()
    s = g.scalar(0.5, name="alpha")
    assert s.is_scalar and s.dims == [1] and s.value == 0.5 and s.data_type is F32


# ---- convolution ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("x", "w", "kwargs", "y"),
    [
        ([2, 16, 10, 10], [32, 16, 3, 3], {"padding": 1}, [2, 32, 10, 10]),
        ([2, 16, 10, 10], [32, 16, 3, 3], {}, [2, 32, 8, 8]),
        ([1, 3, 224, 224], [64, 3, 7, 7], {"padding": 3, "stride": 2}, [1, 64, 112, 112]),
        ([1, 8, 9, 9], [8, 8, 3, 3], {"padding": 2, "dilation": 2}, [1, 8, 9, 9]),
        ([1, 8, 10, 10], [8, 4, 3, 3], {"padding": 1}, [1, 8, 10, 10]),  # 2 groups
        ([1, 8, 10, 10], [8, 1, 3, 3], {"padding": 1, "stride": 2}, [1, 8, 5, 5]),  # depthwise
        ([1, 4, 7, 9], [6, 4, 3, 1], {"pre_padding": [1, 0], "post_padding": [0, 0]}, [1, 6, 6, 9]),
        ([1, 4, 5, 6, 7], [8, 4, 3, 3, 3], {"padding": 1}, [1, 8, 5, 6, 7]),  # 3-D
        ([1, 4, 8, 8], [4, 4, 3, 3], {"padding": [1, 0], "stride": [2, 1]}, [1, 4, 4, 6]),
    ],
)
def test_conv_fprop_output_dims(x: list[int], w: list[int], kwargs: dict, y: list[int]) -> None:
    g = graph()
    out = g.conv_fprop(g.tensor("X", x), g.tensor("W", w), **kwargs)
    assert out.dims == y and out.is_virtual
    assert out.strides == contiguous_strides(y)


def test_conv_fprop_keeps_nhwc_layout() -> None:
    g = graph()
    x = g.tensor("X", [2, 16, 8, 8], channels_last_strides([2, 16, 8, 8]))
    y = g.conv_fprop(x, g.tensor("W", [32, 16, 3, 3]), padding=1, stride=2)
    assert y.dims == [2, 32, 4, 4] and y.strides == channels_last_strides([2, 32, 4, 4])
    z = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    assert z.strides == y.strides  # pointwise output follows its input's layout


def test_conv_fprop_records_parameters() -> None:
    g = graph()
    g.conv_fprop(g.tensor("X", [1, 4, 8, 8]), g.tensor("W", [4, 4, 3, 3]), padding=1, name="c")
    p = g.nodes[0].params
    assert p["conv_mode"] is dt.ConvMode.CROSS_CORRELATION
    assert (p["pre_padding"], p["post_padding"], p["stride"], p["dilation"]) == (
        [1, 1],
        [1, 1],
        [1, 1],
        [1, 1],
    )
    assert g.nodes[0].inferred == {"stride": [1, 1], "dilation": [1, 1]}


@pytest.mark.parametrize(
    ("x", "w", "kwargs", "match"),
    [
        ([1, 6, 8, 8], [4, 4, 3, 3], {}, "w_tensor_uid: input channels 6 are not a multiple of"),
        ([1, 8, 8, 8], [5, 4, 3, 3], {}, "w_tensor_uid: output channels 5 are not a multiple"),
        ([1, 4, 8, 8], [4, 4, 3], {}, "w_tensor_uid: expected rank 4"),
        ([1, 4, 8], [4, 4, 3], {}, "x_tensor_uid: expected rank 4 or 5"),
        ([1, 4, 2, 2], [4, 4, 5, 5], {}, "filter extent 5 is larger than the padded input 2"),
        ([1, 4, 8, 8], [4, 4, 3, 3], {"stride": 0}, "stride: every value must be >= 1"),
        ([1, 4, 8, 8], [4, 4, 3, 3], {"padding": -1}, "pre_padding: every value must be >= 0"),
        ([1, 4, 8, 8], [4, 4, 3, 3], {"dilation": [1, 0]}, "dilation: every value must be >= 1"),
        ([1, 4, 8, 8], [4, 4, 3, 3], {"stride": [1, 1, 1]}, "stride: expected 2 values"),
        ([1, 4, 8, 8], [4, 4, 3, 3], {"stride": True}, "stride: expected an integer"),
        ([1, 4, 8, 8], [4, 4, 0, 3], {}, "has dims \\[4, 4, 0, 3\\]; each must be >= 1"),
    ],
)
def test_conv_fprop_invalid(x: list[int], w: list[int], kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.conv_fprop(g.tensor("X", x), g.tensor("W", w), name="bad_conv", **kwargs)


def test_conv_error_names_node_and_leaves_graph_usable() -> None:
    g = graph()
    x, w = g.tensor("X", [1, 6, 8, 8]), g.tensor("W", [4, 4, 3, 3])
    with pytest.raises(dt.InvalidValueError, match=r"node 'my_conv' \(conv_fprop\)"):
        g.conv_fprop(x, w, name="my_conv")
    assert g.nodes == []  # the rejected node was not added
    y = g.conv_fprop(x, g.tensor("W2", [4, 6, 1, 1]))
    y.set_output(True)
    g.tensors.remove(w)
    g.validate()


def test_conv_dgrad_dims() -> None:
    g = graph()
    dy, w = g.tensor("DY", [2, 32, 8, 8]), g.tensor("W", [32, 16, 3, 3])
    assert g.conv_dgrad(dy, w, padding=1).dims == [2, 16, 8, 8]
    # stride 2: the smallest input is inferred; dx_dims picks another valid one
    dy2 = g.tensor("DY2", [2, 32, 4, 4])
    assert g.conv_dgrad(dy2, w, padding=1, stride=2).dims == [2, 16, 7, 7]
    assert g.conv_dgrad(dy2, w, padding=1, stride=2, dx_dims=[2, 16, 8, 8]).dims == [2, 16, 8, 8]
    # grouped: dx_dims carries the group count
    wg = g.tensor("WG", [32, 4, 3, 3])
    assert g.conv_dgrad(dy, wg, padding=1, dx_dims=[2, 32, 8, 8]).dims == [2, 32, 8, 8]


def test_conv_dgrad_keeps_nhwc_layout() -> None:
    g = graph()
    dy = g.tensor("DY", [1, 8, 6, 6], channels_last_strides([1, 8, 6, 6]))
    dx = g.conv_dgrad(dy, g.tensor("W", [8, 4, 3, 3]), padding=1, dx_dims=[1, 4, 6, 6])
    assert dx.strides == channels_last_strides([1, 4, 6, 6])


@pytest.mark.parametrize(
    ("dy", "w", "kwargs", "match"),
    [
        ([2, 32, 8, 8], [16, 16, 3, 3], {"padding": 1}, "dy_tensor_uid: channels 32 != filter"),
        (
            [2, 32, 8, 8],
            [32, 16, 3, 3],
            {"padding": 1, "dx_dims": [2, 16, 9, 8]},
            "dx_tensor_uid: spatial dim 0 of",
        ),
        (
            [2, 32, 8, 8],
            [32, 16, 3, 3],
            {"padding": 1, "dx_dims": [3, 16, 8, 8]},
            "dx_tensor_uid: batch 3 != dy batch 2",
        ),
        (
            [2, 32, 8, 8],
            [32, 16, 3, 3],
            {"padding": 1, "dx_dims": [2, 16, 8]},
            "dx_tensor_uid: expected rank 4",
        ),
    ],
)
def test_conv_dgrad_invalid(dy: list[int], w: list[int], kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.conv_dgrad(g.tensor("DY", dy), g.tensor("W", w), name="dgrad", **kwargs)


def test_conv_wgrad_dims() -> None:
    g = graph()
    dy, x = g.tensor("DY", [2, 32, 8, 8]), g.tensor("X", [2, 16, 8, 8])
    assert g.conv_wgrad(dy, x, padding=1).dims == [32, 16, 3, 3]
    assert g.conv_wgrad(dy, x, padding=0).dims == [32, 16, 1, 1]
    dy2 = g.tensor("DY2", [2, 32, 4, 4])
    assert g.conv_wgrad(dy2, x, padding=1, stride=2, dw_dims=[32, 16, 3, 3]).dims == [32, 16, 3, 3]
    assert g.conv_wgrad(dy, x, padding=1, dw_dims=[32, 8, 3, 3]).dims == [32, 8, 3, 3]  # 2 groups


@pytest.mark.parametrize(
    ("dy", "x", "kwargs", "match"),
    [
        ([2, 32, 8, 8], [3, 16, 8, 8], {"padding": 1}, "dy_tensor_uid: batch 2 != x batch 3"),
        (
            [2, 32, 8, 8],
            [2, 16, 8, 8],
            {"padding": 1, "dw_dims": [16, 16, 3, 3]},
            "dw_tensor_uid: filter count 16 != dy channels 32",
        ),
        (
            [2, 32, 8, 8],
            [2, 16, 8, 8],
            {"padding": 1, "dw_dims": [32, 16, 5, 5]},
            "dy_tensor_uid: spatial dim 0 is 8",
        ),
        ([2, 32, 8, 8], [2, 16, 4, 4], {}, "dy_tensor_uid: dims .* are too large"),
    ],
)
def test_conv_wgrad_invalid(dy: list[int], x: list[int], kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.conv_wgrad(g.tensor("DY", dy), g.tensor("X", x), name="wgrad", **kwargs)


# ---- matmul ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "c"),
    [
        ([4, 8], [8, 16], [4, 16]),
        ([3, 4, 8], [3, 8, 16], [3, 4, 16]),
        ([3, 4, 8], [1, 8, 16], [3, 4, 16]),  # batch broadcast
        ([2, 1, 4, 8], [1, 5, 8, 16], [2, 5, 4, 16]),
        ([3, 4, 8], [8, 16], [3, 4, 16]),  # lower-rank b broadcasts over the batch
        ([1, 8], [8, 1], [1, 1]),
    ],
)
def test_matmul_dims(a: list[int], b: list[int], c: list[int]) -> None:
    g = graph()
    assert g.matmul(g.tensor("A", a), g.tensor("B", b)).dims == c


def test_matmul_accepts_transposed_strides() -> None:
    g = graph()
    b = g.tensor("B", [8, 16], [1, 8])  # an nn.Linear weight [16, 8] seen as [8, 16]
    c = g.matmul(g.tensor("A", [4, 8]), b)
    c.set_output(True)
    g.validate()


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        ([4, 8], [9, 16], "b_tensor_uid: inner dims differ"),
        ([8], [8, 16], "a_tensor_uid: needs rank >= 2"),
        ([4, 8], [8], "b_tensor_uid: needs rank >= 2"),
        ([3, 4, 8], [2, 8, 16], "b_tensor_uid: shapes .* do not broadcast"),
    ],
)
def test_matmul_invalid(a: list[int], b: list[int], match: str) -> None:
    g = graph()
    with raises(f"node 'mm' \\(matmul\\): {match}"):
        g.matmul(g.tensor("A", a), g.tensor("B", b), name="mm")


# ---- pointwise ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shapes", "out"),
    [
        ([[2, 3, 4]], [2, 3, 4]),
        ([[2, 3, 4], [2, 3, 4]], [2, 3, 4]),
        ([[2, 3, 4], [1, 3, 1]], [2, 3, 4]),
        ([[1, 3, 1], [2, 1, 4]], [2, 3, 4]),
        ([[2, 3, 4], [4]], [2, 3, 4]),
    ],
)
def test_pointwise_broadcast(shapes: list[list[int]], out: list[int]) -> None:
    g = graph()
    ins = [g.tensor(f"I{i}", s) for i, s in enumerate(shapes)]
    mode = dt.PointwiseMode.ADD if len(ins) == 2 else dt.PointwiseMode.EXP
    assert g.pointwise(*ins, mode=mode).dims == out


def test_pointwise_scalar_operand_and_select() -> None:
    g = graph()
    x = g.tensor("X", [2, 3])
    y = g.pointwise(x, 2.0, mode=dt.PointwiseMode.MUL, name="scale")
    assert y.dims == [2, 3]
    scalar = g.nodes[0].inputs["in_1_tensor_uid"]
    assert scalar is not None and scalar.is_scalar and scalar.value == 2.0
    cond = g.pointwise(x, 0.0, mode=dt.PointwiseMode.CMP_GT)
    z = g.pointwise(x, y, cond, mode=dt.PointwiseMode.BINARY_SELECT)
    assert z.dims == [2, 3]


@pytest.mark.parametrize(
    ("n_inputs", "mode", "params", "match"),
    [
        (1, dt.PointwiseMode.ADD, {}, "in_1_tensor_uid: add needs 2 input"),
        (2, dt.PointwiseMode.RELU_FWD, {}, "in_1_tensor_uid: relu_fwd takes 1 input"),
        (2, dt.PointwiseMode.BINARY_SELECT, {}, "in_2_tensor_uid: binary_select needs 3 input"),
        (3, dt.PointwiseMode.MUL, {}, "in_2_tensor_uid: mul takes 2 input"),
        (1, dt.PointwiseMode.GELU_FWD, {"relu_upper_clip": 6.0}, "relu_upper_clip: applies to"),
        (1, dt.PointwiseMode.RELU_FWD, {"swish_beta": 1.0}, "swish_beta: applies to swish_fwd"),
        (1, dt.PointwiseMode.RELU_FWD, {"relu_lower_clip": "x"}, "relu_lower_clip: expected a"),
        (1, dt.PointwiseMode.RELU_FWD, {"nonsense": 1.0}, "unknown parameter 'nonsense'"),
    ],
)
def test_pointwise_invalid(n_inputs: int, mode: dt.PointwiseMode, params: dict, match: str) -> None:
    g = graph()
    ins = [g.tensor(f"I{i}", [2, 3]) for i in range(n_inputs)]
    with raises(match):
        g.pointwise(*ins, mode=mode, name="pw", **params)


def test_pointwise_shapes_that_do_not_broadcast() -> None:
    g = graph()
    with raises("node 'pw' \\(pointwise\\): in_1_tensor_uid: shapes .* do not broadcast"):
        g.pointwise(
            g.tensor("A", [2, 3]), g.tensor("B", [3, 2]), mode=dt.PointwiseMode.SUB, name="pw"
        )
    with raises("node 'in': in_0_tensor_uid: expected a tensor or a number"):
        g.pointwise("x", mode=dt.PointwiseMode.EXP, name="in")  # type: ignore[arg-type]


def test_pointwise_hipdnn_spelling_of_max_and_min() -> None:
    assert dt.PointwiseMode.MAX.json_name == "max_op"
    assert dt.PointwiseMode.from_json_name("min_op") is dt.PointwiseMode.MIN
    assert dt.PointwiseMode.from_json_name("MAX") is dt.PointwiseMode.MAX


# ---- reduction ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("axes", "y"),
    [
        ([1], [2, 1, 4, 5]),
        ([2, 3], [2, 3, 1, 1]),
        ([-1], [2, 3, 4, 1]),
        ([0, 1, 2, 3], [1, 1, 1, 1]),
    ],
)
def test_reduction_axes(axes: list[int], y: list[int]) -> None:
    g = graph()
    out = g.reduction(g.tensor("X", [2, 3, 4, 5]), mode=dt.ReductionMode.ADD, axes=axes)
    assert out.dims == y


def test_reduction_explicit_dims_and_errors() -> None:
    g = graph()
    x = g.tensor("X", [2, 3, 4])
    assert g.reduction(x, mode=dt.ReductionMode.MAX, y_dims=[2, 1, 4]).dims == [2, 1, 4]
    with raises("y_tensor_uid: dims \\[2, 2, 4\\] must equal x's"):
        g.reduction(x, mode=dt.ReductionMode.MAX, y_dims=[2, 2, 4], name="r")
    with raises("y_tensor_uid: dims \\[2, 4\\] must equal x's"):
        g.reduction(x, mode=dt.ReductionMode.MAX, y_dims=[2, 4], name="r")
    with raises("axes \\[3\\] out of range"):
        g.reduction(x, mode=dt.ReductionMode.MAX, axes=[3])
    with raises("pass axes"):
        g.reduction(x, mode=dt.ReductionMode.MAX)
    with raises("node 'reduction_1' \\(reduction\\): mode: unknown ReductionMode 'sum'"):
        g.reduction(x, mode="sum", axes=[0])  # type: ignore[arg-type]


# ---- resample (pooling) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("x", "kwargs", "y"),
    [
        ([1, 64, 112, 112], {"window": 3, "stride": 2, "padding": 1}, [1, 64, 56, 56]),
        ([1, 8, 7, 7], {"window": 7, "stride": 1}, [1, 8, 1, 1]),
        ([1, 8, 8, 8], {"window": 2}, [1, 8, 4, 4]),  # stride defaults to the window
        ([1, 8, 9, 9], {"window": 2}, [1, 8, 4, 4]),  # floor
        ([1, 8, 5, 6], {"window": [3, 2], "stride": [1, 2], "padding": [1, 0]}, [1, 8, 5, 3]),
        ([1, 2, 4, 6, 6], {"window": 2}, [1, 2, 2, 3, 3]),  # 3-D
    ],
)
@pytest.mark.parametrize("mode", list(dt.ResampleMode))
def test_resample_output_dims(
    x: list[int], kwargs: dict, y: list[int], mode: dt.ResampleMode
) -> None:
    g = graph()
    out = g.resample(g.tensor("X", x), mode=mode, **kwargs)
    assert out.dims == y
    expected = "neg_inf_pad" if mode is dt.ResampleMode.MAXPOOL else "zero_pad"
    assert g.nodes[0].params["padding_mode"] == expected


@pytest.mark.parametrize(
    ("x", "kwargs", "match"),
    [
        ([1, 8, 2, 2], {"window": 3}, "window: window \\[3, 3\\] exceeds the padded input"),
        ([1, 8, 8, 8], {"window": 2, "padding": 2}, "pre_padding: padding must be at most half"),
        ([1, 8, 8, 8], {"window": 0}, "window: every value must be >= 1"),
        ([1, 8, 8], {"window": 2}, "x_tensor_uid: expected rank 4 or 5"),
    ],
)
def test_resample_invalid(x: list[int], kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.resample(g.tensor("X", x), mode=dt.ResampleMode.MAXPOOL, name="pool", **kwargs)


# ---- normalisation --------------------------------------------------------------------------
def test_layernorm_stats_dims_and_types() -> None:
    g = graph(dt.DataType.HALF)
    x = g.tensor("X", [4, 16, 32])
    y, mean, inv_var = g.layernorm(
        x,
        g.tensor("S", [1, 16, 32]),
        g.tensor("B", [1, 16, 32]),
        forward_phase=dt.NormFwdPhase.TRAINING,
    )
    assert y.dims == [4, 16, 32]
    assert mean.dims == inv_var.dims == [4, 1, 1]
    assert mean.data_type is inv_var.data_type is F32  # statistics are float32
    assert g.nodes[0].params["normalized_dim_count"] == 2  # inferred from the scale


@pytest.mark.parametrize(
    ("x", "scale", "count"),
    [
        ([4, 16, 32], [1, 1, 32], 1),
        ([2, 8, 4, 4], [1, 8, 4, 4], 3),
        ([2, 8, 4, 4], [1, 8, 1, 1], 3),
        ([2, 8], [1, 8], 1),
        ([2, 8], [1, 1], 1),
    ],
)
def test_norm_dim_count_inferred_from_scale(x: list[int], scale: list[int], count: int) -> None:
    g = graph()
    (y,) = g.rmsnorm(g.tensor("X", x), g.tensor("S", scale))
    assert y.dims == x and g.nodes[0].params["normalized_dim_count"] == count


def test_rmsnorm_training_and_bias() -> None:
    g = graph()
    x = g.tensor("X", [8, 64])
    _, inv_rms = g.rmsnorm(
        x,
        g.tensor("S", [1, 64]),
        1e-6,
        bias=g.tensor("B", [1, 64]),
        forward_phase=dt.NormFwdPhase.TRAINING,
    )
    assert inv_rms.dims == [8, 1] and inv_rms.data_type is F32
    eps = g.nodes[0].inputs["epsilon_tensor_uid"]
    assert eps is not None and eps.is_scalar and eps.value == 1e-6


@pytest.mark.parametrize(
    ("scale", "kwargs", "match"),
    [
        ([1, 16, 33], {}, "scale_tensor_uid: shapes .* do not broadcast"),
        ([16, 32], {}, "scale_tensor_uid: dims \\[16, 32\\] do not broadcast to"),
        ([4, 16, 32], {}, "scale_tensor_uid: dims .* must be 1 in the batch dim"),
        ([1, 16, 32], {"normalized_dim_count": 3}, "normalized_dim_count: must be between 1 and 2"),
        ([1, 16, 32], {"normalized_dim_count": 0}, "normalized_dim_count: must be between"),
    ],
)
def test_layernorm_invalid(scale: list[int], kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.layernorm(
            g.tensor("X", [4, 16, 32]),
            g.tensor("S", scale),
            g.tensor("B", [1, 16, 32]),
            name="ln",
            **kwargs,
        )


def test_norm_epsilon_must_be_one_value() -> None:
    g = graph()
    with raises("epsilon_tensor_uid: must hold one value"):
        g.layernorm(
            g.tensor("X", [4, 8]),
            g.tensor("S", [1, 8]),
            g.tensor("B", [1, 8]),
            g.tensor("EPS", [2]),
        )


def test_batchnorm_training_outputs() -> None:
    g = graph()
    x = g.tensor("X", [4, 8, 5, 5])
    ch = [g.tensor(n, [1, 8, 1, 1]) for n in ("S", "B", "RM", "RV")]
    outs = g.batchnorm(
        x, ch[0], ch[1], prev_running_mean=ch[2], prev_running_variance=ch[3], momentum=0.1
    )
    assert [o.dims for o in outs] == [[4, 8, 5, 5]] + [[1, 8, 1, 1]] * 4
    assert len(g.batchnorm(x, ch[0], ch[1])) == 3


def test_batchnorm_invalid() -> None:
    g = graph()
    x = g.tensor("X", [4, 8, 5, 5])
    s, b = g.tensor("S", [1, 8, 1, 1]), g.tensor("B", [1, 7, 1, 1])
    with raises("bias_tensor_uid: must hold 8 per-channel values"):
        g.batchnorm(x, s, b, name="bn")
    with raises("next_running_mean_tensor_uid: running statistics outputs need"):
        g.batchnorm(x, s, s, prev_running_mean=s, name="bn")
    with raises("x_tensor_uid: expected rank 3 or 4 or 5"):
        g.batchnorm(g.tensor("X2", [4, 8]), s, s, name="bn")


def test_batchnorm_inference_and_backward() -> None:
    g = graph()
    x = g.tensor("X", [2, 8, 3, 3])
    ch = [g.tensor(n, [1, 8, 1, 1]) for n in ("M", "IV", "S", "B")]
    assert g.batchnorm_inference(x, *ch).dims == [2, 8, 3, 3]
    dy = g.tensor("DY", [2, 8, 3, 3])
    dx, dscale, dbias = g.batchnorm_backward(dy, x, ch[0], ch[1], ch[2])
    assert dx.dims == [2, 8, 3, 3] and dscale.dims == dbias.dims == [1, 8, 1, 1]
    with raises("dy_tensor_uid: dims \\[2, 8, 3\\] must equal x's"):
        g.batchnorm_backward(g.tensor("DY2", [2, 8, 3]), x, ch[0], ch[1], ch[2], name="bwd")
    with raises("mean_tensor_uid: must hold 8 per-channel values"):
        g.batchnorm_inference(x, g.tensor("M2", [1, 4, 1, 1]), *ch[1:], name="bn")


# ---- attention ------------------------------------------------------------------------------
def qkv(
    g: dt.Graph, b: int, hq: int, hkv: int, sq: int, skv: int, d: int, dv: int | None = None
) -> tuple[dt.TensorAttributes, dt.TensorAttributes, dt.TensorAttributes]:
    q = g.tensor("Q", [b, hq, sq, d])
    k = g.tensor("K", [b, hkv, skv, d])
    v = g.tensor("V", [b, hkv, skv, dv or d])
    return q, k, v


def test_sdpa_dims_gqa_and_stats() -> None:
    g = graph()
    (o,) = g.sdpa(*qkv(g, 2, 8, 2, 16, 32, 64), causal_mask=True)
    assert o.dims == [2, 8, 16, 64]
    o2, stats = g.sdpa(*qkv(g, 1, 4, 4, 8, 8, 32, dv=16), generate_stats=True)
    assert o2.dims == [1, 4, 8, 16] and stats.dims == [1, 4, 8, 1] and stats.data_type is F32


def test_sdpa_mask_shapes() -> None:
    g = graph()
    q, k, v = qkv(g, 2, 4, 4, 8, 16, 32)
    for dims in ([2, 4, 8, 16], [1, 1, 8, 16], [2, 1, 1, 16]):
        g.sdpa(q, k, v, attn_mask=g.tensor("M", dims, data_type=dt.DataType.BOOLEAN))
    with raises("attn_mask_tensor_uid: shapes .* do not broadcast"):
        g.sdpa(q, k, v, attn_mask=g.tensor("M", [2, 4, 8, 8]), name="attn")
    with raises("attn_mask_tensor_uid: dims \\[8, 16\\] do not broadcast"):
        g.sdpa(q, k, v, attn_mask=g.tensor("M", [8, 16]), name="attn")


@pytest.mark.parametrize(
    ("shape", "kwargs", "match"),
    [
        ((2, 6, 4, 8, 8, 32), {}, "k_tensor_uid: query heads 6 are not a multiple of"),
        (
            (2, 4, 4, 8, 8, 32),
            {"attn_scale": -1.0},
            "attn_scale_value: must be a finite number > 0",
        ),
        (
            (2, 4, 4, 8, 8, 32),
            {"causal_mask": True, "causal_mask_bottom_right": True},
            "causal_mask_bottom_right: causal_mask and causal_mask_bottom_right exclude",
        ),
    ],
)
def test_sdpa_invalid(shape: tuple, kwargs: dict, match: str) -> None:
    g = graph()
    with raises(match):
        g.sdpa(*qkv(g, *shape), name="attn", **kwargs)


def test_sdpa_tensor_mismatches() -> None:
    g = graph()
    q = g.tensor("Q", [2, 4, 8, 32])
    k = g.tensor("K", [2, 4, 8, 16])
    with raises("k_tensor_uid: head dim 16 != q head dim 32"):
        g.sdpa(q, k, g.tensor("V", [2, 4, 8, 16]), name="attn")
    k2 = g.tensor("K2", [1, 4, 8, 32])
    with raises("k_tensor_uid: batch differs"):
        g.sdpa(q, k2, k2, name="attn")
    k3 = g.tensor("K3", [2, 4, 8, 32])
    with raises("v_tensor_uid: dims \\[2, 4, 9, 32\\] do not match k"):
        g.sdpa(q, k3, g.tensor("V3", [2, 4, 9, 32]), name="attn")
    with raises("q_tensor_uid: expected rank 4"):
        g.sdpa(g.tensor("Q4", [2, 4, 8]), k3, k3, name="attn")


def test_has_layout_ignores_size_one_dims() -> None:
    from dnntune.graph.tensor import TensorAttributes

    t = TensorAttributes(dims=[65536, 1], strides=[1, 65536])
    assert t.has_layout(contiguous_strides(t.dims))  # the size-1 dim's stride does not count
    cl = TensorAttributes(dims=[2, 3, 4, 5], strides=channels_last_strides([2, 3, 4, 5]))
    assert cl.has_layout(channels_last_strides(cl.dims))
    assert not cl.has_layout(contiguous_strides(cl.dims))
