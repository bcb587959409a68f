"""Matmul, pointwise, reduction and resample (pooling) operations.

JSON layouts follow hipDNN's serializers: pointwise parameters sit inside ``inputs`` (all keys
present, ``null`` when unset); reduction and resample write everything on the node object
(reduction names its tensors ``in_tensor_uid``/``out_tensor_uid``).
"""

from __future__ import annotations

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind, broadcast_dims, node_error, require
from dnntune.graph.ops.shapes import check_rank, fill_output, spatial_list
from dnntune.graph.types import PointwiseMode, ReductionMode, ResampleMode

__all__ = ["MATMUL", "PADDING_MODES", "POINTWISE", "REDUCTION", "RESAMPLE"]

#: hipDNN's resample padding modes
PADDING_MODES = ("padding_not_set", "neg_inf_pad", "zero_pad")

# Which activation parameters belong to which pointwise mode.
_MODE_PARAMS = {
    "relu_lower_clip": PointwiseMode.RELU_FWD,
    "relu_upper_clip": PointwiseMode.RELU_FWD,
    "relu_lower_clip_slope": PointwiseMode.RELU_FWD,
    "swish_beta": PointwiseMode.SWISH_FWD,
    "elu_alpha": PointwiseMode.ELU_FWD,
    "softplus_beta": PointwiseMode.SOFTPLUS_FWD,
}


def _check_matmul(node: Node) -> None:
    a, b = require(node, "a_tensor_uid"), require(node, "b_tensor_uid")
    if len(a.dims) < 2:
        raise node_error(node, "a_tensor_uid", f"needs rank >= 2, got dims {a.dims}")
    if len(b.dims) < 2:
        raise node_error(node, "b_tensor_uid", f"needs rank >= 2, got dims {b.dims}")
    if a.dims[-1] != b.dims[-2]:
        raise node_error(
            node,
            "b_tensor_uid",
            f"inner dims differ: a {a.dims} has K={a.dims[-1]}, b {b.dims} has K={b.dims[-2]}",
        )
    batch = broadcast_dims(node, "b_tensor_uid", a.dims[:-2], b.dims[:-2])
    fill_output(node, "c_tensor_uid", [*batch, a.dims[-2], b.dims[-1]])


def _check_pointwise(node: Node) -> None:
    mode = node.params.get("operation")
    if not isinstance(mode, PointwiseMode):
        raise node_error(node, "operation", "a pointwise operation is required")
    for name, owner in _MODE_PARAMS.items():
        if node.params.get(name) is not None and mode is not owner:
            raise node_error(node, name, f"applies to {owner.json_name} only, not {mode.json_name}")
    fields = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")[: mode.arity]
    for extra in ("in_1_tensor_uid", "in_2_tensor_uid")[mode.arity - 1 :]:
        if node.inputs.get(extra) is not None:
            raise node_error(node, extra, f"{mode.json_name} takes {mode.arity} input(s)")
    shapes = []
    for f in fields:
        t = node.inputs.get(f)
        if t is None:
            raise node_error(node, f, f"{mode.json_name} needs {mode.arity} input(s)")
        shapes.append(t.dims)
    dims = broadcast_dims(node, fields[-1], *shapes)
    like = max((node.inputs[f] for f in fields), key=lambda t: t.numel if t else 0)
    fill_output(node, "out_0_tensor_uid", dims, like=like)


def _check_reduction(node: Node) -> None:
    x = require(node, "x_tensor_uid")
    y = require(node, "y_tensor_uid")
    if not isinstance(node.params.get("mode"), ReductionMode):
        raise node_error(node, "mode", "a reduction mode is required")
    if not y.dims:
        raise node_error(
            node, "y_tensor_uid", "output dims must be set (x's dims with 1 in each reduced dim)"
        )
    if len(y.dims) != len(x.dims) or any(
        yd not in (xd, 1) for xd, yd in zip(x.dims, y.dims, strict=True)
    ):
        raise node_error(
            node, "y_tensor_uid", f"dims {y.dims} must equal x's {x.dims} or be 1 in each dim"
        )
    fill_output(node, "y_tensor_uid", y.dims)


def _check_resample(node: Node) -> None:
    x = require(node, "x_tensor_uid")
    check_rank(node, "x_tensor_uid", x, (4, 5))
    mode = node.params.get("mode")
    if not isinstance(mode, ResampleMode):
        raise node_error(node, "mode", "a resample mode is required")
    if node.params.get("generate_index"):
        raise node_error(node, "generate_index", "pooling indices are not supported")
    padding_mode = node.params.get("padding_mode")
    if padding_mode is not None and padding_mode.lower() not in PADDING_MODES:
        raise node_error(
            node, "padding_mode", f"{padding_mode!r} is not one of {', '.join(PADDING_MODES)}"
        )
    n_sp = len(x.dims) - 2
    window = spatial_list(node, "window", n_sp, 1, 1)
    pre = spatial_list(node, "pre_padding", n_sp, 0, 0)
    post = spatial_list(node, "post_padding", n_sp, 0, 0)
    stride = spatial_list(node, "stride", n_sp, 1, 1)
    padded = any(pre) or any(post)
    if mode is ResampleMode.MAXPOOL and padded and (padding_mode or "").lower() == "zero_pad":
        raise node_error(
            node, "padding_mode", "max pooling pads with -inf (neg_inf_pad), not zero_pad"
        )
    out = []
    for i in range(n_sp):
        if pre[i] * 2 > window[i] or post[i] * 2 > window[i]:
            raise node_error(
                node, "pre_padding", f"padding must be at most half the window {window}"
            )
        span = x.dims[2 + i] + pre[i] + post[i] - window[i]
        if span < 0:
            raise node_error(node, "window", f"window {window} exceeds the padded input")
        out.append(span // stride[i] + 1)
    fill_output(node, "y_tensor_uid", [x.dims[0], x.dims[1], *out], like=x)


MATMUL = OpSpec(
    kind=OpKind.MATMUL,
    json_type="MatmulAttributes",
    builder_name="matmul",
    inputs=("a_tensor_uid", "b_tensor_uid"),
    outputs=("c_tensor_uid",),
    priority=50,
    check=_check_matmul,
    float_fields=("a_tensor_uid", "b_tensor_uid", "c_tensor_uid"),
)


def _pw_param(name: str) -> Param:
    return Param(name, ParamKind.FLOAT, section="inputs", json_required=True)


POINTWISE = OpSpec(
    kind=OpKind.POINTWISE,
    json_type="PointwiseAttributes",
    builder_name="pointwise",
    inputs=("in_0_tensor_uid",),
    optional_inputs=("in_1_tensor_uid", "in_2_tensor_uid"),
    outputs=("out_0_tensor_uid",),
    params=(
        Param(
            "operation",
            ParamKind.ENUM,
            None,
            PointwiseMode,
            required=True,
            criterion="pointwise_mode",
            section="inputs",
            json_required=True,
        ),
        *(_pw_param(name) for name in _MODE_PARAMS),
    ),
    priority=10,
    check=_check_pointwise,
    json_constants={"inputs.axis_tensor_uid": None},
    null_fields=("in_1_tensor_uid", "in_2_tensor_uid"),
)
REDUCTION = OpSpec(
    kind=OpKind.REDUCTION,
    json_type="ReductionAttributes",
    builder_name="reduction",
    inputs=("x_tensor_uid",),
    outputs=("y_tensor_uid",),
    params=(
        Param(
            "mode",
            ParamKind.ENUM,
            None,
            ReductionMode,
            required=True,
            criterion="reduction_mode",
            section="",
            json_required=True,
        ),
        Param("is_deterministic", ParamKind.BOOL, section="", in_key=False),
    ),
    priority=20,
    check=_check_reduction,
    flat_io=True,
    json_fields={"x_tensor_uid": "in_tensor_uid", "y_tensor_uid": "out_tensor_uid"},
)
RESAMPLE = OpSpec(
    kind=OpKind.RESAMPLE,
    json_type="ResampleFwdAttributes",
    builder_name="resample",
    inputs=("x_tensor_uid",),
    outputs=("y_tensor_uid",),
    params=(
        Param("pre_padding", ParamKind.INT_LIST, section="", json_required=True),
        Param("post_padding", ParamKind.INT_LIST, section="", json_required=True),
        Param("stride", ParamKind.INT_LIST, section="", json_required=True),
        Param("window", ParamKind.INT_LIST, section="", json_required=True),
        Param(
            "mode",
            ParamKind.ENUM,
            None,
            ResampleMode,
            required=True,
            criterion="resample_mode",
            json_name="resample_mode",
            section="",
            json_required=True,
        ),
        Param("padding_mode", ParamKind.STR, section="", json_required=True),
        Param("generate_index", ParamKind.BOOL, section=""),
    ),
    priority=20,
    check=_check_resample,
    flat_io=True,
)
