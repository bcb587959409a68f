"""An attention as transformers' LLaMA-family files write theirs: a module-level
``apply_rotary_pos_emb`` in the rotate-half form (with a docstring, as theirs), and its
``rotate_half``; and one with the interleaved form, which dnntune leaves alone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):  # type: ignore[no-untyped-def]
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    """Applies the rotary embedding to the query and key tensors."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def rotary_tables(seq: int, dim: int, batch: int = 1, **like: Any) -> tuple[torch.Tensor, ...]:
    """cos and sin of ``[batch, seq, dim]``, as transformers' rotary embedding makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)[None].expand(batch, -1, -1)
    return emb.cos().to(**like), emb.sin().to(**like)


class Attention(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        shape = (b, s, self.heads, d // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))
