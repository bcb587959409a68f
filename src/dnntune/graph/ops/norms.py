"""Layer norm, RMS norm and the three batch-norm nodes."""

from __future__ import annotations

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind, broadcast_dims, node_error, require
from dnntune.graph.ops.shapes import check_rank, fill_output, set_stats_type
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import NormFwdPhase

__all__ = ["BATCHNORM", "BATCHNORM_BACKWARD", "BATCHNORM_INFERENCE", "LAYERNORM", "RMSNORM"]


def _check_scalar(node: Node, field_name: str) -> None:
    t = node.inputs.get(field_name)
    if t is not None and t.numel != 1:
        raise node_error(node, field_name, f"must hold one value, got dims {t.dims}")


def _check_broadcastable(node: Node, field_name: str, to: list[int]) -> None:
    t = node.inputs.get(field_name)
    if t is None:
        return
    if len(t.dims) != len(to) or broadcast_dims(node, field_name, t.dims, to) != to:
        raise node_error(node, field_name, f"dims {t.dims} do not broadcast to {to}")


def _normalized_count(node: Node, x: TensorAttributes) -> int:
    """How many trailing dims are normalized; inferred from the scale's dims when unset.

    The scale covers exactly the normalized dims (leading dims of size 1), so ``x`` [B, S, H]
    with scale [1, 1, H] normalizes over H, and [N, C, H, W] with scale [1, C, H, W] over C, H
    and W (cuDNN's convention: every dim but the batch).
    """
    count = node.params.get("normalized_dim_count")
    if count is None:
        scale = node.inputs.get("scale_tensor_uid")
        count = len(x.dims) - 1
        if scale is not None and len(scale.dims) == len(x.dims) and scale.numel > 1:
            leading = next(i for i, d in enumerate(scale.dims) if d != 1)
            count = len(x.dims) - leading
            if leading == 0:
                raise node_error(
                    node,
                    "scale_tensor_uid",
                    f"dims {scale.dims} must be 1 in the batch dim (x dims {x.dims})",
                )
        node.infer("normalized_dim_count", count)
    if not 1 <= count <= len(x.dims) - 1:
        raise node_error(
            node,
            "normalized_dim_count",
            f"must be between 1 and {len(x.dims) - 1} for x dims {x.dims}, got {count}",
        )
    return int(count)


def _phase(node: Node) -> NormFwdPhase:
    phase = node.params.get("forward_phase")
    if not isinstance(phase, NormFwdPhase):
        phase = node.infer("forward_phase", NormFwdPhase.INFERENCE)
    return phase


def _stats_dims(x: TensorAttributes, count: int) -> list[int]:
    return [*x.dims[: len(x.dims) - count], *([1] * count)]


def _check_norm(node: Node, stat_fields: tuple[str, ...]) -> None:
    x = require(node, "x_tensor_uid")
    if len(x.dims) < 2:
        raise node_error(node, "x_tensor_uid", f"needs rank >= 2, got dims {x.dims}")
    count = _normalized_count(node, x)
    norm_shape = [*([1] * (len(x.dims) - count)), *x.dims[len(x.dims) - count :]]
    require(node, "scale_tensor_uid")
    for f in ("scale_tensor_uid", "bias_tensor_uid"):
        _check_broadcastable(node, f, norm_shape)
    require(node, "epsilon_tensor_uid")
    _check_scalar(node, "epsilon_tensor_uid")
    phase = _phase(node)
    fill_output(node, "y_tensor_uid", x.dims, like=x)
    for f in stat_fields:
        present = node.outputs.get(f) is not None
        if phase is NormFwdPhase.TRAINING and not present:
            raise node_error(node, f, "training phase needs this statistics output")
        if phase is NormFwdPhase.INFERENCE and present:
            raise node_error(node, f, "inference phase has no statistics output")
        fill_output(node, f, _stats_dims(x, count))
        set_stats_type(node, f)


def _channel_dims(x: TensorAttributes) -> list[int]:
    return [1, x.dims[1], *([1] * (len(x.dims) - 2))]


def _check_bn_common(node: Node, fields: tuple[str, ...]) -> TensorAttributes:
    x = require(node, "x_tensor_uid")
    check_rank(node, "x_tensor_uid", x, (3, 4, 5))
    for f in fields:
        t = node.inputs.get(f)
        if t is not None and t.numel != x.dims[1]:
            raise node_error(
                node, f, f"must hold {x.dims[1]} per-channel values, got dims {t.dims}"
            )
    return x


def _check_batchnorm(node: Node) -> None:
    x = _check_bn_common(
        node,
        (
            "scale_tensor_uid",
            "bias_tensor_uid",
            "prev_running_mean_tensor_uid",
            "prev_running_variance_tensor_uid",
        ),
    )
    require(node, "scale_tensor_uid")
    require(node, "bias_tensor_uid")
    require(node, "epsilon_tensor_uid")
    _check_scalar(node, "epsilon_tensor_uid")
    _check_scalar(node, "momentum_tensor_uid")
    running_in = [
        node.inputs.get(f) is not None
        for f in (
            "prev_running_mean_tensor_uid",
            "prev_running_variance_tensor_uid",
            "momentum_tensor_uid",
        )
    ]
    running_out = [
        node.outputs.get(f) is not None
        for f in ("next_running_mean_tensor_uid", "next_running_variance_tensor_uid")
    ]
    if any(running_out) and not all(running_in):
        raise node_error(
            node,
            "next_running_mean_tensor_uid",
            "running statistics outputs need prev_running_mean, prev_running_variance and momentum",
        )
    fill_output(node, "y_tensor_uid", x.dims, like=x)
    for f in (
        "mean_tensor_uid",
        "inv_variance_tensor_uid",
        "next_running_mean_tensor_uid",
        "next_running_variance_tensor_uid",
    ):
        fill_output(node, f, _channel_dims(x))
        set_stats_type(node, f)


def _check_bn_inference(node: Node) -> None:
    fields = ("mean_tensor_uid", "inv_variance_tensor_uid", "scale_tensor_uid", "bias_tensor_uid")
    x = _check_bn_common(node, fields)
    for f in fields:
        require(node, f)
    fill_output(node, "y_tensor_uid", x.dims, like=x)


def _check_bn_backward(node: Node) -> None:
    fields = ("mean_tensor_uid", "inv_variance_tensor_uid", "scale_tensor_uid")
    x = _check_bn_common(node, fields)
    for f in (*fields, "dy_tensor_uid"):
        require(node, f)
    dy = require(node, "dy_tensor_uid")
    if dy.dims != x.dims:
        raise node_error(node, "dy_tensor_uid", f"dims {dy.dims} must equal x's {x.dims}")
    fill_output(node, "dx_tensor_uid", x.dims, like=x)
    fill_output(node, "dscale_tensor_uid", _channel_dims(x))
    fill_output(node, "dbias_tensor_uid", _channel_dims(x))


_NORM_FLOATS = (
    "x_tensor_uid",
    "scale_tensor_uid",
    "bias_tensor_uid",
    "epsilon_tensor_uid",
    "y_tensor_uid",
)
_BN_FLOATS = (
    "x_tensor_uid",
    "dy_tensor_uid",
    "mean_tensor_uid",
    "inv_variance_tensor_uid",
    "scale_tensor_uid",
    "bias_tensor_uid",
    "y_tensor_uid",
    "dx_tensor_uid",
    "dscale_tensor_uid",
    "dbias_tensor_uid",
    "epsilon_tensor_uid",
)

LAYERNORM = OpSpec(
    kind=OpKind.LAYERNORM,
    json_type="LayernormAttributes",
    builder_name="layernorm",
    inputs=("x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid", "epsilon_tensor_uid"),
    outputs=("y_tensor_uid",),
    optional_outputs=("mean_tensor_uid", "inv_variance_tensor_uid"),
    # hipDNN writes both on the node object; the phase as its integer value.
    params=(
        Param(
            "forward_phase",
            ParamKind.ENUM,
            NormFwdPhase.INFERENCE,
            NormFwdPhase,
            criterion="norm_fwd_phase",
            section="",
            json_required=True,
            enum_style="int",
        ),
        Param("normalized_dim_count", ParamKind.INT, section="", json_required=True),
    ),
    priority=30,
    check=lambda node: _check_norm(node, ("mean_tensor_uid", "inv_variance_tensor_uid")),
    null_fields=("mean_tensor_uid", "inv_variance_tensor_uid"),
    float_fields=_NORM_FLOATS,
)
RMSNORM = OpSpec(
    kind=OpKind.RMSNORM,
    json_type="RMSNormAttributes",
    builder_name="rmsnorm",
    inputs=("x_tensor_uid", "scale_tensor_uid", "epsilon_tensor_uid"),
    optional_inputs=("bias_tensor_uid",),
    outputs=("y_tensor_uid",),
    optional_outputs=("inv_rms_tensor_uid",),
    # hipDNN writes the phase by name on the node object and has no normalized_dim_count
    # (dnntune writes it only when the caller set it).
    params=(
        Param(
            "forward_phase",
            ParamKind.ENUM,
            NormFwdPhase.INFERENCE,
            NormFwdPhase,
            criterion="norm_fwd_phase",
            section="",
            enum_style="upper",
        ),
        Param("normalized_dim_count", ParamKind.INT, section=""),
    ),
    priority=30,
    check=lambda node: _check_norm(node, ("inv_rms_tensor_uid",)),
    float_fields=_NORM_FLOATS,
)
BATCHNORM = OpSpec(
    kind=OpKind.BATCHNORM,
    json_type="BatchnormAttributes",
    builder_name="batchnorm",
    inputs=("x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid", "epsilon_tensor_uid"),
    optional_inputs=(
        "prev_running_mean_tensor_uid",
        "prev_running_variance_tensor_uid",
        "momentum_tensor_uid",
    ),
    outputs=("y_tensor_uid",),
    optional_outputs=(
        "mean_tensor_uid",
        "inv_variance_tensor_uid",
        "next_running_mean_tensor_uid",
        "next_running_variance_tensor_uid",
    ),
    priority=40,
    check=_check_batchnorm,
    json_constants={"inputs.peer_stats_tensor_uid": []},
    null_fields=(
        "prev_running_mean_tensor_uid",
        "prev_running_variance_tensor_uid",
        "momentum_tensor_uid",
        "mean_tensor_uid",
        "inv_variance_tensor_uid",
        "next_running_mean_tensor_uid",
        "next_running_variance_tensor_uid",
    ),
    float_fields=_BN_FLOATS,
)
BATCHNORM_INFERENCE = OpSpec(
    kind=OpKind.BATCHNORM_INFERENCE,
    json_type="BatchnormInferenceAttributes",
    builder_name="batchnorm_inference",
    inputs=(
        "x_tensor_uid",
        "mean_tensor_uid",
        "inv_variance_tensor_uid",
        "scale_tensor_uid",
        "bias_tensor_uid",
    ),
    outputs=("y_tensor_uid",),
    priority=40,
    check=_check_bn_inference,
    float_fields=_BN_FLOATS,
)
BATCHNORM_BACKWARD = OpSpec(
    kind=OpKind.BATCHNORM_BACKWARD,
    json_type="BatchnormBackwardAttributes",
    builder_name="batchnorm_backward",
    inputs=(
        "dy_tensor_uid",
        "x_tensor_uid",
        "mean_tensor_uid",
        "inv_variance_tensor_uid",
        "scale_tensor_uid",
    ),
    outputs=("dx_tensor_uid", "dscale_tensor_uid", "dbias_tensor_uid"),
    priority=40,
    check=_check_bn_backward,
    json_constants={"inputs.peer_stats_tensor_uid": []},
    float_fields=_BN_FLOATS,
)
