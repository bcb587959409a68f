"""Scaled dot-product attention, forward (causal, scale, optional mask, grouped-query heads)."""

from __future__ import annotations

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind, broadcast_dims, node_error, require
from dnntune.graph.ops.shapes import check_rank, fill_output
from dnntune.graph.types import DataType

__all__ = ["SDPA"]


def _check_sdpa(node: Node) -> None:
    q, k, v = (require(node, f"{n}_tensor_uid") for n in "qkv")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(node, f"{name}_tensor_uid", t, (4,))
    b, h, sq, d = q.dims
    bk, hk, skv, dk = k.dims
    if bk != b or v.dims[0] != b:
        raise node_error(node, "k_tensor_uid", f"batch differs: q {q.dims}, k {k.dims}, v {v.dims}")
    if dk != d:
        raise node_error(node, "k_tensor_uid", f"head dim {dk} != q head dim {d}")
    if v.dims[1] != hk or v.dims[2] != skv:
        raise node_error(node, "v_tensor_uid", f"dims {v.dims} do not match k {k.dims}")
    if hk <= 0 or h % hk != 0:
        raise node_error(
            node, "k_tensor_uid", f"query heads {h} are not a multiple of key/value heads {hk}"
        )
    dropout = node.params.get("dropout_probability")
    if dropout not in (None, 0.0):
        raise node_error(node, "attributes.dropout_probability", "dropout is not supported")
    scale = node.params.get("attn_scale_value")
    if scale is not None and scale <= 0:
        raise node_error(node, "attributes.attn_scale_value", f"must be > 0, got {scale}")
    mask = node.inputs.get("attn_mask_tensor_uid")
    if mask is not None:
        if len(mask.dims) != 4 or broadcast_dims(node, "attn_mask_tensor_uid", mask.dims,
                                                 [b, h, sq, skv]) != [b, h, sq, skv]:
            raise node_error(
                node, "attn_mask_tensor_uid", f"dims {mask.dims} do not broadcast to {[b, h, sq, skv]}"
            )
    fill_output(node, "o_tensor_uid", [b, h, sq, v.dims[3]])
    stats = node.outputs.get("stats_tensor_uid")
    if node.params.get("generate_stats") and stats is None:
        raise node_error(node, "stats_tensor_uid", "generate_stats is set but no stats output given")
    if stats is not None:
        node.params["generate_stats"] = True
        fill_output(node, "stats_tensor_uid", [b, h, sq, 1])
        if stats.data_type is None:
            stats.data_type = DataType.FLOAT


SDPA = OpSpec(
    kind=OpKind.SDPA,
    json_type="SdpaAttributes",
    builder_name="sdpa",
    inputs=("q_tensor_uid", "k_tensor_uid", "v_tensor_uid"),
    optional_inputs=("attn_mask_tensor_uid",),
    outputs=("o_tensor_uid",),
    optional_outputs=("stats_tensor_uid",),
    params=(
        Param("causal_mask", ParamKind.BOOL, False),
        Param("causal_mask_bottom_right", ParamKind.BOOL, False),
        Param("attn_scale_value", ParamKind.FLOAT),
        Param("generate_stats", ParamKind.BOOL, False),
        Param("dropout_probability", ParamKind.FLOAT),
        Param("diagonal_alignment", ParamKind.STR),
        Param("implementation", ParamKind.STR),
        Param("mma_core_mode", ParamKind.STR),
    ),
    params_key="attributes",
    priority=60,
    check=_check_sdpa,
)
