"""torchvision's Swin window attention as the tests need it without torchvision (CI has none):
``ShiftedWindowAttention`` and its module-level ``shifted_window_attention`` written out with
torchvision 0.26's behaviour (explicit matmuls, the bias and a -100 shift mask added, a shift
set to 0 in the module's own list where one window covers the map, ``F.dropout`` called with
its default ``training=True``), in a module object registered as
``torchvision.models.swin_transformer`` (:func:`as_torchvision`)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

LIBRARY = "torchvision.models.swin_transformer"


def shifted_window_attention(
    input: torch.Tensor,
    qkv_weight: torch.Tensor,
    proj_weight: torch.Tensor,
    relative_position_bias: torch.Tensor,
    window_size: list[int],
    num_heads: int,
    shift_size: list[int],
    attention_dropout: float = 0.0,
    dropout: float = 0.0,
    qkv_bias: torch.Tensor | None = None,
    proj_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    b, h, w, c = input.shape
    pad_w = (window_size[1] - w % window_size[1]) % window_size[1]
    pad_h = (window_size[0] - h % window_size[0]) % window_size[0]
    x = F.pad(input, (0, 0, 0, pad_w, 0, pad_h))
    ph, pw = x.shape[1], x.shape[2]
    for i, size in enumerate((ph, pw)):
        if window_size[i] >= size:
            shift_size[i] = 0
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
    gh, gw = ph // window_size[0], pw // window_size[1]
    n = window_size[0] * window_size[1]
    x = x.view(b, gh, window_size[0], gw, window_size[1], c).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(b * gh * gw, n, c)
    qkv = F.linear(x, qkv_weight, qkv_bias).reshape(x.size(0), n, 3, num_heads, c // num_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    attn = (q * (c // num_heads) ** -0.5).matmul(k.transpose(-2, -1)) + relative_position_bias
    if sum(shift_size) > 0:
        labels = x.new_zeros((ph, pw))
        spans = [
            ((0, -window_size[i]), (-window_size[i], -shift_size[i]), (-shift_size[i], None))
            for i in range(2)
        ]
        count = 0
        for top, bottom in spans[0]:
            for left, right in spans[1]:
                labels[top:bottom, left:right] = count
                count += 1
        labels = labels.view(gh, window_size[0], gw, window_size[1]).permute(0, 2, 1, 3)
        labels = labels.reshape(gh * gw, n)
        mask = labels.unsqueeze(1) - labels.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        attn = attn.view(b, gh * gw, num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_heads, n, n)
    attn = F.dropout(F.softmax(attn, dim=-1), p=attention_dropout)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), n, c)
    x = F.dropout(F.linear(x, proj_weight, proj_bias), p=dropout)
    x = x.view(b, gh, gw, window_size[0], window_size[1], c).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, ph, pw, c)
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(shift_size[0], shift_size[1]), dims=(1, 2))
    return x[:, :h, :w, :].contiguous()


class ShiftedWindowAttention(nn.Module):
    def __init__(
        self,
        dim: int,
        window_size: list[int],
        shift_size: list[int],
        num_heads: int,
        attention_dropout: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.window_size, self.shift_size, self.num_heads = window_size, shift_size, num_heads
        self.attention_dropout, self.dropout = attention_dropout, dropout
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        wh, ww = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * wh - 1) * (2 * ww - 1), num_heads) * 0.5
        )
        coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij"))
        flat = coords.flatten(1)
        rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += wh - 1
        rel[:, :, 1] += ww - 1
        rel[:, :, 0] *= 2 * ww - 1
        self.register_buffer("relative_position_index", rel.sum(-1).flatten())

    def get_relative_position_bias(self) -> torch.Tensor:
        n = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index]
        return bias.view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _module().shifted_window_attention(
            x,
            self.qkv.weight,
            self.proj.weight,
            self.get_relative_position_bias(),
            self.window_size,
            self.num_heads,
            shift_size=self.shift_size,
            attention_dropout=self.attention_dropout,
            dropout=self.dropout,
            qkv_bias=self.qkv.bias,
            proj_bias=self.proj.bias,
        )


class SwinBlock(nn.Module):
    """A Swin block as torchvision's ``SwinTransformerBlock`` runs in eval mode."""

    def __init__(self, dim: int, heads: int, window: list[int], shift: list[int]) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ShiftedWindowAttention(dim, window, shift, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


for _obj in (shifted_window_attention, ShiftedWindowAttention, SwinBlock):
    _obj.__module__ = LIBRARY
for _fn in (ShiftedWindowAttention.forward, ShiftedWindowAttention.get_relative_position_bias):
    _fn.__module__ = LIBRARY


def _module() -> types.ModuleType:
    return sys.modules[LIBRARY]


@contextmanager
def as_torchvision() -> Iterator[types.ModuleType]:
    """This file's classes and function as ``torchvision.models.swin_transformer`` while the
    block runs (the real one, if installed, is put back after)."""
    before = sys.modules.get(LIBRARY)
    fake = types.ModuleType(LIBRARY)
    fake.shifted_window_attention = shifted_window_attention  # type: ignore[attr-defined]
    fake.ShiftedWindowAttention = ShiftedWindowAttention  # type: ignore[attr-defined]
    sys.modules[LIBRARY] = fake
    try:
        yield fake
    finally:
        if before is None:
            sys.modules.pop(LIBRARY, None)
        else:
            sys.modules[LIBRARY] = before
