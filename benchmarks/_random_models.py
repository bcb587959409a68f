"""Random models for ``model_conformance.py``: the patterns ``dnntune.torch.optimize`` rewrites
and routes, written the ways model code writes them, drawn from one seed.

A CNN chains conv + batch norm + activation blocks (a Sequential or a forward, every activation
spelling, depthwise, dilated, ``padding="same"``), residual blocks (the shortcut added in each
spelling: ``+=``, ``+``, ``torch.add``, ``.add_``, into the shortcut's own copy; a branch output
used twice), squeeze-excitation, pooling, an in-place residual (``h += f(x)``), a DenseNet
concatenation, a conv + batch norm called twice and an MBConv block (nested Sequentials,
dropout before the residual add), then a head.
A transformer chains pre- or post-norm blocks (LayerNorm, RMSNorm, no affine) of attention
(fused QKV or three projections, causal, boolean or additive masks, a scale) and an MLP (GELU,
tanh GELU, SiLU, gated, a ReLU module, a Sequential ending in a dropout), some with a dropout
between the MLP and its residual add; or PyTorch's own layers: ``nn.TransformerEncoderLayer``
and ``nn.MultiheadAttention`` with causal or key-padding masks. Some models get a forward hook
that changes a layer's output, or a frozen backbone (only the last layer trains). Everything is
deterministic from the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Case", "make_case"]

_ACTIVATIONS = (
    "relu",
    "relu_inplace",
    "F.relu",
    "torch.relu",
    "method_relu",
    "silu",
    "F.silu",
    "gelu",
    "gelu_tanh",
    "sigmoid",
    "hardswish",
    "relu6",
    "tanh",
    "leaky_relu",
    "none",
)


def _act_module(name: str) -> nn.Module:
    modules: dict[str, Callable[[], nn.Module]] = {
        "relu": nn.ReLU,
        "relu_inplace": lambda: nn.ReLU(inplace=True),
        "silu": nn.SiLU,
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "sigmoid": nn.Sigmoid,
        "hardswish": nn.Hardswish,
        "relu6": nn.ReLU6,
        "tanh": nn.Tanh,
        "leaky_relu": lambda: nn.LeakyReLU(0.1),
    }
    return modules.get(name, nn.Identity)()


def _activate(name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The activation ``name`` as model code spells it (a function, a method or the module)."""
    if name == "F.relu":
        return F.relu(x)
    if name == "torch.relu":
        return torch.relu(x)
    if name == "method_relu":
        return x.relu()
    if name == "F.silu":
        return F.silu(x)
    out: torch.Tensor = module(x)
    return out


class ConvBNAct(nn.Module):
    def __init__(self, rng: random.Random, cin: int, cout: int, stride: int, size: int) -> None:
        super().__init__()
        k = rng.choice([1, 3, 3, 5] if size >= 5 else [1, 3])
        groups = cin if cin == cout and rng.random() < 0.3 else 1
        dilation = rng.choice([1, 1, 1, 2]) if k > 1 and size >= 9 else 1
        pad = rng.choice(["symmetric", "symmetric", "same", "none"]) if stride == 1 else "symmetric"
        padding: int | str = {"symmetric": dilation * (k // 2), "same": "same", "none": 0}[pad]
        self.conv = nn.Conv2d(
            cin, cout, k, stride, padding, dilation, groups, bias=rng.random() < 0.4
        )
        self.bn = nn.BatchNorm2d(cout) if rng.random() < 0.8 else None
        self.act_name = rng.choice(_ACTIVATIONS)
        self.act = _act_module(self.act_name)
        self.sequential = self.bn is not None and rng.random() < 0.3
        if self.sequential:
            self.body = nn.Sequential(self.conv, self.bn, self.act)
        self.desc = (
            f"ConvBNAct(k{k} s{stride} g{groups} d{dilation} {pad} bn={self.bn is not None} "
            f"{self.act_name}{' sequential' if self.sequential else ''})"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequential:
            out: torch.Tensor = self.body(x)
            return out
        y = self.conv(x)
        if self.bn is not None:
            y = self.bn(y)
        return _activate(self.act_name, self.act, y)


class Residual(nn.Module):
    def __init__(self, rng: random.Random, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, rng.choice([1, 3]), 1, "same", bias=rng.random() < 0.3)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )
        self.add = rng.choice(["+=", "+", "r+", "torch.add", "add_", "into_shortcut"])
        self.act_name = rng.choice(
            ["relu", "relu_inplace", "F.relu", "torch.relu", "method_relu", "silu", "none"]
        )
        self.act = _act_module(self.act_name)
        self.branch_reused = rng.random() < 0.15
        self.desc = (
            f"Residual(s{stride} {cin}->{cout} add {self.add} {self.act_name}"
            f"{' branch reused' if self.branch_reused else ''})"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.down is None else self.down(x)
        out = F.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        branch = out
        if self.add == "+=":
            out += shortcut
        elif self.add == "+":
            out = out + shortcut
        elif self.add == "r+":
            out = shortcut + out
        elif self.add == "torch.add":
            out = torch.add(out, shortcut)
        elif self.add == "add_":
            out = out.add_(shortcut)
        else:
            shortcut = shortcut.clone()
            shortcut += out
            out = shortcut
        out = _activate(self.act_name, self.act, out)
        if self.branch_reused:
            out = out + 0.5 * branch
        return out


class SqueezeExcite(nn.Module):
    def __init__(self, rng: random.Random, c: int) -> None:
        super().__init__()
        r = max(1, c // 4)
        self.fc1 = nn.Conv2d(c, r, 1)
        self.fc2 = nn.Conv2d(r, c, 1)
        self.act = nn.SiLU() if rng.random() < 0.5 else nn.ReLU()
        self.gate = rng.choice(["sigmoid", "hardsigmoid"])
        self.desc = f"SqueezeExcite({c}/{r} {self.gate})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        s = torch.sigmoid(s) if self.gate == "sigmoid" else F.hardsigmoid(s)
        return x * s


class MBConv(nn.Module):
    """torchvision's MBConv and MobileNetV3 block: a Sequential of conv + batch norm (+
    activation) Sequentials (expand, depthwise, squeeze-excitation, project), a module that is
    the identity in eval mode (dropout at p=0 here, so that a train step is deterministic),
    then the residual add."""

    def __init__(self, rng: random.Random, c: int) -> None:
        super().__init__()
        e = rng.choice([1, 2, 4])
        h = c * e
        act = rng.choice(["silu", "relu", "hardswish"])
        layers: list[nn.Module] = []
        if e != 1:
            layers.append(
                nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), _act_module(act))
            )
        layers.append(
            nn.Sequential(
                nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False),
                nn.BatchNorm2d(h),
                _act_module(act),
            )
        )
        if rng.random() < 0.5:
            layers.append(SqueezeExcite(rng, h))
        layers.append(nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c)))
        self.block = nn.Sequential(*layers)
        self.drop_name = rng.choice(["Dropout", "Dropout2d", "Identity", "none"])
        self.drop: nn.Module | None = {
            "Dropout": lambda: nn.Dropout(0.0),
            "Dropout2d": lambda: nn.Dropout2d(0.0),
            "Identity": nn.Identity,
            "none": lambda: None,
        }[self.drop_name]()
        self.add = rng.choice(["+=", "+", "r+"])
        self.desc = f"MBConv({c}x{e} {act} {self.drop_name} add {self.add})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.drop is not None:
            result = self.drop(result)
        if self.add == "+=":
            result += x
        elif self.add == "+":
            result = result + x
        else:
            result = x + result
        return result


class Pool(nn.Module):
    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        kind = rng.choice(["max", "avg", "avg_exclude_pad", "max_ceil", "avg_ceil"])
        k, s = rng.choice([2, 3]), rng.choice([1, 2])
        p = rng.choice([0, 1]) if k == 3 else 0
        self.pool = {
            "max": lambda: nn.MaxPool2d(k, s, p),
            "avg": lambda: nn.AvgPool2d(k, s, p),
            "avg_exclude_pad": lambda: nn.AvgPool2d(k, s, p, count_include_pad=False),
            "max_ceil": lambda: nn.MaxPool2d(k, s, p, ceil_mode=True),
            "avg_ceil": lambda: nn.AvgPool2d(k, s, p, ceil_mode=True),
        }[kind]()
        self.desc = f"Pool({kind} k{k} s{s} p{p})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.pool(x)
        return out


class InPlaceResidual(nn.Module):
    """``h += f(x)``, ``h`` a copy of ``x``: the add writes the residual (no fusion may take
    it)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)
        self.bn = nn.BatchNorm2d(c)
        self.desc = "InPlaceResidual"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.clone()  # the write goes to a copy: the conv's backward reads x
        h += self.bn(self.conv(x))
        return torch.relu(h)


class DenseConcat(nn.Module):
    """``cat([x, act(bn(conv(x)))], 1)``, DenseNet's growth: the block's output is wider."""

    def __init__(self, rng: random.Random, c: int, growth: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, growth, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(growth)
        self.act = nn.ReLU(inplace=rng.random() < 0.5)
        self.desc = f"DenseConcat({c}+{growth})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.act(self.bn(self.conv(x)))], 1)


class SharedConv(nn.Module):
    """One conv + batch norm called twice in the forward (weights shared)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)
        self.bn = nn.BatchNorm2d(c)
        self.desc = "SharedConv"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.conv(x)))
        return self.bn(self.conv(y)) + x


class CNN(nn.Module):
    def __init__(self, rng: random.Random, cin: int, size: int) -> None:
        super().__init__()
        c = rng.choice([4, 8, 16])
        stride = rng.choice([1, 2])
        layers: list[nn.Module] = [ConvBNAct(rng, cin, c, stride, size)]
        size = -(-size // stride)  # at most: a layer's own padding may take one row more
        for _ in range(rng.randint(1, 5)):
            kinds = ["conv", "residual", "residual", "se", "in_place", "dense", "shared", "mb"]
            kind = rng.choice([*kinds, "pool"] if size >= 6 else kinds)
            stride = rng.choice([1, 1, 2]) if size >= 6 else 1
            if kind == "conv":
                cout = rng.choice([c, 2 * c])
                layers.append(ConvBNAct(rng, c, cout, stride, size))
                c = cout
            elif kind == "residual":
                cout = rng.choice([c, c, 2 * c])
                layers.append(Residual(rng, c, cout, stride))
                c = cout
            elif kind == "se":
                layers.append(SqueezeExcite(rng, c))
                stride = 1
            elif kind == "pool":
                layers.append(Pool(rng))
                stride = 2
            elif kind == "dense":
                growth = rng.choice([4, 8])
                layers.append(DenseConcat(rng, c, growth))
                c, stride = c + growth, 1
            elif kind == "mb":
                layers.append(MBConv(rng, c))
                stride = 1
            elif kind == "shared":
                layers.append(SharedConv(c))
                stride = 1
            else:
                layers.append(InPlaceResidual(c))
                stride = 1
            size = max(1, size // stride - 1) if stride > 1 else size
        self.features = nn.Sequential(*layers)
        self.head = rng.choice(["linear", "linear_gelu", "conv1x1"])
        self.fc0 = nn.Linear(c, c)
        self.fc: nn.Module = nn.Conv2d(c, 10, 1) if self.head == "conv1x1" else nn.Linear(c, 10)
        self.desc = " > ".join(str(m.desc) for m in layers) + f" > head {self.head}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x)
        if self.head == "conv1x1":
            out: torch.Tensor = self.fc(y).mean((2, 3))
            return out
        y = torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)
        if self.head == "linear_gelu":
            y = F.gelu(self.fc0(y))
        out = self.fc(y)
        return out


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
        self.desc = f"MLP({self.kind})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "gelu":
            h = F.gelu(self.up(x))
        elif self.kind == "gelu_tanh":
            h = F.gelu(self.up(x), approximate="tanh")
        elif self.kind == "silu":
            h = F.silu(self.up(x))
        elif self.kind == "gated":
            h = F.silu(self.gate(x)) * self.up(x)
        else:
            h = self.relu(self.up(x))
        out: torch.Tensor = self.down(h)
        return out


class Block(nn.Module):
    def __init__(self, rng: random.Random, d: int) -> None:
        super().__init__()
        norm = rng.choice(["layer_norm", "rms_norm", "layer_norm_no_affine"])
        make: dict[str, Callable[[], nn.Module]] = {
            "layer_norm": lambda: nn.LayerNorm(d),
            "rms_norm": lambda: nn.RMSNorm(d),
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


@dataclass
class Case:
    """One drawn model and how to draw its inputs (``make_input(batch)``, from ``generator``)."""

    seed: int
    model: nn.Module
    make_input: Callable[[int], torch.Tensor]
    batch: int
    channels_last_model: bool
    channels_last_input: bool
    desc: str


def make_case(seed: int, device: str, dtype: torch.dtype) -> Case:
    """The model of ``seed``, in eval mode, with random weights and batch-norm statistics."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    cnn = rng.random() < 0.55
    model: nn.Module
    make: Callable[[int], torch.Tensor]
    if cnn:
        cin, hw = rng.choice([1, 3, 4]), rng.choice([7, 8, 12, 15])
        model = CNN(rng, cin, hw)
        make = lambda b: torch.randn(b, cin, hw, hw, generator=g)  # noqa: E731
    else:
        d_in, s = rng.choice([8, 12]), rng.choice([1, 5, 8])
        model = Transformer(rng, d_in)
        make = lambda b: torch.randn(b, s, d_in, generator=g)  # noqa: E731
    model.load_state_dict(random_state(model, g))
    extras = _decorate(model, rng)
    cl_model = cnn and rng.random() < 0.3
    cl_input = cnn and rng.random() < 0.3
    model = model.to(device=device, dtype=dtype)
    if cl_model:
        model = model.to(memory_format=torch.channels_last)

    def make_input(batch: int) -> torch.Tensor:
        x = make(batch).to(device=device, dtype=dtype)
        return x.to(memory_format=torch.channels_last) if cl_input else x

    desc = (
        f"{'CNN' if cnn else 'Transformer'}"
        f"{' channels_last model' if cl_model else ''}{' channels_last input' if cl_input else ''}"
        f"{''.join(' ' + e for e in extras)}: {model.desc}"
    )
    return Case(seed, model.eval(), make_input, rng.choice([1, 2, 3]), cl_model, cl_input, desc)


def _halve(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    """A forward hook that changes its layer's output (a fused call must still run it)."""
    return output * 0.5


def _decorate(model: nn.Module, rng: random.Random) -> list[str]:
    """What a user adds to a model: a forward hook on a layer, a frozen backbone (only the last
    layer trains, as in fine-tuning)."""
    extras = []
    layers = [m for m in model.modules() if type(m) in (nn.Conv2d, nn.Linear)]
    if rng.random() < 0.15:
        rng.choice(layers).register_forward_hook(_halve)
        extras.append("hooked layer")
    if rng.random() < 0.2:
        last = layers[-1]
        for p in model.parameters():
            p.requires_grad_(False)
        for p in last.parameters():
            p.requires_grad_(True)
        extras.append("frozen backbone")
    return extras


def random_state(model: nn.Module, g: torch.Generator) -> dict[str, torch.Tensor]:
    """New weights and batch-norm statistics for ``model`` (on the CPU, in float32)."""
    state = {}
    for name, value in model.state_dict().items():
        if not value.is_floating_point():
            state[name] = value
        elif name.endswith("running_var"):
            state[name] = torch.rand(value.shape, generator=g) + 0.5
        else:
            state[name] = torch.randn(value.shape, generator=g) * (0.5 if value.dim() > 1 else 0.3)
    return state
