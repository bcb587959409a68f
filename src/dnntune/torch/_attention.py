"""``scaled_dot_product_attention`` backed by dnntune, re-exported by
:mod:`dnntune.torch.functional` (inference; GQA supported; a boolean mask, dropout or gradients
run PyTorch's op)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from dnntune.torch._calls import GRADIENT_ROUTE, _grad_enabled, _pytorch_forced, prepared_call
from dnntune.torch._calls import autocast_on as _autocast
from dnntune.torch._calls import declined as _declined
from dnntune.torch._calls import grad_wanted as _grad_wanted
from dnntune.torch._calls import guarded as _guarded
from dnntune.torch._calls import mixed as _mixed
from dnntune.torch._masks import additive_mask, fused_kernels_refuse
from dnntune.torch._pytorch_ops import sdpa_torch as _sdpa_torch
from dnntune.torch._support import lazy_view, recorded, tracing, unsupported_kind
from dnntune.torch.autograd import _sig
from dnntune.torch.graphs import sdpa_graph
from dnntune.torch.runtime import NATIVE, kernel_for, native_memo

__all__ = ["scaled_dot_product_attention"]

_log = logging.getLogger("dnntune.torch.functional")
#: the signature attention ran last (one entry: a model's attention calls share a signature)
_sdpa_sites = native_memo.sites()


_noted: set[str] = set()


def _note_once(key: str, message: str) -> None:
    """An INFO line, once per ``key`` in this process (a set's add is atomic under the GIL)."""
    if key not in _noted:
        _noted.add(key)
        _log.info("dnntune.torch.scaled_dot_product_attention: %s", message)


def _mask_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is not None and mask.dim() < 4:
        return mask.view(*([1] * (4 - mask.dim())), *mask.shape)
    return mask


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on [B, H, S, D] tensors, and on [B, S, D] ones as one
    head (inference; GQA supported)."""
    if tracing():  # PyTorch's op, or under torch.fx this call (as conv2d's)
        args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        node = recorded(scaled_dot_product_attention, *args)
        return node if node is not None else _sdpa_torch(*args)
    if _pytorch_forced.get() or _autocast():  # PyTorch's op (autocast: it casts as PyTorch's)
        return _sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is not None and attn_mask.dtype is torch.bool:
        # PyTorch's boolean mask (Hugging Face models pass one): PyTorch's own op runs such
        # calls (an expected route, logged once, not a fall-back warning), on the additive
        # mask its fused kernels would make of it where that keeps them usable
        _note_once("sdpa_bool_mask", "boolean attn_mask: PyTorch's own op runs these calls")
        if not is_causal and fused_kernels_refuse(attn_mask, query):
            attn_mask = additive_mask(attn_mask, query.dtype)
        return _sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    options = (dropout_p, is_causal, scale, enable_gqa)
    recent = _sdpa_sites.get(0)  # one entry: the signature it ran last
    if recent is not None and recent.fits(options, query, key, value, attn_mask):
        if recent.call is NATIVE:
            return _sdpa_torch(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
            )
        return recent.call(query, key, value, attn_mask)
    memo: tuple[Any, ...] | None
    try:  # the raw arguments as one flat key: a signature seen before skips every check below
        if lazy_view(query, key, value, attn_mask):
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and (
            query.requires_grad
            or key.requires_grad
            or value.requires_grad
            or (attn_mask is not None and attn_mask.requires_grad)  # a learned bias
        )
        memo = (
            "sdpa",
            type(query),  # a subclass, a nested or fake tensor: another signature
            query.shape,
            query.stride(),
            query.dtype,
            query.device,
            key.shape,
            key.stride(),
            key.dtype,
            key.device,
            value.shape,
            value.stride(),
            value.dtype,
            value.device,
            None if attn_mask is None else _sig(attn_mask),
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            grad,
        )
        known = native_memo.lookup(memo)
    except (AttributeError, TypeError, RuntimeError):  # as conv2d's
        memo, known = None, None
        grad = _grad_wanted(query, key, value, attn_mask)
    if known is not None:
        given = (query, key, value, attn_mask)
        native_memo.keep(_sdpa_sites, 0, memo, given, options, known)
        if known is NATIVE:
            return _sdpa_torch(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
            )
        return known(query, key, value, attn_mask)
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def fallback() -> torch.Tensor:
        return _sdpa_torch(*args)

    tensors = [query, key, value, attn_mask]
    kind = unsupported_kind(tensors)  # before any shape is read
    if kind is not None:
        return _declined("scaled_dot_product_attention", memo, tensors, fallback, kind)
    extra = None
    if grad:
        # first: a training step's attention (dropout on, as every transformer trains) runs
        # PyTorch's op whatever its options, an expected route; it warned "dropout is not
        # supported" in every training run (new-user audit)
        extra = GRADIENT_ROUTE
    elif dropout_p:
        extra = "dropout is not supported"
    elif _one_head(query, key, value, attn_mask):
        # [B, S, D] tensors, which PyTorch's op takes (an attention pooling, a single-head
        # block): one head, a view each way. They fell back with a warning ("only 4-D")
        # before a new-user audit
        mask = attn_mask if attn_mask is None or attn_mask.dim() < 3 else attn_mask.unsqueeze(1)
        heads = (query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1))
        out = scaled_dot_product_attention(*heads, mask, 0.0, is_causal, scale, enable_gqa)
        return out.squeeze(1)
    elif query.dim() != 4:
        extra = f"only 4-D [B, H, S, D] tensors are supported, got {query.dim()}-D"
    elif query.shape[1] != key.shape[1] and not enable_gqa:
        # PyTorch broadcasts key/value heads it can (one head for all: multi-query attention)
        # and raises its own error for the others
        extra = "key/value heads broadcast over the query's heads are not supported"
    elif is_causal and attn_mask is not None:
        return fallback()  # PyTorch's own error for the same arguments
    if _mixed(query, key, value) or (attn_mask is not None and attn_mask.dim() < 2):
        return fallback()  # PyTorch's own error (dnntune's graph would cast or broadcast)

    def run() -> torch.Tensor:
        mask = _mask_4d(attn_mask)
        inputs = [t for t in (query, key, value, mask) if t is not None]
        k = ("sdpa", *(_sig(t) for t in inputs), is_causal, scale)
        kernel = kernel_for(
            k, lambda: sdpa_graph(query, key, value, mask, is_causal, scale), inputs
        )
        if memo is not None:
            native_memo.note(memo, kernel)
        if kernel.native:
            return fallback()
        y = kernel(*inputs)[0]
        if memo is not None:
            raw = (query, key, value, attn_mask)
            derived = (query, key, value, mask)
            views = _sdpa_views
            native_memo.remember(memo, prepared_call(kernel, raw, derived, views))
        return y

    return _guarded("scaled_dot_product_attention", tensors, run, fallback, extra, memo)


def _one_head(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> bool:
    """Whether these are 3-D [B, S, D] tensors of one batch size (a mask of at most three
    dims): attention over one head, as 4-D [B, 1, S, D] views."""
    return (
        query.dim() == key.dim() == value.dim() == 3
        and query.shape[0] == key.shape[0] == value.shape[0]
        and (mask is None or mask.dim() <= 3)
    )


def _sdpa_views(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    return (q, k, v, _mask_4d(mask))
