"""The attention kernel's match: one SDPA forward node (:mod:`.kernels.attention`).

Taken: attention over at most :data:`MAX_KEYS` keys (a window: Swin's 49), q, k, v of one
floating type (fp16, bf16 or fp32) with a contiguous head dimension of at most
:data:`MAX_HEAD_DIM`, grouped-query heads, a scale, causal masking (top-left or bottom-right)
and a mask of the caller's, additive or boolean, in any layout that broadcasts to [batch,
heads, Sq, Skv]. Declined, with the reason: longer sequences (the kernel walks any length, but
it was measured only on windows, where the library kernels are slow: a candidate it offers for
a prefill would cost every SDPA search its compiles for an unmeasured chance), the
log-sum-exp (stats) output, which training keeps, and anything the kernel cannot address (a
strided head dimension). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.ops.sdpa import causal_flags
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType
from dnntune.providers.triton.expression import (
    Operand,
    broadcast_strides,
    check_dtype,
    tensor_uid,
)
from dnntune.providers.triton.match_base import Match, only_node

__all__ = ["MAX_HEAD_DIM", "MAX_KEYS", "AttentionMatch", "match_attention"]

#: the largest head dimension the kernel keeps in registers (a query block, its accumulator)
MAX_HEAD_DIM = 128
#: the most keys it is offered for (static ordering's SHORT_ATTENTION_KEYS puts it first there)
MAX_KEYS = 64


@dataclass
class AttentionMatch(Match):
    """softmax(q k^T * scale + mask) v over ``batch`` x ``heads`` problems of ``sq`` queries and
    ``skv`` keys of ``d`` channels; every operand's strides are (batch, head, row, channel)."""

    batch: int
    heads: int
    group: int
    sq: int
    skv: int
    d: int
    scale: float
    q: Operand
    k: Operand
    v: Operand
    o: Operand
    mask: Operand | None
    mask_is_bool: bool
    causal: bool
    causal_offset: int
    #: fp32 operands: the products in full fp32 (tf32 would lose the reference's tolerance)
    ieee: bool
    kernel = "attention"

    def signature(self) -> dict[str, Any]:
        def op(o: Operand | None) -> Any:
            return None if o is None else [o.dtype.json_name, list(o.strides)]

        return {
            "batch": self.batch,
            "heads": self.heads,
            "group": self.group,
            "sq": self.sq,
            "skv": self.skv,
            "d": self.d,
            "q": op(self.q),
            "k": op(self.k),
            "v": op(self.v),
            "o": op(self.o),
            "mask": op(self.mask),
            "mask_is_bool": self.mask_is_bool,
            "causal": self.causal,
            "causal_offset": self.causal_offset,
        }


def _operand(t: TensorAttributes, where: str) -> Operand:
    """q, k, v or o: four dims whose last (the channels) is contiguous."""
    dtype = check_dtype(t, where)
    strides = list(t.strides or ())
    if len(strides) != 4 or (t.dims[3] > 1 and strides[3] != 1):
        raise NotSupportedError(
            f"{where}: the head dimension must be contiguous, strides {strides}"
        )
    return Operand(tensor_uid(t), dtype, (strides[0], strides[1], strides[2], 1))


def match_attention(graph: OpGraph) -> AttentionMatch:
    node = only_node(graph, (OpKind.SDPA,), "an attention", "attention")
    where = f"node {node.name!r}"
    if node.outputs.get("stats_tensor_uid") is not None:
        raise NotSupportedError(f"{where}: the log-sum-exp (stats) output is not produced")
    q_t, k_t, v_t = (node.inputs[f"{n}_tensor_uid"] for n in "qkv")
    o_t = node.outputs["o_tensor_uid"]
    assert q_t is not None and k_t is not None and v_t is not None and o_t is not None
    b, h, sq, d = q_t.dims
    hk, skv = k_t.dims[1], k_t.dims[2]
    if v_t.dims[3] != d:
        raise NotSupportedError(f"{where}: value channels {v_t.dims[3]} differ from q's {d}")
    if skv > MAX_KEYS:
        raise NotSupportedError(
            f"{where}: {skv} keys > {MAX_KEYS}: the kernel is offered for short windows, where "
            "it was measured; cuDNN's and PyTorch's flash kernels run longer sequences"
        )
    if d > MAX_HEAD_DIM:
        raise NotSupportedError(f"{where}: head dimension {d} > {MAX_HEAD_DIM}")
    q, k, v = (_operand(t, f"{where}: {n}") for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v")))
    if not q.dtype == k.dtype == v.dtype:
        raise NotSupportedError(f"{where}: q, k and v must share one type")
    o = _operand(o_t, f"{where}: o")
    mask: Operand | None = None
    mask_t = node.inputs.get("attn_mask_tensor_uid")
    mask_is_bool = mask_t is not None and mask_t.data_type is DataType.BOOLEAN
    if mask_t is not None:
        mask_where = f"{where}: attn_mask"
        mask_type = mask_t.data_type if mask_is_bool else check_dtype(mask_t, mask_where)
        assert mask_type is not None
        strides = broadcast_strides(mask_t.dims, mask_t.strides or (), (b, h, sq, skv), mask_where)
        mask = Operand(tensor_uid(mask_t), mask_type, tuple(strides))
    top_left, bottom_right = causal_flags(node)
    scale = node.params.get("attn_scale_value")
    return AttentionMatch(
        batch=b,
        heads=h,
        group=h // hk,
        sq=sq,
        skv=skv,
        d=d,
        scale=float(d**-0.5 if scale is None else scale),
        q=q,
        k=k,
        v=v,
        o=o,
        mask=mask,
        mask_is_bool=mask_is_bool,
        causal=top_left or bottom_right,
        causal_offset=skv - sq if bottom_right else 0,
        ieee=q.dtype is DataType.FLOAT,
    )
