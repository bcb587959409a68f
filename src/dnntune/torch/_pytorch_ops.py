"""PyTorch's own ops for dnntune.torch's functional ops: what a call runs when it falls back,
when PyTorch's op is the chosen plan, or while PyTorch records a program; and the activation
functions a fused call's unfused path applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format

from dnntune.providers._torch.sdpa import grouped, grouped_masked
from dnntune.torch._support import tracing

__all__ = [
    "QUICK_GELU_BETA",
    "TORCH_ACTIVATIONS",
    "conv2d_torch",
    "epilogue",
    "linear_torch",
    "sdpa_torch",
]

#: the slope of CLIP's QuickGELU, ``x * sigmoid(1.702 * x)``: a swish (SiLU) with this beta
QUICK_GELU_BETA = 1.702

#: PyTorch's own op for each fusable activation name (what a fall-back or unfused path runs)
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    # as CLIP's QuickGELU and transformers' QuickGELUActivation write it
    "quick_gelu": lambda t: t * torch.sigmoid(QUICK_GELU_BETA * t),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def epilogue(
    y: torch.Tensor, residual: torch.Tensor | None, activation: str | None
) -> torch.Tensor:
    """``activation(y + residual)`` with PyTorch's ops (either part None: left out)."""
    if residual is not None:
        y = y + residual
    return TORCH_ACTIVATIONS[activation](y) if activation else y


def conv2d_torch(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    activation: str | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """PyTorch's own ops for :func:`dnntune.torch.functional.conv2d` (what a fall-back or a
    native winner runs)."""
    if (
        input.is_cpu
        and torch.is_grad_enabled()
        and not tracing()  # a recorded program keeps PyTorch's op as the user wrote it
        and _strided_channels_last(input, weight, stride)
    ):
        # PyTorch's CPU (oneDNN) weight gradient of a strided channels-last convolution is
        # wrong (torch 2.13: a 1x1 filter at stride 2 over 12x12, float32, on every call; over
        # 8x8 on some; one thread has corrupted the heap), eager PyTorch's as well: on NCHW
        # copies it is exact (the provider's lower_conv_wgrad does the same for its graphs);
        # the output and the gradients are laid out as PyTorch's would be (channels-last)
        x, w = _nchw(input), _nchw(weight)
        y = F.conv2d(x, w, bias, stride, padding, dilation, groups)
        y = y.contiguous(memory_format=torch.channels_last)
    else:
        y = F.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return epilogue(y, residual, activation)


def _strided_channels_last(input: torch.Tensor, weight: torch.Tensor, stride: Any) -> bool:
    """A 4-D convolution with a stride above 1 that PyTorch runs channels-last (its input or
    weight is, by PyTorch's reading of their strides), a gradient wanted of either."""
    if not (input.requires_grad or weight.requires_grad) or input.dim() != 4:
        return False
    strided = any(s > 1 for s in stride) if isinstance(stride, (tuple, list)) else stride > 1
    return strided and (
        suggest_memory_format(input) is torch.channels_last
        or suggest_memory_format(weight) is torch.channels_last
    )


def _nchw(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied with strides PyTorch reads as NCHW (a 1x1 filter can be contiguous and
    read as channels-last: ``contiguous()`` would keep it), its gradient channels-last."""
    out: torch.Tensor = _NCHWCopy.apply(t)
    return out


class _NCHWCopy(torch.autograd.Function):
    """A tensor copied NCHW; its gradient handed back channels-last, as PyTorch's
    channels-last convolution gives its operands' (differentiable again: ``create_graph``)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        return grads[0].contiguous(memory_format=torch.channels_last)


def linear_torch(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
    multiplier: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch's own ops for :func:`dnntune.torch.functional.linear`."""
    y = epilogue(F.linear(input, weight, bias), residual, activation)
    return y if multiplier is None else y * multiplier


def sdpa_torch(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """PyTorch's own op for :func:`dnntune.torch.functional.scaled_dot_product_attention`."""
    if enable_gqa and attn_mask is not None and not is_causal and grouped(query, key, value):
        return grouped_masked(query, key, value, attn_mask, dropout_p, scale)
    if enable_gqa:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True
        )
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )
