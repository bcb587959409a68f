"""The transformer family of ``_random_models.py``: pre- or post-norm blocks of attention and an
MLP, or PyTorch's own ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention``.

Some blocks take transformers' own module forms instead of PyTorch's, as its decoders write
them (transformers itself is not needed): the RMSNorm of LLaMA's form and the ``ACT2FN``
activation modules, which ``optimize`` recognises (``dnntune.torch._transformers``). Those are
drawn from a side generator seeded by the main one's state, so a seed that draws none of them
builds the model it built before they were added."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Transformer"]


class HFRMSNorm(nn.Module):
    """An RMSNorm in transformers' LlamaRMSNorm form: float32 statistics, the cast back to the
    input's type, then the weight (ones, as transformers starts it; the generator draws it)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GELUActivation(nn.Module):
    """transformers' ``ACT2FN["gelu"]``: PyTorch's GELU kept on the instance."""

    def __init__(self) -> None:
        super().__init__()
        self.act = F.gelu

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(input)


class SiLUActivation(nn.Module):
    """transformers' ``ACT2FN["silu"]``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.silu(input)


# where transformers keeps them (what optimize reads, with the class's own forward)
GELUActivation.__module__ = SiLUActivation.__module__ = "transformers.activations"


class QuickGELU(nn.Module):
    """CLIP's activation, written out (recognised by what it computes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class NewGELU(nn.Module):
    """GPT-2's ``gelu_new``, written out: the tanh GELU."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inner = 0.7978845608028654 * (input + 0.044715 * torch.pow(input, 3.0))
        return 0.5 * input * (1.0 + torch.tanh(inner))


class Swish(nn.Module):
    """A research repo's SiLU, written out, with an ``inplace`` setting it leaves off."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(x.sigmoid()) if self.inplace else x * x.sigmoid()


#: the written-out module for each MLP kind that has one
_WRITTEN: dict[str, Callable[[], nn.Module]] = {
    "gelu_tanh": NewGELU,
    "silu": Swish,
    "gated": Swish,
    "relu_module": QuickGELU,  # then the MLP's activation is CLIP's, not a ReLU
}


class Conv1D(nn.Module):
    """transformers' ``Conv1D`` (GPT-2's linear layer, its weight stored [in, out]), in its
    module and under its name, with its arithmetic."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.randn(nx, nf) / nx**0.5)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)  # noqa: RUF005 (transformers writes it so)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


Conv1D.__module__ = "transformers.pytorch_utils"


def _side(rng: random.Random) -> random.Random:
    """A generator for the draws added after the family was fixed, seeded by ``rng``'s state
    without drawing from it."""
    return random.Random(
        hash(rng.getstate()[1])
    )  # the words: a tuple of ints hashes alike in every process


class Attention(nn.Module):
    def __init__(self, rng: random.Random, d: int) -> None:
        super().__init__()
        self.heads = rng.choice([1, 2, 4])
        self.fused_qkv = rng.random() < 0.5
        if self.fused_qkv:
            self.qkv = nn.Linear(d, 3 * d, bias=rng.random() < 0.5)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.causal = rng.random() < 0.4
        self.mask = "none" if self.causal else rng.choice(["none", "bool", "additive"])
        self.scale = rng.choice([None, None, 0.3])
        self.desc = (
            f"Attention(h{self.heads} {'qkv' if self.fused_qkv else 'q,k,v'} "
            f"causal={self.causal} mask={self.mask} scale={self.scale})"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h, hd = self.heads, d // self.heads
        if self.fused_qkv:
            q, k, v = self.qkv(x).view(b, s, 3, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (p(x).view(b, s, h, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        mask = None
        if self.mask == "bool":
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        elif self.mask == "additive":
            mask = torch.zeros(b, 1, s, s, device=x.device, dtype=x.dtype)
            mask[..., : s // 2] = -1e4 if s > 1 else 0.0
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale
        )
        out: torch.Tensor = self.o(a.transpose(1, 2).reshape(b, s, d))
        return out


class MLP(nn.Module):
    def __init__(self, rng: random.Random, d: int) -> None:
        super().__init__()
        self.kind = rng.choice(["gelu", "gelu_tanh", "silu", "gated", "relu_module"])
        self.up = nn.Linear(d, 2 * d, bias=rng.random() < 0.6)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d)
        self.relu = nn.ReLU()
        # transformers' activation module in place of the function (LLaMA's gated MLP, BERT's)
        self.act: nn.Module | None = None
        if self.kind in ("gelu", "silu", "gated") and _side(rng).random() < 0.4:
            self.act = GELUActivation() if self.kind == "gelu" else SiLUActivation()
        hf = " transformers act" if self.act is not None else ""
        # an activation module written out in Python (CLIP's QuickGELU, GPT-2's gelu_new, a
        # Swish), and GPT-2's Conv1D layers in place of the linears (a draw of its own)
        written = _side(_side(_side(rng)))
        if self.act is None and self.kind in _WRITTEN and written.random() < 0.3:
            self.act = _WRITTEN[self.kind]()
            hf = f" written {type(self.act).__name__}"
        if written.random() < 0.25:
            self.up = Conv1D(2 * d, d)
            self.gate = Conv1D(2 * d, d)
            self.down = Conv1D(d, 2 * d)
            hf += " Conv1D"
        # dropout written as a function of the mode (Whisper's and OPT's layers), and a branch
        # on it: the forward traces otherwise in training (p=0 keeps a train step
        # deterministic; the branch scales by 1 in value but not in the trace)
        self.functional_dropout = _side(_side(rng)).random() < 0.35
        self.p = 0.0
        fd = " F.dropout(training=self.training)" if self.functional_dropout else ""
        self.desc = f"MLP({self.kind}{hf}{fd})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None and self.kind == "gated":
            h = self.act(self.gate(x)) * self.up(x)
        elif self.act is not None:
            h = self.act(self.up(x))
        elif self.kind == "gelu":
            h = F.gelu(self.up(x))
        elif self.kind == "gelu_tanh":
            h = F.gelu(self.up(x), approximate="tanh")
        elif self.kind == "silu":
            h = F.silu(self.up(x))
        elif self.kind == "gated":
            h = F.silu(self.gate(x)) * self.up(x)
        else:
            h = self.relu(self.up(x))
        if self.functional_dropout:
            h = F.dropout(h, p=self.p, training=self.training)
            if self.training:
                h = h * 1.0
        out: torch.Tensor = self.down(h)
        return out


class Block(nn.Module):
    def __init__(self, rng: random.Random, d: int) -> None:
        super().__init__()
        norm = rng.choice(["layer_norm", "rms_norm", "layer_norm_no_affine"])
        if norm == "rms_norm" and _side(rng).random() < 0.5:
            norm = "transformers_rms_norm"
        make: dict[str, Callable[[], nn.Module]] = {
            "layer_norm": lambda: nn.LayerNorm(d),
            "rms_norm": lambda: nn.RMSNorm(d),
            "transformers_rms_norm": lambda: HFRMSNorm(d),
            "layer_norm_no_affine": lambda: nn.LayerNorm(d, elementwise_affine=False),
        }
        self.n1, self.n2 = make[norm](), make[norm]()
        self.attn = Attention(rng, d)
        self.mlp: nn.Module = MLP(rng, d)
        mlp_desc = self.mlp.desc
        if rng.random() < 0.25:  # torchvision's MLPBlock: a Sequential ending in a dropout
            self.mlp = nn.Sequential(
                nn.Linear(d, 2 * d),
                nn.GELU(),
                nn.Dropout(0.0),
                nn.Linear(2 * d, d),
                nn.Dropout(0.0),
            )
            mlp_desc = "MLP(sequential)"
        # a module that is the identity in eval mode between the MLP and the add (Swin's
        # stochastic depth); p=0 keeps a train step deterministic
        self.drop = nn.Dropout(0.0) if rng.random() < 0.3 else nn.Identity()
        self.pre_norm = rng.random() < 0.7
        self.add = rng.choice(["+", "+="])
        self.desc = (
            f"Block({norm} {'pre' if self.pre_norm else 'post'}-norm add {self.add} "
            f"{self.attn.desc} {mlp_desc}{' dropout' if isinstance(self.drop, nn.Dropout) else ''})"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.pre_norm:
            x = self.n1(x + self.attn(x))
            out: torch.Tensor = self.n2(x + self.mlp(x))
            return out
        if self.add == "+":
            x = x + self.attn(self.n1(x))
            return x + self.drop(self.mlp(self.n2(x)))
        h = x.clone()  # writes go to copies: each norm's backward reads its input
        h += self.attn(self.n1(x))
        out = h.clone()
        out += self.mlp(self.n2(h))
        return out


class MHABlock(nn.Module):
    """``x + mha(n(x), n(x), n(x))[0]`` with PyTorch's ``nn.MultiheadAttention`` (torchvision's
    ViT): its packed projection, its own call of ``scaled_dot_product_attention`` (which
    ``optimize`` routes), batch first or not, a causal or key-padding mask."""

    def __init__(self, rng: random.Random, d: int) -> None:
        super().__init__()
        self.batch_first = rng.random() < 0.6
        self.norm = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(
            d, rng.choice([1, 2, 4]), batch_first=self.batch_first, bias=rng.random() < 0.8
        )
        self.mask = rng.choice(["none", "causal", "key_padding"])
        self.desc = f"MHABlock(batch_first={self.batch_first} mask={self.mask})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        s = h.shape[1 if self.batch_first else 0]
        causal = None
        if self.mask == "causal":
            causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        padding = None
        if self.mask == "key_padding" and s > 1:
            padding = torch.zeros(x.shape[0], s, dtype=torch.bool, device=x.device)
            padding[:, -1] = True  # the last key of every sequence is padding
        a = self.mha(h, h, h, need_weights=False, attn_mask=causal, key_padding_mask=padding)[0]
        if not self.batch_first:
            a = a.transpose(0, 1)
        out: torch.Tensor = x + a
        return out


def _torch_layer(rng: random.Random, d: int) -> nn.Module:
    """PyTorch's own ``nn.TransformerEncoderLayer`` (its eval-mode fast path, its training
    path), or ``MHABlock``."""
    if rng.random() < 0.5:
        return MHABlock(rng, d)
    norm_first, act = rng.random() < 0.5, rng.choice(["relu", "gelu"])
    layer = nn.TransformerEncoderLayer(
        d,
        rng.choice([1, 2, 4]),
        dim_feedforward=2 * d,
        dropout=0.0,
        activation=act,
        batch_first=True,
        norm_first=norm_first,
    )
    layer.desc = f"TransformerEncoderLayer(norm_first={norm_first} {act})"
    return layer


class Transformer(nn.Module):
    def __init__(self, rng: random.Random, d_in: int) -> None:
        super().__init__()
        d = rng.choice([8, 16, 32])
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(
            *[
                Block(rng, d) if rng.random() < 0.7 else _torch_layer(rng, d)
                for _ in range(rng.randint(1, 3))
            ]
        )
        self.out = nn.Linear(d, 5)
        self.desc = " > ".join(str(b.desc) for b in self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.blocks(self.inp(x)))
        return out
