"""optimize() swaps and folds only the classes it knows: a subclass of a PyTorch layer (timm's
``BatchNormAct2d``, which applies an activation in its own forward) runs as its own forward
says, never as the class it derives from. (A fifth audit: a BatchNorm2d subclass after a conv
was folded into it and its activation skipped, max error 1.78.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import BatchNormAct2d, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch.modules import DnnTuneBatchNorm2d, DnnTuneConv2d


class PlainSubclass(nn.BatchNorm2d):
    """A subclass that changes nothing: still the user's class, never folded."""


class ConvBN(nn.Module):
    """``bn(conv(x))`` in a forward of its own (the traced fusion's conv + batch norm)."""

    def __init__(self, bn: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class Residual(nn.Module):
    """``relu(bn(conv(x)) + x)``: the traced fusion's conv + batch norm + residual + relu."""

    def __init__(self, bn: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + x)


def _optimized(ref: nn.Module, x: torch.Tensor, tmp_path: Path) -> nn.Module:
    ref.eval()
    randomize_batch_norms(ref)
    model = copy.deepcopy(ref)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    return model


def _same(ref: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda bn: nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), bn),
        lambda bn: nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), bn, nn.ReLU()),
        ConvBN,
        Residual,
    ],
    ids=["sequential", "sequential+relu", "traced", "traced_residual"],
)
@pytest.mark.parametrize("bn_class", [BatchNormAct2d, PlainSubclass])
def test_a_batch_norm_subclass_after_a_conv_runs_its_own_forward(
    make: type[nn.Module], bn_class: type[nn.BatchNorm2d], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 8, 8)
    ref = make(bn_class(8))  # type: ignore[call-arg]
    model = _optimized(ref, x, tmp_path)
    _same(ref, model, x)
    # the subclass is neither swapped for dnntune's batch norm nor folded into the conv
    bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    assert type(bn) is bn_class
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert isinstance(conv, DnnTuneConv2d)
    with torch.no_grad():
        assert conv.fused_bn(x, bn, None) is None
        assert conv.fused_tail(x, x, "relu", bn) is None


def test_pytorchs_batch_norm_and_dnntunes_stand_in_fold(tmp_path: Path) -> None:
    """The rule's other side: nn.BatchNorm2d itself and the class optimize() swaps in fold."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 8, 8)
    model = _optimized(ConvBN(nn.BatchNorm2d(8)), x, tmp_path)
    assert type(model.bn) is DnnTuneBatchNorm2d
    plain = randomize_like(nn.BatchNorm2d(8).eval(), model.bn)
    conv = model.conv
    assert isinstance(conv, DnnTuneConv2d)
    with torch.no_grad():
        for bn in (model.bn, plain):
            got = conv.fused_bn(x, bn, None)
            assert got is not None
            torch.testing.assert_close(got, nn.BatchNorm2d.forward(bn, conv(x)))


def randomize_like(bn: nn.BatchNorm2d, source: nn.BatchNorm2d) -> nn.BatchNorm2d:
    bn.load_state_dict(source.state_dict())
    return bn


def test_a_batch_norm_with_a_forward_set_on_the_instance_is_not_folded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 8, 8)
    ref = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
    model = _optimized(ref, x, tmp_path)
    for m in (ref, model):
        bn = m[1]
        bn.forward = lambda t, bn=bn: torch.relu(nn.BatchNorm2d.forward(bn, t))
    _same(ref, model, x)


class MyConv(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class MyLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1


class MyLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).tanh()


class MyRMSNorm(nn.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -super().forward(x)


class Subclassed(nn.Module):
    """A subclass of each layer optimize() swaps, followed by what it would fuse with."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = MyConv(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.seq = nn.Sequential(MyConv(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = MyLinear(8, 8)
        self.ln = MyLayerNorm(8)
        self.rms = MyRMSNorm(8)
        self.gate = MyLinear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.seq(self.bn(self.conv(x)))
        h = h.mean((2, 3))
        h = h + self.fc(self.ln(h))
        return torch.nn.functional.silu(self.gate(self.rms(h)))


def test_subclasses_of_swapped_layers_are_neither_swapped_nor_fused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 6)
    ref = Subclassed()
    model = _optimized(ref, x, tmp_path)
    _same(ref, model, x)
    mine = (MyConv, MyLinear, MyLayerNorm, MyRMSNorm)
    for name, sub in ref.named_modules():
        if isinstance(sub, mine):  # the user's subclasses keep their class
            assert type(model.get_submodule(name)) is type(sub), name


class LinearAct(nn.Module):
    """``act(fc(x))``: the traced fusion's linear + activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class LinearDropResidual(nn.Module):
    """``x + drop(fc(x))``: the traced fusion's linear + residual, the dropout skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc(x))


class SequentialResidual(nn.Module):
    """``x + body(x)``, the body a Sequential of a linear and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@pytest.mark.parametrize(
    ("make", "child"),
    [
        (lambda: nn.Sequential(nn.Linear(16, 16), nn.Sigmoid()), "1"),
        (LinearAct, "act"),
        (LinearDropResidual, "drop"),
        (SequentialResidual, "body.1"),
    ],
    ids=["sequential_sigmoid", "traced_gelu", "traced_dropout", "sequential_dropout"],
)
def test_an_activation_or_dropout_given_a_forward_after_optimize_runs_it(
    make: Any, child: str, tmp_path: Path
) -> None:
    """An activation or an eval-mode identity (Dropout) given a forward of its own on the
    instance after ``optimize`` runs that forward: a fused call read only the module's class
    and ran its activation, or skipped the dropout (new-user audit, session 55: errors of 2.4,
    0.58 and 0.66)."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    ref = make()
    model = _optimized(ref, x, tmp_path)
    _same(ref, model, x)
    for m in (ref, model):
        m.get_submodule(child).forward = lambda t: t * 0.5
    _same(ref, model, x)


class LinearResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class GatedMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 16)
        self.gate = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x) * torch.nn.functional.silu(self.gate(x))


@pytest.mark.parametrize(
    ("make", "child"),
    [
        (LinearResidual, "fc"),
        (LinearAct, "fc"),
        (GatedMlp, "up"),
        (GatedMlp, "gate"),
        (lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU()), "0"),
    ],
    ids=["residual", "activation", "multiply_up", "multiply_gate", "sequential"],
)
def test_a_fused_linear_given_a_forward_after_optimize_runs_it(
    make: Any, child: str, tmp_path: Path
) -> None:
    """A Linear whose call a fusion took over (its residual add, activation or multiply as its
    epilogue), given a forward of its own on the instance after ``optimize``: the fused call
    skipped it (new-user audit, session 55: errors of 0.3 to 1.7)."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    ref = make()
    model = _optimized(ref, x, tmp_path)
    for m in (ref, model):
        layer = m.get_submodule(child)
        layer.forward = lambda t, layer=layer: nn.Linear.forward(layer, t) * 0.5
    _same(ref, model, x)
