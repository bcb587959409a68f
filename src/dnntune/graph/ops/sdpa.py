"""Scaled dot-product attention, forward (causal, scale, optional mask, grouped-query heads).

The JSON layout is hipDNN's: every optional tensor key present (``null`` when unset) and the
behaviour under ``attributes``. hipDNN files often express a causal mask as a diagonal band
(``right_bound`` 0, ``left_bound`` -1 or null) instead of ``causal_mask``; validation turns such
a band into the matching causal flag so that engines need to read only the flags.
"""

from __future__ import annotations

import math
from typing import Any

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind, broadcast_dims, node_error, require
from dnntune.graph.ops.shapes import check_rank, fill_output, set_stats_type
from dnntune.graph.types import DataType, _JsonEnum

__all__ = ["SDPA", "DiagonalAlignment", "causal_flags"]


class DiagonalAlignment(_JsonEnum):
    """Where the diagonal of a causal band starts; hipDNN writes these in upper case."""

    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


_UNBOUNDED = (None, -1)


def causal_flags(node: Node) -> tuple[bool, bool]:
    """(top-left causal, bottom-right causal): what every engine and the reference compute.

    Top-left keeps key j for query i when j <= i; bottom-right aligns the diagonal with the last
    key, keeping j <= i + (Skv - Sq). ``causal_mask`` with ``diagonal_alignment`` BOTTOM_RIGHT
    means bottom-right (validation turns hipDNN's ``right_bound`` 0 bands into these flags).
    Bottom-right with Sq > Skv leaves the first Sq - Skv rows no key: their output is 0 and
    their stats -inf (see :meth:`dnntune.Graph.sdpa`).
    """
    causal = bool(node.params.get("causal_mask"))
    bottom_right = bool(node.params.get("causal_mask_bottom_right"))
    alignment = node.params.get("diagonal_alignment")
    if causal and str(getattr(alignment, "name", alignment)).upper() == "BOTTOM_RIGHT":
        return False, True
    return causal, bottom_right


def _check_mask_attributes(node: Node) -> None:
    for flag in ("alibi_mask", "padding_mask"):
        if node.params.get(flag):
            raise node_error(node, flag, "is not supported by dnntune")
    dropout = node.params.get("dropout_probability")
    if dropout not in (None, 0.0):
        raise node_error(node, "dropout_probability", f"dropout is not supported, got {dropout}")
    causal = bool(node.params.get("causal_mask"))
    bottom_right = bool(node.params.get("causal_mask_bottom_right"))
    if causal and bottom_right:
        raise node_error(
            node,
            "causal_mask_bottom_right",
            "causal_mask and causal_mask_bottom_right exclude each other",
        )
    left, right = node.params.get("left_bound"), node.params.get("right_bound")
    if left not in _UNBOUNDED:
        raise node_error(node, "left_bound", f"sliding-window attention is not supported: {left}")
    if right in _UNBOUNDED:
        return
    if right != 0:
        raise node_error(node, "right_bound", f"only 0 (causal) is supported, got {right}")
    aligned_bottom = node.params.get("diagonal_alignment") is DiagonalAlignment.BOTTOM_RIGHT
    if (causal and aligned_bottom) or (bottom_right and not aligned_bottom):
        raise node_error(node, "diagonal_alignment", "contradicts the causal flag of the same node")
    if not causal and not bottom_right:
        node.infer("causal_mask_bottom_right" if aligned_bottom else "causal_mask", True)


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
    if h % hk != 0:
        raise node_error(
            node, "k_tensor_uid", f"query heads {h} are not a multiple of key/value heads {hk}"
        )
    _check_mask_attributes(node)
    scale = node.params.get("attn_scale_value")
    if scale is not None and not 0 < scale < math.inf:  # inf: every score inf, outputs NaN
        raise node_error(node, "attn_scale_value", f"must be a finite number > 0, got {scale}")
    mask = node.inputs.get("attn_mask_tensor_uid")
    full = [b, h, sq, skv]
    if mask is not None and (
        len(mask.dims) != 4 or broadcast_dims(node, "attn_mask_tensor_uid", mask.dims, full) != full
    ):
        raise node_error(
            node, "attn_mask_tensor_uid", f"dims {mask.dims} do not broadcast to {full}"
        )
    fill_output(node, "o_tensor_uid", [b, h, sq, v.dims[3]])
    stats = node.outputs.get("stats_tensor_uid")
    generate = node.params.get("generate_stats")
    if generate and stats is None:
        raise node_error(
            node, "stats_tensor_uid", "generate_stats is set but no stats output given"
        )
    if stats is not None:
        if generate is False:
            raise node_error(node, "generate_stats", "is false but a stats output is given")
        if generate is None:
            node.infer("generate_stats", True)
        fill_output(node, "stats_tensor_uid", [b, h, sq, 1])
        set_stats_type(node, "stats_tensor_uid")


def _key_params(node: Node, params: dict[str, Any]) -> dict[str, Any]:
    # The key holds the mask as computed (causal_flags), not as spelled: causal_mask with a
    # BOTTOM_RIGHT diagonal_alignment is the bottom-right mask, and a right_bound 0 band has
    # become these flags in validation. generate_stats says what a stats output says.
    out = dict(params)
    for name in ("left_bound", "right_bound", "diagonal_alignment", "generate_stats"):
        out.pop(name, None)
    out["causal_mask"], out["causal_mask_bottom_right"] = causal_flags(node)
    return out


def _check_mask_dtype(node: Node) -> None:
    mask = node.inputs.get("attn_mask_tensor_uid")
    dtype = None if mask is None else mask.data_type
    if dtype is not None and dtype is not DataType.BOOLEAN and not dtype.is_floating:
        raise node_error(
            node,
            "attn_mask_tensor_uid",
            f"must be boolean or floating point, got {dtype.json_name}",
        )


def _attr(
    name: str,
    kind: ParamKind,
    default: object = None,
    *,
    in_key: bool = True,
    enum_type: type[_JsonEnum] | None = None,
) -> Param:
    style = "upper" if enum_type is not None else "json"
    return Param(
        name,
        kind,
        default,
        enum_type,
        section="attributes",
        json_required=True,
        in_key=in_key,
        enum_style=style,
    )


_NULL_INPUTS = (
    "scale",
    "seq_len_q",
    "seq_len_kv",
    "seed",
    "offset",
    "dropout_mask",
    "dropout_scale",
    "page_table_k",
    "page_table_v",
    "block_mask",
    "sink_token",
    "descale_q",
    "descale_k",
    "descale_v",
    "descale_s",
    "scale_s",
    "scale_o",
)
_NULL_OUTPUTS = ("max", "sum_exp", "rng_dump", "amax_s", "amax_o")

SDPA = OpSpec(
    kind=OpKind.SDPA,
    json_type="SdpaAttributes",
    builder_name="sdpa",
    inputs=("q_tensor_uid", "k_tensor_uid", "v_tensor_uid"),
    optional_inputs=("attn_mask_tensor_uid",),
    outputs=("o_tensor_uid",),
    optional_outputs=("stats_tensor_uid",),
    params=(
        _attr("generate_stats", ParamKind.BOOL),
        _attr("alibi_mask", ParamKind.BOOL, False),
        _attr("padding_mask", ParamKind.BOOL, False),
        _attr("causal_mask", ParamKind.BOOL, False),
        _attr("causal_mask_bottom_right", ParamKind.BOOL, False),
        _attr("dropout_probability", ParamKind.FLOAT),
        _attr("attn_scale_value", ParamKind.FLOAT),
        _attr("left_bound", ParamKind.INT),
        _attr("right_bound", ParamKind.INT),
        _attr("max_seq_len_kv", ParamKind.INT, in_key=False),
        _attr(
            "diagonal_alignment",
            ParamKind.ENUM,
            DiagonalAlignment.TOP_LEFT,
            enum_type=DiagonalAlignment,
        ),
        _attr("mma_core_mode", ParamKind.STR, "unset", in_key=False),
        _attr("implementation", ParamKind.STR, "AUTO", in_key=False),
    ),
    params_key="attributes",
    priority=60,
    check=_check_sdpa,
    check_types=_check_mask_dtype,
    key_params=_key_params,
    json_constants={
        **{f"inputs.{n}_tensor_uid": None for n in _NULL_INPUTS},
        **{f"outputs.{n}_tensor_uid": None for n in _NULL_OUTPUTS},
    },
    null_fields=("attn_mask_tensor_uid", "stats_tensor_uid"),
    float_fields=("q_tensor_uid", "k_tensor_uid", "v_tensor_uid", "o_tensor_uid"),
)
