"""An SDPA attention written in the shape of transformers' ``integrations.sdpa_attention``
(5.x): it asks ``use_gqa_in_sdpa`` whether PyTorch may share the key/value heads, and repeats
them when told no. Registered under transformers' module name by the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: how often the heads were repeated (the copy the route avoids)
repeats = [0]


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    repeats[0] += 1
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, times, s, d).reshape(b, h * times, s, d)


def use_gqa_in_sdpa(
    attention_mask: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor
) -> bool:
    return attention_mask is None and key.shape[-1] == value.shape[-1] <= 256


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    extra = {}
    if module.num_key_value_groups > 1:
        if use_gqa_in_sdpa(attention_mask, key, value):
            extra = {"enable_gqa": True}
        else:
            key = repeat_kv(key, module.num_key_value_groups)
            value = repeat_kv(value, module.num_key_value_groups)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, **extra
    )
    return out.transpose(1, 2).contiguous()


def sdpa_without_gqa(module: nn.Module, *qkv_mask: torch.Tensor) -> torch.Tensor:
    """Another function of the module, which never passes ``enable_gqa``."""
    query, key, value, mask = qkv_mask
    n = module.num_key_value_groups
    return F.scaled_dot_product_attention(query, repeat_kv(key, n), repeat_kv(value, n), mask)


class Attention(nn.Module):
    """Grouped-query attention over a preallocated cache (a decode step's shape): 8 query
    heads share 2 key/value heads."""

    def __init__(self, width: int = 64, heads: int = 8, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, width // heads
        self.num_key_value_groups = heads // kv_heads
        self.q = nn.Linear(width, heads * self.dim)
        self.o = nn.Linear(heads * self.dim, width)

    def forward(
        self, x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        out = sdpa_attention_forward(self, q, key, value, mask)
        return self.o(out.reshape(b, s, -1))


#: the predicate as written (the route replaces the module's global)
written_use_gqa_in_sdpa = use_gqa_in_sdpa
