"""Functional ops backed by dnntune: the same signatures and results as ``torch.nn.functional``.

Each call builds a graph for its shapes/strides/dtypes on first sight, picks the plan by the
configured policy, caches it, and later calls only run the plan. Calls dnntune cannot run
(other devices or dtypes, options it does not model) fall back to PyTorch's op with a one-time
:class:`DnnTuneFallbackWarning`; a user's forward pass never crashes because of dnntune.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from dnntune.errors import DnnTuneError
from dnntune.graph.types import ResampleMode
from dnntune.torch._support import unsupported_reason, warn_fallback
from dnntune.torch.autograd import (
    Conv2dFunction,
    LinearFunction,
    _sig,
    conv2d_kernel,
)
from dnntune.torch.graphs import (
    ACTIVATIONS,
    batch_norm_graph,
    linear_graph,
    norm_graph,
    pool_graph,
    sdpa_graph,
)
from dnntune.torch.runtime import Kernel, kernel_for, native_memo

__all__ = [
    "TORCH_ACTIVATIONS",
    "avg_pool2d",
    "batch_norm",
    "conv2d",
    "layer_norm",
    "linear",
    "max_pool2d",
    "rms_norm",
    "scaled_dot_product_attention",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: PyTorch's own op for each fusable activation name (what a fall-back or unfused path runs)
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    return (values[0], values[1])


def _guarded(
    op: str,
    tensors: Sequence[torch.Tensor | None],
    run: Callable[[], T],
    fallback: Callable[[], T],
    extra_reason: str | None = None,
) -> T:
    reason = extra_reason or unsupported_reason(tensors)
    if reason is None:
        try:
            return run()
        except DnnTuneError as exc:
            reason = f"dnntune cannot run it ({exc})"
            _log.info("dnntune.torch.%s: %s", op, reason)
    warn_fallback(op, reason.split(" (", 1)[0] if reason.startswith("dnntune cannot") else reason)
    return fallback()


def _check_activation(activation: str | None) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}"
        )


def _grad_wanted(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---- convolution ---------------------------------------------------------------------------
def conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.conv2d`` plus optional fused ``residual`` add and ``activation`` (relu, gelu, ...).

    Groups are taken from the weight's shape (``groups`` is checked against it). Training
    (autograd) is supported without a residual and with no activation or relu; other fusions
    run the epilogue in PyTorch when gradients are needed.
    """
    _check_activation(activation)
    s, d = _pair(stride, "stride"), _pair(dilation, "dilation")

    def fallback() -> torch.Tensor:
        y = F.conv2d(input, weight, bias, stride, padding, dilation, groups)
        if residual is not None:
            y = y + residual
        return TORCH_ACTIVATIONS[activation](y) if activation else y

    extra = None
    if isinstance(padding, str):
        extra = f"padding={padding!r} is not supported (give explicit padding)"
    elif input.dim() != 4:
        extra = f"only 4-D (batched NCHW) input is supported, got {input.dim()}-D"
    elif weight.shape[1] * groups != input.shape[1]:
        raise ValueError(
            f"conv2d: groups={groups} does not match input channels "
            f"{input.shape[1]} and weight {tuple(weight.shape)}"
        )
    if extra is not None:
        return _guarded("conv2d", [input, weight, bias, residual], fallback, fallback, extra)
    p = _pair(padding, "padding")
    grad = _grad_wanted(input, weight, bias, residual)
    memo: tuple[Any, ...] = ("conv2d", _sig(input), _sig(weight), _sig(bias), s, p, d)
    memo = (*memo, activation, _sig(residual), grad)
    if native_memo.hit(memo):
        return fallback()  # this signature's winner is PyTorch's own op (seen before)

    def run() -> torch.Tensor:
        if grad:
            fused_relu = residual is None and activation == "relu"
            bias_view = bias.view(1, -1, 1, 1) if bias is not None else None
            act = "relu" if fused_relu else None
            kernel = conv2d_kernel(input, weight, bias_view, s, p, d, act, None)[0]
            native_memo.note(memo, kernel)
            if kernel.native:
                # the forward's winner is PyTorch's own op: train through it and PyTorch's
                # autograd (the same kernels, without this layer's per-call overhead)
                return fallback()
            y = Conv2dFunction.apply(input, weight, bias, s, p, d, fused_relu, kernel)
            if fused_relu or (residual is None and activation is None):
                return y
            if residual is not None:
                y = y + residual
            return TORCH_ACTIVATIONS[activation](y) if activation else y
        bias_view = bias.view(1, -1, 1, 1) if bias is not None else None
        kernel, inputs = conv2d_kernel(input, weight, bias_view, s, p, d, activation, residual)
        native_memo.note(memo, kernel)
        # PyTorch's own op won: call it as eager code does (no graph-execution overhead)
        return fallback() if kernel.native else kernel(*inputs)[0]

    return _guarded("conv2d", [input, weight, bias, residual], run, fallback)


# ---- linear ---------------------------------------------------------------------------------
def linear_kernel(
    x2d: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual2d: torch.Tensor | None = None,
) -> tuple[Kernel, list[torch.Tensor]]:
    """The kernel selected for this linear's signature and the inputs it takes."""
    w_t = w.t()
    bias_row = bias.view(1, -1) if bias is not None else None
    key = ("linear", _sig(x2d), _sig(w_t), _sig(bias_row), activation, _sig(residual2d))
    inputs = [t for t in (x2d, w_t, bias_row, residual2d) if t is not None]
    kernel = kernel_for(
        key, lambda: linear_graph(x2d, w_t, bias_row, activation, residual2d), inputs
    )
    return kernel, inputs


def linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear`` (y = x W^T + b) with an optional fused ``residual`` add (a tensor of the
    output's shape, added before the activation) and ``activation``."""
    _check_activation(activation)

    def fallback() -> torch.Tensor:
        y = F.linear(input, weight, bias)
        if residual is not None:
            y = y + residual
        return TORCH_ACTIVATIONS[activation](y) if activation else y

    grad = _grad_wanted(input, weight, bias, residual)
    memo = ("linear", _sig(input), _sig(weight), _sig(bias), activation, _sig(residual), grad)
    if native_memo.hit(memo):
        return fallback()  # this signature's winner is PyTorch's own op (seen before)

    def run() -> torch.Tensor:
        lead = input.shape[:-1]
        x2d = input.reshape(-1, input.shape[-1])
        if x2d.stride(-1) != 1:
            x2d = x2d.contiguous()
        if grad:
            fused_relu = residual is None and activation == "relu"
            act = "relu" if fused_relu else None
            kernel = linear_kernel(x2d, weight, bias, act)[0]
            native_memo.note(memo, kernel)
            if kernel.native:
                return fallback()  # PyTorch's op won the forward: its autograd, no overhead
            y = LinearFunction.apply(x2d, weight, bias, fused_relu, kernel)
            if not fused_relu:
                if residual is not None:
                    y = y + residual.reshape(y.shape)
                y = TORCH_ACTIVATIONS[activation](y) if activation else y
        else:
            r2d = None
            if residual is not None:
                r2d = residual.reshape(x2d.shape[0], weight.shape[0])
                if r2d.stride(-1) != 1:
                    r2d = r2d.contiguous()
            kernel, inputs = linear_kernel(x2d, weight, bias, activation, r2d)
            native_memo.note(memo, kernel)
            if kernel.native:
                return fallback()  # PyTorch's own op won: call it as eager code does
            y = kernel(*inputs)[0]
        return y.reshape(*lead, weight.shape[0])

    extra = None if input.dim() >= 1 and input.numel() > 0 else "empty input"
    if residual is not None and residual.shape != (*input.shape[:-1], weight.shape[0]):
        extra = (
            f"residual of shape {tuple(residual.shape)} is not the output's shape "
            f"{(*input.shape[:-1], weight.shape[0])}"
        )
    return _guarded("linear", [input, weight, bias, residual], run, fallback, extra)


# ---- attention -------------------------------------------------------------------------------
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
    """``F.scaled_dot_product_attention`` on [B, H, S, D] tensors (inference; GQA supported)."""

    def fallback() -> torch.Tensor:
        kwargs: dict[str, Any] = {
            "attn_mask": attn_mask,
            "dropout_p": dropout_p,
            "is_causal": is_causal,
            "scale": scale,
        }
        if enable_gqa:
            kwargs["enable_gqa"] = True
        return F.scaled_dot_product_attention(query, key, value, **kwargs)

    extra = None
    if dropout_p:
        extra = "dropout is not supported"
    elif query.dim() != 4:
        extra = f"only 4-D [B, H, S, D] tensors are supported, got {query.dim()}-D"
    elif _grad_wanted(query, key, value):
        extra = "attention backward is not implemented in dnntune"
    elif query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(
            "scaled_dot_product_attention: query and key head counts differ; "
            "pass enable_gqa=True for grouped-query attention"
        )
    elif is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")

    memo = ("sdpa", _sig(query), _sig(key), _sig(value), _sig(attn_mask), is_causal, scale)
    if extra is None and native_memo.hit((*memo, enable_gqa)):
        return fallback()

    def run() -> torch.Tensor:
        mask = attn_mask
        if mask is not None and mask.dim() < 4:
            mask = mask.view(*([1] * (4 - mask.dim())), *mask.shape)
        inputs = [t for t in (query, key, value, mask) if t is not None]
        k = ("sdpa", *(_sig(t) for t in inputs), is_causal, scale)
        kernel = kernel_for(
            k, lambda: sdpa_graph(query, key, value, mask, is_causal, scale), inputs
        )
        native_memo.note((*memo, enable_gqa), kernel)
        return fallback() if kernel.native else kernel(*inputs)[0]

    return _guarded(
        "scaled_dot_product_attention", [query, key, value, attn_mask], run, fallback, extra
    )


# ---- normalisation ---------------------------------------------------------------------------
def _norm(
    kind: str,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    fallback: Callable[[], torch.Tensor],
    memo: Hashable,
) -> torch.Tensor:
    count = len(normalized_shape)
    if tuple(x.shape[x.dim() - count :]) != tuple(normalized_shape):
        raise ValueError(
            f"{kind}: normalized_shape {tuple(normalized_shape)} does not match the "
            f"last dims of input {tuple(x.shape)}"
        )
    full = (1,) * (x.dim() - count) + tuple(normalized_shape)
    w = (
        weight
        if weight is not None
        else torch.ones(normalized_shape, dtype=x.dtype, device=x.device)
    )
    if kind == "layer_norm" and bias is None:
        bias = torch.zeros(normalized_shape, dtype=x.dtype, device=x.device)
    wv = w.reshape(full)
    bv = bias.reshape(full) if bias is not None else None
    xin = x if x.is_contiguous() else x.contiguous()
    inputs = [t for t in (xin, wv, bv) if t is not None]
    key = (kind, *(_sig(t) for t in inputs), count, float(eps))
    kernel = kernel_for(key, lambda: norm_graph(kind, xin, wv, bv, count, eps), inputs)
    native_memo.note(memo, kernel)
    return fallback() if kernel.native else kernel(*inputs)[0]


def _norm_memo(
    kind: str,
    x: torch.Tensor,
    shape: tuple[int, ...],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float | None,
) -> tuple[Any, ...]:
    """The native-memo key of a norm call: its raw arguments' signatures."""
    return (kind, _sig(x), shape, _sig(weight), _sig(bias), eps)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.layer_norm`` (inference; with gradients needed it runs PyTorch's op)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    extra = "layer_norm backward runs in PyTorch" if _grad_wanted(input, weight, bias) else None

    def fallback() -> torch.Tensor:
        return F.layer_norm(input, shape, weight, bias, eps)

    memo = _norm_memo("layer_norm", input, shape, weight, bias, eps)
    if extra is None and native_memo.hit(memo):
        return fallback()
    return _guarded(
        "layer_norm",
        [input, weight, bias],
        lambda: _norm("layer_norm", input, shape, weight, bias, eps, fallback, memo),
        fallback,
        extra,
    )


def rms_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``F.rms_norm`` (inference; eps None means the dtype's machine epsilon, as PyTorch)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    extra = "rms_norm backward runs in PyTorch" if _grad_wanted(input, weight) else None

    def fallback() -> torch.Tensor:
        return F.rms_norm(input, shape, weight, eps)

    memo = _norm_memo("rms_norm", input, shape, weight, None, eps)
    if extra is None and native_memo.hit(memo):
        return fallback()
    eps_value = float(torch.finfo(input.dtype).eps) if eps is None else float(eps)
    return _guarded(
        "rms_norm",
        [input, weight],
        lambda: _norm("rms_norm", input, shape, weight, None, eps_value, fallback, memo),
        fallback,
        extra,
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

    extra = None
    if training or running_mean is None or running_var is None:
        extra = "batch-norm training runs in PyTorch"
    elif _grad_wanted(input, weight, bias):
        extra = "batch-norm backward runs in PyTorch"
    elif input.dim() < 3:
        extra = "inputs need a channel dim and at least one spatial dim"

    def run() -> torch.Tensor:
        assert running_mean is not None and running_var is not None
        c = input.shape[1]
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


# ---- pooling ---------------------------------------------------------------------------------
def _pool(
    op: str,
    mode: ResampleMode,
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None,
    padding: int | Sequence[int],
    fallback: Callable[[], torch.Tensor],
    extra: str | None,
) -> torch.Tensor:
    window = _pair(kernel_size, "kernel_size")
    st = _pair(stride if stride not in (None, ()) else kernel_size, "stride")
    pad = _pair(padding, "padding")

    key = (op, _sig(input), window, st, pad, mode.value)

    def run() -> torch.Tensor:
        kernel = kernel_for(key, lambda: pool_graph(input, mode, window, st, pad), [input])
        native_memo.note(key, kernel)
        return fallback() if kernel.native else kernel(input)[0]

    if extra is None and _grad_wanted(input):
        extra = f"{op} backward runs in PyTorch"
    if extra is None and input.dim() != 4:
        extra = f"only 4-D input is supported, got {input.dim()}-D"
    if extra is None and native_memo.hit(key):
        return fallback()
    return _guarded(op, [input], run, fallback, extra)


def max_pool2d(
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> torch.Tensor:
    """``F.max_pool2d`` (dilation 1, floor mode; other options run in PyTorch)."""

    def fallback() -> torch.Tensor:
        return F.max_pool2d(  # type: ignore[call-overload]
            input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
        )

    extra = None
    if _pair(dilation, "dilation") != (1, 1) or ceil_mode or return_indices:
        extra = "dilation, ceil_mode and return_indices are not supported"
    return _pool(
        "max_pool2d", ResampleMode.MAXPOOL, input, kernel_size, stride, padding, fallback, extra
    )


def avg_pool2d(
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> torch.Tensor:
    """``F.avg_pool2d`` (floor mode, no divisor override; other options run in PyTorch)."""

    def fallback() -> torch.Tensor:
        return F.avg_pool2d(
            input,
            kernel_size,  # type: ignore[arg-type]
            stride,  # type: ignore[arg-type]
            padding,  # type: ignore[arg-type]
            ceil_mode,
            count_include_pad,
            divisor_override,
        )

    extra = None
    if ceil_mode or divisor_override is not None:
        extra = "ceil_mode and divisor_override are not supported"
    mode = (
        ResampleMode.AVGPOOL_INCLUDE_PADDING
        if count_include_pad
        else ResampleMode.AVGPOOL_EXCLUDE_PADDING
    )
    return _pool("avg_pool2d", mode, input, kernel_size, stride, padding, fallback, extra)
