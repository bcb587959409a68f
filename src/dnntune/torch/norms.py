"""Normalisation ops backed by dnntune (``layer_norm``, ``rms_norm``, ``batch_norm``),
re-exported by :mod:`dnntune.torch.functional` (pooling: :mod:`dnntune.torch.pooling`).
Inference ops: with gradients needed they run PyTorch's op."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.torch._calls import GRADIENT_ROUTE, _grad_enabled, _pytorch_forced, prepared_call
from dnntune.torch._calls import grad_wanted as _grad_wanted
from dnntune.torch._calls import guarded as _guarded
from dnntune.torch._support import lazy_view, recorded, tracing, unsupported_kind
from dnntune.torch.autograd import _sig
from dnntune.torch.graphs import batch_norm_graph, norm_graph
from dnntune.torch.runtime import NATIVE, kernel_for, native_memo

__all__ = ["batch_norm", "layer_norm", "rms_norm"]

_log = logging.getLogger("dnntune.torch.functional")
#: per op, the id of the call's weight -> the signature it ran last (:class:`_memo.Recent`)
_layer_norm_sites = native_memo.sites()
_rms_norm_sites = native_memo.sites()


# ---- normalisation ---------------------------------------------------------------------------
def _norm(
    kind: str,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    fallback: Callable[[], torch.Tensor],
    memo: Hashable | None,
) -> torch.Tensor:
    count = len(normalized_shape)
    if x.dim() < count or tuple(x.shape[x.dim() - count :]) != tuple(normalized_shape):
        # PyTorch's own error, as eager's ("Given normalized_shape=[32], expected input with
        # shape [*, 32]"): a model fed hidden states of the wrong width raised a ValueError of
        # dnntune's making in a rewritten forward (new-user audit)
        return fallback()
    for t in (weight, bias):
        if t is not None and tuple(t.shape) != tuple(normalized_shape):
            return fallback()  # PyTorch's own error (dnntune's graph would reshape it)
    # a norm over the whole input (an unbatched vector, ``nn.LayerNorm(8)(torch.randn(8))``)
    # runs as one row: the graph takes a rank of two or more (it fell back with a warning,
    # "dnntune cannot run it", before a new-user audit)
    lone = x.dim() == count
    full = (1,) * (x.dim() - count + lone) + tuple(normalized_shape)
    w = (
        weight
        if weight is not None
        else torch.ones(normalized_shape, dtype=x.dtype, device=x.device)
    )
    b = bias
    if kind == "layer_norm" and bias is None:
        b = torch.zeros(normalized_shape, dtype=x.dtype, device=x.device)
    wv = w.reshape(full)
    bv = b.reshape(full) if b is not None else None
    xin = x if x.is_contiguous() else x.contiguous()
    if kind == "rms_norm" and xin is not x:
        # PyTorch's rms_norm lays its output out as its input (a channels-last one stays so),
        # dnntune's kernel writes a contiguous one (training audit, session 55): PyTorch's op
        if memo is not None:
            native_memo.remember(memo, NATIVE)
        return fallback()
    xin = xin.unsqueeze(0) if lone else xin
    inputs = [t for t in (xin, wv, bv) if t is not None]
    key = (kind, *(_sig(t) for t in inputs), count, float(eps))
    kernel = kernel_for(key, lambda: norm_graph(kind, xin, wv, bv, count, eps), inputs)
    if memo is not None:
        native_memo.note(memo, kernel)
    if kernel.native:
        return fallback()
    y = kernel(*inputs)[0]
    if lone:
        y = y.view(x.shape)
    if memo is not None:
        # a missing weight or bias is a constant of the signature: made once, held by the call
        const_w = None if weight is not None else wv
        const_b = None if bias is not None or bv is None else bv
        copy = not x.is_contiguous()
        # whether a view does (it depends only on the layout, fixed for the signature): half
        # the host time of reshape
        as_w = _shaper(weight, full)
        as_b = _shaper(bias, full)

        def views(
            x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None
        ) -> tuple[torch.Tensor | None, ...]:
            rows = x.contiguous() if copy else x
            return (
                rows.unsqueeze(0) if lone else rows,
                const_w if w is None else as_w(w, full),
                const_b if b is None else as_b(b, full),
            )

        raw = (x, weight, bias)  # the op's own arguments (None where a constant stands in)
        out = x.shape if lone else None
        native_memo.remember(memo, prepared_call(kernel, raw, (xin, wv, bv), views, out))
    return y


def _kind_reason(memo: Hashable | None, tensors: list[torch.Tensor | None]) -> str | None:
    """Why these tensors are not the kind dnntune's plans take (:func:`unsupported_kind`), or
    None; when they are not, later calls of the signature go to PyTorch's op from the memo (as
    :func:`dnntune.torch._calls.declined` does)."""
    kind = unsupported_kind(tensors)
    if kind is not None and memo is not None:
        native_memo.remember(memo, NATIVE)
    return kind


def _shaper(
    t: torch.Tensor | None, shape: tuple[int, ...]
) -> Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]:
    """``Tensor.view`` when ``t``'s layout views as ``shape``, else ``Tensor.reshape``."""
    if t is not None:
        try:
            t.view(shape)
        except RuntimeError:
            return torch.Tensor.reshape
    return torch.Tensor.view


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The type PyTorch's kernels compute a ``dtype`` input in."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return normalized_shape if type(normalized_shape) is tuple else tuple(normalized_shape)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.layer_norm`` (inference; with gradients needed it runs PyTorch's op)."""
    shape = normalized_shape if type(normalized_shape) is tuple else _shape(normalized_shape)
    if tracing():  # PyTorch's op, or under torch.fx this call (as functional.conv2d's)
        node = recorded(layer_norm, input, shape, weight, bias, eps)
        return node if node is not None else F.layer_norm(input, shape, weight, bias, eps)
    if _pytorch_forced.get():
        return F.layer_norm(input, shape, weight, bias, eps)
    recent = _layer_norm_sites.get(id(weight))
    if recent is not None and recent.fits((shape, eps), input, weight, bias):
        if recent.call is NATIVE:
            return F.layer_norm(input, shape, weight, bias, eps)
        return recent.call(input, weight, bias)
    memo: tuple[Any, ...] | None
    try:  # the raw arguments as one flat key: a signature seen before skips every check below
        if lazy_view(input, weight, bias):
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and (
            input.requires_grad
            or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad)
        )
        memo = (
            "layer_norm",
            type(input),  # a subclass, a nested or fake tensor: another signature
            input.shape,
            input.stride(),
            input.dtype,
            input.device,
            shape,
            None
            if weight is None
            else (weight.shape, weight.stride(), weight.dtype, weight.device),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            eps,
            grad,
        )
        known = native_memo.lookup(memo)
    except (AttributeError, TypeError, RuntimeError):  # no tensor, an unhashable argument, a
        # tensor without shape or strides (nested, sparse CSR)
        memo, known = None, None
        grad = _grad_wanted(input, weight, bias)
    if known is not None:
        native_memo.keep(
            _layer_norm_sites, id(weight), memo, (input, weight, bias), (shape, eps), known
        )
        if known is NATIVE:
            return F.layer_norm(input, shape, weight, bias, eps)
        return known(input, weight, bias)
    extra = GRADIENT_ROUTE if grad else None

    def fallback() -> torch.Tensor:
        return F.layer_norm(input, shape, weight, bias, eps)

    tensors = [input, weight, bias]
    return _guarded(
        "layer_norm",
        tensors,
        lambda: _norm("layer_norm", input, shape, weight, bias, eps, fallback, memo),
        fallback,
        extra or _kind_reason(memo, tensors),
        memo,
    )


def rms_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``F.rms_norm`` (inference; eps None means the machine epsilon of the type PyTorch
    computes in: float32's for half and bfloat16 inputs)."""
    shape = normalized_shape if type(normalized_shape) is tuple else _shape(normalized_shape)
    if tracing():  # PyTorch's op, or under torch.fx this call (as functional.conv2d's)
        node = recorded(rms_norm, input, shape, weight, eps)
        return node if node is not None else F.rms_norm(input, shape, weight, eps)
    if _pytorch_forced.get():
        return F.rms_norm(input, shape, weight, eps)
    recent = _rms_norm_sites.get(id(weight))
    if recent is not None and recent.fits((shape, eps), input, weight):
        if recent.call is NATIVE:
            return F.rms_norm(input, shape, weight, eps)
        return recent.call(input, weight, None)
    memo: tuple[Any, ...] | None
    try:  # the raw arguments as one flat key: a signature seen before skips every check below
        if lazy_view(input, weight):
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and (
            input.requires_grad or (weight is not None and weight.requires_grad)
        )
        memo = (
            "rms_norm",
            type(input),  # a subclass, a nested or fake tensor: another signature
            input.shape,
            input.stride(),
            input.dtype,
            input.device,
            shape,
            None
            if weight is None
            else (weight.shape, weight.stride(), weight.dtype, weight.device),
            None,
            eps,
            grad,
        )
        known = native_memo.lookup(memo)
    except (AttributeError, TypeError, RuntimeError):  # as layer_norm's
        memo, known = None, None
        grad = _grad_wanted(input, weight)
    if known is not None:
        native_memo.keep(_rms_norm_sites, id(weight), memo, (input, weight), (shape, eps), known)
        if known is NATIVE:
            return F.rms_norm(input, shape, weight, eps)
        return known(input, weight, None)
    extra = GRADIENT_ROUTE if grad else None

    def fallback() -> torch.Tensor:
        return F.rms_norm(input, shape, weight, eps)

    # eps None: PyTorch's kernel takes the machine epsilon of the type it computes in
    # (float32 for half and bfloat16 inputs, the input's own type otherwise)
    eps_value = float(torch.finfo(_opmath(input.dtype)).eps) if eps is None else float(eps)
    tensors = [input, weight]
    return _guarded(
        "rms_norm",
        tensors,
        lambda: _norm("rms_norm", input, shape, weight, None, eps_value, fallback, memo),
        fallback,
        extra or _kind_reason(memo, tensors),
        memo,
    )


def batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.batch_norm``; inference (running statistics) runs on dnntune, training in PyTorch."""

    def fallback() -> torch.Tensor:
        return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)

    if tracing():  # PyTorch's op, or under torch.fx this call (as functional.conv2d's)
        args = (input, running_mean, running_var, weight, bias, training, momentum, eps)
        node = recorded(batch_norm, *args)
        return node if node is not None else fallback()
    extra = None
    if (
        not training
        and running_mean is not None
        and running_var is not None
        and (running_mean.dtype != input.dtype or running_var.dtype != input.dtype)
    ):
        # float32 statistics for a half or bfloat16 input (autocast): dnntune's graph takes
        # them in the input's type, which loses what a large mean over a small spread keeps
        # (bfloat16: errors of 1.0 on unit outputs); PyTorch's op computes in float32
        _log.info("dnntune.torch.batch_norm: statistics in %s: PyTorch's op", running_mean.dtype)
        return fallback()
    if training or running_mean is None or running_var is None:
        # the batch's statistics: PyTorch's op by design, as an optimized BatchNorm2d in
        # training mode runs it, quietly (a training step through the functional op warned
        # "batch-norm training runs in PyTorch"; new-user audit)
        _log.debug("dnntune.torch.batch_norm: batch statistics: PyTorch's op")
        return fallback()
    if _grad_wanted(input, weight, bias):
        extra = GRADIENT_ROUTE
    elif input.dim() < 3:
        extra = "inputs need a channel dim and at least one spatial dim"

    def run() -> torch.Tensor:
        assert running_mean is not None and running_var is not None
        c = input.shape[1]
        for name, t in (
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("weight", weight),
            ("bias", bias),
        ):
            if t is not None and t.numel() != c:  # PyTorch's own message for the same mistake
                raise ValueError(f"{name} should contain {c} elements not {t.numel()}")
        rank = input.dim()
        dtype = input.dtype
        view = (1, c, *([1] * (rank - 2)))
        mean = running_mean.to(dtype).reshape(view)
        inv = torch.rsqrt(running_var.float() + eps).to(dtype).reshape(view)
        scale = (weight if weight is not None else torch.ones(c, device=input.device)).to(dtype)
        shift = (bias if bias is not None else torch.zeros(c, device=input.device)).to(dtype)
        scale, shift = scale.reshape(view), shift.reshape(view)
        inputs = [input, mean, inv, scale, shift]
        key = ("batch_norm", *(_sig(t) for t in inputs))
        kernel = kernel_for(key, lambda: batch_norm_graph(*inputs), inputs)
        return fallback() if kernel.native else kernel(*inputs)[0]

    return _guarded(
        "batch_norm", [input, weight, bias, running_mean, running_var], run, fallback, extra
    )
