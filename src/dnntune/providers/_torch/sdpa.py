"""Scaled dot-product attention as ``F.scaled_dot_product_attention`` (or written out for stats).

Causal masking aligned top-left is the kernel's own ``is_causal``; bottom-right alignment, and
causal masking combined with a caller's mask, use a boolean mask built once at lowering.
Grouped-query attention uses ``enable_gqa`` or, when a backend refuses it, repeated kv heads;
with a mask, ``enable_gqa`` only where one of PyTorch's fused kernels takes it (else repeated
kv heads: :func:`grouped_masked`).
With ``generate_stats`` the attention is written out in float32 so that the log-sum-exp of every
row can be returned.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.graph.node import Node
from dnntune.graph.ops.sdpa import causal_flags
from dnntune.graph.types import DataType
from dnntune.providers._torch.program import LowerContext, Reader, Slots, Step

__all__ = ["fused_takes_grouped", "grouped", "grouped_masked", "lower_sdpa", "shared_calls"]

#: grouped calls with a mask that ran with their key/value heads shared (``enable_gqa`` taken
#: by one of PyTorch's fused kernels), in this process: where it has not moved, every such call
#: repeated the heads (the CPU), and ``optimize``'s report claims no saving (a count, not a
#: lock: a report reads whether it moved)
_shared = [0]


def shared_calls() -> int:
    """How many grouped calls with a mask have run with their heads shared in this process."""
    return _shared[0]


def _keep_mask(sq: int, skv: int, bottom_right: bool, device: torch.device) -> torch.Tensor:
    """Boolean [sq, skv]: True where query row i may attend key column j."""
    rows = torch.arange(sq, device=device)[:, None]
    cols = torch.arange(skv, device=device)[None, :]
    return cols <= rows + (skv - sq if bottom_right else 0)


def lower_sdpa(ctx: LowerContext, node: Node) -> Step:
    get = node.inputs.get
    q_t, k_t, v_t, mask_t = (get(f"{n}_tensor_uid") for n in ("q", "k", "v", "attn_mask"))
    o_t, stats_t = node.outputs.get("o_tensor_uid"), node.outputs.get("stats_tensor_uid")
    assert q_t is not None and k_t is not None and v_t is not None and o_t is not None
    _, h, sq, d = q_t.dims
    hk, skv = k_t.dims[1], k_t.dims[2]
    group = h // hk
    scale_param = node.params.get("attn_scale_value")
    scale = 1.0 / math.sqrt(d) if scale_param is None else float(scale_param)
    top_left, bottom_right = causal_flags(node)
    if bottom_right and sq == skv:  # the two alignments agree on square problems
        top_left, bottom_right = True, False
    dtype = ctx.promote(q_t, k_t, v_t)
    read_q, read_k, read_v = ctx.read(q_t, dtype), ctx.read(k_t, dtype), ctx.read(v_t, dtype)
    explicit = stats_t is not None
    # is_causal covers top-left masking alone; anything else goes through a boolean mask
    is_causal = top_left and mask_t is None and not explicit
    keep: torch.Tensor | None = None
    if bottom_right or (top_left and not is_causal):
        keep = _keep_mask(sq, skv, bottom_right, ctx.device)
    drop = None if keep is None else ~keep
    read_mask: Reader | None = None
    mask_is_bool = mask_t is not None and mask_t.data_type is DataType.BOOLEAN
    if mask_t is not None:
        # F.sdpa takes a boolean mask, or an additive one in the query's type
        read_mask = ctx.read(mask_t, None if mask_is_bool else dtype)
    write_o = ctx.write(o_t)

    def mask_of(slots: Slots) -> torch.Tensor | None:
        if read_mask is None:
            return keep
        m = read_mask(slots)
        if keep is None or drop is None:
            return m
        return m & keep if mask_is_bool else m.masked_fill(drop, -math.inf)

    if explicit:
        assert stats_t is not None
        write_stats = ctx.write(stats_t)
        cd = torch.float64 if dtype == torch.float64 else torch.float32

        def sdpa_with_stats(slots: Slots) -> None:
            q, k, v = read_q(slots).to(cd), read_k(slots).to(cd), read_v(slots).to(cd)
            if group > 1:
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
            m = mask_of(slots)
            if m is not None:
                scores = (
                    scores.masked_fill(~m, -math.inf)
                    if m.dtype == torch.bool
                    else scores + m.to(cd)
                )
            lse = torch.logsumexp(scores, -1, keepdim=True)
            # a row with every key masked gives output 0 and log-sum-exp -inf, not NaN
            p = torch.where(torch.isneginf(lse), 0.0, torch.exp(scores - lse))
            write_o(slots, torch.matmul(p, v))
            write_stats(slots, lse)

        return sdpa_with_stats

    repeat = group > 1 and ctx.options.sdpa_repeat_kv
    kwargs: dict[str, Any] = {"scale": scale, "is_causal": is_causal}
    if group > 1 and not repeat:
        kwargs["enable_gqa"] = True

    #: whether PyTorch's fused kernels take this plan's grouped call with its mask: asked on
    #: the first call (the plan's shapes, layouts and backend flags are fixed)
    shared: list[bool] = []

    def sdpa(slots: Slots) -> None:
        q, k, v, m = read_q(slots), read_k(slots), read_v(slots), mask_of(slots)
        if group > 1 and not repeat and m is not None:  # no math kernel for enable_gqa + mask
            if not shared:
                shared.append(fused_takes_grouped(q, k, v, m))
            write_o(slots, grouped_masked(q, k, v, m, scale=scale, shared=shared[0]))
            return
        if repeat:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        write_o(slots, F.scaled_dot_product_attention(q, k, v, m, **kwargs))

    return sdpa


def grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Grouped-query attention: fewer key/value heads than query heads, evenly shared."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    return 0 < kv_heads < heads and heads % kv_heads == 0 and value.shape[1] == kv_heads


def grouped_masked(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    dropout_p: float = 0.0,
    scale: float | None = None,
    shared: bool | None = None,
) -> torch.Tensor:
    """Grouped-query attention with a mask on PyTorch's op: ``enable_gqa`` where one of
    PyTorch's fused CUDA kernels takes the call as it is (:func:`fused_takes_grouped`: torch
    2.11's do, a decode step's attention over a 2048-slot cache in 13 us on the H200), else the
    key/value heads repeated, as transformers repeats them (a kernel that refuses
    ``enable_gqa`` with a mask leaves PyTorch its float32 math kernel, which materialises every
    score). Head ``h`` reads key/value head ``h // group`` either way. ``shared``: that answer,
    where the caller already has it."""
    if shared is None:
        shared = fused_takes_grouped(query, key, value, mask, dropout_p)
    if shared:
        _shared[0] += 1
        return F.scaled_dot_product_attention(
            query, key, value, mask, dropout_p, scale=scale, enable_gqa=True
        )
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(query, key, value, mask, dropout_p, scale=scale)


#: per call signature: whether a fused kernel of PyTorch's takes it (bounded)
_fused_grouped: dict[tuple[object, ...], bool] = {}


def fused_takes_grouped(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    dropout_p: float = 0.0,
) -> bool:
    """Whether PyTorch's flash, memory-efficient or cuDNN attention takes this grouped call
    (``enable_gqa``) with its mask, by PyTorch's own checks (``torch.backends.cuda.can_use_*``,
    which honour the backends a caller turned off), once per signature. False off CUDA, and
    where this PyTorch has no such checks."""
    if not query.is_cuda:
        return False
    signature = (
        *(tuple(t.shape) for t in (query, key, value, mask)),
        *(t.stride() for t in (query, key, value, mask)),
        query.dtype,
        mask.dtype,
        query.device,
        dropout_p,
        torch.backends.cuda.flash_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(),
    )
    known = _fused_grouped.get(signature)
    if known is not None:
        return known
    cuda = torch.backends.cuda
    try:
        # the mask as given: PyTorch picks its kernel before it converts a boolean one
        params = cuda.SDPAParams(query, key, value, mask, dropout_p, False, True)
        takes = any(
            check(params, False)
            for check in (
                cuda.can_use_flash_attention,
                cuda.can_use_efficient_attention,
                cuda.can_use_cudnn_attention,
            )
        )
    except (AttributeError, TypeError, RuntimeError):  # a PyTorch without these checks
        takes = False
    if len(_fused_grouped) >= 1024:
        _fused_grouped.clear()
    _fused_grouped[signature] = takes
    return takes
