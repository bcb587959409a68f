"""PyTorch's own ops for dnntune.torch's functional ops: what a call runs when it falls back,
when PyTorch's op is the chosen plan, or while PyTorch records a program; and the activation
functions a fused call's unfused path applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["TORCH_ACTIVATIONS", "conv2d_torch", "epilogue", "linear_torch", "sdpa_torch"]

#: PyTorch's own op for each fusable activation name (what a fall-back or unfused path runs)
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
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
    return epilogue(
        F.conv2d(input, weight, bias, stride, padding, dilation, groups), residual, activation
    )


def linear_torch(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """PyTorch's own ops for :func:`dnntune.torch.functional.linear`."""
    return epilogue(F.linear(input, weight, bias), residual, activation)


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
    if enable_gqa:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True
        )
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )
