"""timm's ``BatchNormAct2d`` after a conv (timm's EfficientNet, RegNet, CSP and DLA blocks: its
``ConvNormAct``) is folded into the conv, its activation the conv's epilogue, in eval mode;
anything else about it (training, a dropout that is not the identity, an activation dnntune
does not fuse, a hook, a subclass) runs the two modules as they are.

CI has no timm: ``TimmBatchNormAct2d`` is timm 1.0's class (``timm.layers.norm_act``) in its
module and name, with its forward's arithmetic; the zoo's timm models
(``benchmarks/model_conformance.py --zoo timm``) run the real one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import optimize_as_it_runs, randomize_batch_norms

import dnntune.torch as dtt


class TimmBatchNormAct2d(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d``: ``nn.BatchNorm2d``'s forward, then ``drop``, then ``act``."""

    calls: ClassVar[list[int]] = []

    def __init__(self, c: int, act: nn.Module | None = None, drop: nn.Module | None = None):
        super().__init__(c)
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        TimmBatchNormAct2d.calls.append(1)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        x = F.batch_norm(
            x,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight,
            self.bias,
            use_batch,
            self.momentum or 0.0,
            self.eps,
        )
        return self.act(self.drop(x))


TimmBatchNormAct2d.__module__ = "timm.layers.norm_act"
TimmBatchNormAct2d.__qualname__ = TimmBatchNormAct2d.__name__ = "BatchNormAct2d"


class ConvNormAct(nn.Module):
    """timm's ``ConvNormAct``: a conv, then a ``BatchNormAct2d``."""

    def __init__(self, c_in: int, c: int, act: nn.Module | None, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c, 3, padding=1, groups=groups, bias=False)
        self.bn = TimmBatchNormAct2d(c, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = self.bn(x)
        aa = getattr(self, "aa", None)
        if aa is not None:
            x = self.aa(x)
        return x


class InvertedResidual(nn.Module):
    """timm's EfficientNet block, shortened: ``conv_pw, bn1`` (SiLU), then ``conv_pwl, bn3``
    (no activation), a dropout and the shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_pw = nn.Conv2d(8, 16, 1, bias=False)
        self.bn1 = TimmBatchNormAct2d(16, nn.SiLU(inplace=True))
        self.conv_pwl = nn.Conv2d(16, 8, 1, bias=False)
        self.bn3 = TimmBatchNormAct2d(8)
        self.drop_path = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_pw(x)
        x = self.bn1(x)
        x = self.conv_pwl(x)
        x = self.bn3(x)
        x = self.drop_path(x) + shortcut
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvNormAct(4, 8, nn.SiLU(inplace=True))
        self.dw = ConvNormAct(8, 8, nn.ReLU(inplace=True), groups=8)
        self.proj = ConvNormAct(8, 8, None)
        self.block = InvertedResidual()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.proj(self.dw(self.stem(x))))


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = Net().eval()
    randomize_batch_norms(ref)
    return ref, copy.deepcopy(ref)


def _norm_calls(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    TimmBatchNormAct2d.calls.clear()
    with torch.no_grad():
        out = model(x)
    return out, len(TimmBatchNormAct2d.calls)


def test_a_conv_and_timms_batch_norm_act_run_as_one_folded_conv(tmp_path: Path) -> None:
    ref, model = _pair()
    x = torch.randn(2, 4, 8, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == [
        "stem: conv + bn + silu",
        "dw: conv + bn + relu",
        "proj: conv + bn",
        "block: conv_pwl + bn3 + drop_path (identity in eval) + residual add",
        "block: conv_pw + bn1 + silu",
    ]
    out, norms = _norm_calls(model, x)
    assert norms == 0  # every batch norm and its activation ran inside its conv
    torch.testing.assert_close(out, ref(x), atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # statistics and weights changed in place reach the fold
        for m in (ref, model):
            m.dw.bn.running_var.mul_(2.0)
            m.stem.conv.weight.mul_(1.5)
    torch.testing.assert_close(_norm_calls(model, x)[0], ref(x), atol=1e-4, rtol=1e-4)


def test_training_runs_timms_modules_with_their_gradients(tmp_path: Path) -> None:
    ref, model = _pair()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(2, 4, 8, 8)
    model.train()
    ref.train()
    TimmBatchNormAct2d.calls.clear()
    torch.manual_seed(1)  # the same dropout masks
    model(x).square().sum().backward()
    assert len(TimmBatchNormAct2d.calls) == 5  # batch statistics: timm's forward runs
    torch.manual_seed(1)
    ref(x).square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    for a, b in zip(model.buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b)  # running statistics updated alike


def _leaky(m: nn.Module) -> None:
    m.dw.bn.act = nn.LeakyReLU(0.1)


def _dropout_training(m: nn.Module) -> None:
    m.dw.bn.drop = nn.Dropout(0.0)
    m.dw.bn.drop.train()


def _hooked(m: nn.Module) -> None:
    m.dw.bn.act.register_forward_hook(lambda mod, i, o: o * 2)


def _gelu(m: nn.Module) -> None:
    m.dw.bn.act = nn.GELU(approximate="tanh")


def _act_before_the_add(m: nn.Module) -> None:
    m.block.bn3.act = nn.ReLU()  # an activation before the residual add: not the add's epilogue


@pytest.mark.parametrize(
    ("change", "runs_apart"),
    [(_leaky, 1), (_dropout_training, 1), (_hooked, 1), (_gelu, 0), (_act_before_the_add, 1)],
    ids=["leaky_relu", "dropout_in_training", "hook_on_its_activation", "gelu_now", "act_at_add"],
)
def test_a_batch_norm_act_changed_after_optimize_computes_what_timm_does(
    change: object, runs_apart: int, tmp_path: Path
) -> None:
    ref, model = _pair()
    x = torch.randn(2, 4, 8, 8)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    for m in (ref, model):
        change(m)  # type: ignore[operator]
    out, norms = _norm_calls(model, x)
    assert norms == runs_apart
    torch.testing.assert_close(out, ref(x), atol=1e-4, rtol=1e-4)


def test_a_subclass_or_an_unfused_activation_is_left_to_its_own_forward(tmp_path: Path) -> None:
    class Mine(TimmBatchNormAct2d):  # a forward of its own may compute anything
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 0.5

    ref, model = _pair()
    for m in (ref, model):
        old = m.stem.bn
        m.stem.bn = Mine(8, nn.SiLU())
        m.stem.bn.load_state_dict(old.state_dict())
        m.stem.bn.eval()
        m.dw.bn.act = nn.LeakyReLU(0.1)  # at optimize: not fused, not reported
    x = torch.randn(2, 4, 8, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions[0] == "proj: conv + bn"
    out, norms = _norm_calls(model, x)
    assert norms == 2
    torch.testing.assert_close(out, ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_timms_conv_norm_act_blocks_fold_on_cuda_in_bfloat16(tmp_path: Path) -> None:
    """On CUDA in bfloat16 and channels-last, as timm's CNNs run: every batch norm runs in its
    conv (no timm forward called), within bfloat16's tolerance of eager."""
    ref, model = _pair()
    for m in (ref, model):
        m.to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 16, 16).to("cuda", torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    report = optimize_as_it_runs(model, x, tmp_path / "ov.json")
    assert len(report.fusions) == 5, report.fusions
    out, norms = _norm_calls(model, x)
    assert norms == 0
    with torch.no_grad():
        torch.testing.assert_close(out, ref(x), atol=5e-2, rtol=5e-2)
