"""An attention whose ``apply_rotary_pos_emb`` is another form (interleaved pairs, GPT-J's):
not the rotate-half form, so dnntune does not route it."""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x):  # type: ignore[no-untyped-def]
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class Attention(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.proj(x)[:, None]
        q, k = apply_rotary_pos_emb(q, q, cos, sin)
        return q + k
