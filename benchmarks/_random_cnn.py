"""The CNN family of ``_random_models.py``: conv + batch norm + activation blocks (a Sequential
or a forward, every activation spelling, depthwise, dilated, ``padding="same"``), residual
blocks (the shortcut added in each spelling), squeeze-excitation, MBConv, pooling, an in-place
residual, a DenseNet concatenation and a conv + batch norm called twice, then a head."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CNN"]

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


class _ConvBN(nn.Module):
    """A 3x3 conv (bias on) and its batch norm, ``c`` channels in and out, named by its class;
    the blocks below differ in their forwards only."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)
        self.bn = nn.BatchNorm2d(c)
        self.desc = type(self).__name__


class InPlaceResidual(_ConvBN):
    """``h += f(x)``, ``h`` a copy of ``x``: the add writes the residual (no fusion may take
    it)."""

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


class SharedConv(_ConvBN):
    """One conv + batch norm called twice in the forward (weights shared)."""

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
