"""Residual fusion: a block's last conv runs the shortcut add (+ ReLU) as its epilogue."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import SequentialBottleneck, optimize_as_it_runs, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import functional as dtf


class _TorchvisionBlock(nn.Module):
    """torchvision's Bottleneck shape: separate conv/bn attributes, ``out += identity``, a
    shared ``self.relu`` module, and a downsample shortcut."""

    def __init__(self, c_in: int = 4, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(c_in, c, 1, stride=2, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.conv2(out)
        out = self.bn2(out)
        identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = _TorchvisionBlock()
        self.blocks = nn.Sequential(SequentialBottleneck(), SequentialBottleneck())
        self.plain = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.plain(y) - y  # not an add of a residual: left alone


class _Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.mean()) > 100:  # data-dependent: fx cannot trace it
            return x
        return torch.relu(self.conv(x) + x)


def _pair(make: Any) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(1)
    randomize_batch_norms(ref)
    return ref.eval(), copy.deepcopy(ref).eval()


def _spy_residuals(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    seen: list[str | None] = []
    original = dtf.conv2d

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("residual") is not None:
            seen.append(kwargs.get("activation"))
        return original(*args, **kwargs)

    monkeypatch.setattr(dtf, "conv2d", spy)
    return seen


def _spy_linear_residuals(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per ``dtf.linear`` call from now on, whether it took a residual."""
    seen: list[bool] = []
    original = dtf.linear

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs.get("residual") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(dtf, "linear", spy)
    return seen


def test_blocks_are_fused_and_match_pytorch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model = _pair(_Net)
    keys = list(model.state_dict())
    x = torch.randn(2, 4, 8, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == [
        "stem: conv2 + bn2 + residual add + relu",
        "stem: conv1 + bn1 + relu",  # torchvision's relu(bn1(conv1(x))): BN folded, ReLU fused
        "blocks.0: body + residual add + relu",
        "blocks.1: body + residual add + relu",
        # the Sequentials' own (the bodies' last conv and batch norm run in the residual
        # fusion above when the block calls them)
        "blocks.0.body: 0 + 1 + relu",
        "blocks.0.body: 3 + 4",
        "blocks.1.body: 0 + 1 + relu",
        "blocks.1.body: 3 + 4",
    ]
    assert "fused: blocks.0: body + residual add + relu" in str(report)
    assert list(model.state_dict()) == keys
    assert isinstance(model.stem, _TorchvisionBlock)
    seen = _spy_residuals(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert seen == ["relu", "relu", "relu"]  # three conv graphs took the add and the relu
    plans = {r.name: r.plans for r in report.swapped}
    assert plans["blocks.0.body.3"] and plans["stem.conv2"]  # fused convs still reported
    assert plans["stem.conv1"] and not plans["stem.bn1"]  # bn1 ran inside conv1's graph


class _ConvBnStack(nn.Module):
    """Separate conv/bn attributes called in the forward, in the spellings real models use."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 1)
        self.bn3 = nn.BatchNorm2d(8)
        self.conv4 = nn.Conv2d(8, 8, 1)
        self.bn4 = nn.BatchNorm2d(8)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.act(self.bn2(self.conv2(y)))
        z = self.bn3(self.conv3(y))  # no activation: the batch norm is still folded
        w = self.conv4(z)
        return self.bn4(w) + w  # the conv's output is used twice: left alone


def test_conv_then_batch_norm_in_a_forward_is_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model = _pair(_ConvBnStack)
    x = torch.randn(2, 4, 8, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == [
        "<root>: conv1 + bn1 + relu",
        "<root>: conv2 + bn2 + silu",
        "<root>: conv3 + bn3",
    ]
    norms: list[object] = []
    original = dtf.batch_norm
    monkeypatch.setattr(dtf, "batch_norm", lambda *a, **k: norms.append(1) or original(*a, **k))
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert len(norms) == 1  # only bn4 runs as a batch norm
    with torch.no_grad():  # statistics and weights changed in place reach the folded conv
        for m in (ref, model):
            m.bn2.running_mean.add_(0.3)
            m.conv1.weight.mul_(1.5)
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    model.train()  # training runs PyTorch's own ops: batch statistics, no folding
    ref.train()
    torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


def test_training_and_deepcopy_keep_pytorch_semantics(tmp_path: Path) -> None:
    ref, model = _pair(_Net)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    twin = copy.deepcopy(model)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), ref(x), atol=1e-4, rtol=1e-4)
    model.train()
    ref.train()
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=name)


def test_weight_updates_reach_the_fused_conv(tmp_path: Path) -> None:
    ref, model = _pair(_TorchvisionBlock)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        for m in (ref, model):
            m.bn2.running_var.mul_(2.0)
            m.conv2.weight.add_(0.1)
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


def test_untraceable_modules_and_opt_out_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model = _pair(_Untraceable)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == []
    x = torch.randn(1, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    ref, model = _pair(SequentialBottleneck)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", fuse=False)
    # no trace, no residual add fused, and no Sequential's children either: fuse=False is no
    # fusion at all (it left the Sequential's fused; new-user audit, session 18)
    assert report.fusions == []
    assert "_dnntune_steps" not in model.body.__dict__
    seen = _spy_residuals(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.relu(ref.body(x) + x), atol=1e-4, rtol=1e-4)
    assert seen == []


class _Doubled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y + y)  # the branch output is its own "residual": not fused


def test_a_branch_added_to_itself_is_not_fused(tmp_path: Path) -> None:
    ref, model = _pair(_Doubled)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == []
    x = torch.randn(1, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


class _Mlp(nn.Module):
    def __init__(self, d: int = 16, h: int = 32) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)
        self.fc = nn.Linear(d, d)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(F.silu(self.gate(x)) * self.up(x))
        y = self.act(self.fc(y)) + F.gelu(self.fc(x))
        z = self.conv(y.reshape(-1, 1, 4, 4)).sigmoid()
        return z.reshape(y.shape[0], -1)


def test_activations_after_linear_and_conv_are_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ref = _Mlp().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == [
        "<root>: gate + silu",
        "<root>: fc + gelu_tanh",
        "<root>: fc + gelu",
        "<root>: conv + sigmoid",
        "<root>: up + multiply",  # the gated product: up's epilogue (test_gated_mlp.py)
    ]
    seen: list[str | None] = []
    for name in ("linear", "conv2d"):
        original = getattr(dtf, name)

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> torch.Tensor:
            seen.append(kwargs.get("activation"))
            return _original(*args, **kwargs)

        monkeypatch.setattr(dtf, name, spy)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert sorted(a for a in seen if a) == ["gelu", "gelu_tanh", "sigmoid", "silu"]
    model.train()
    ref.train()
    model(x).sum().backward()  # training: PyTorch's activations, gradients as before
    ref(x).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)


class _TransformerTail(nn.Module):
    """``x + self.out(h)`` (a linear residual), and a routed pooling call in the same forward."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        y = x + self.out(h)
        return F.max_pool2d(y.reshape(-1, 1, 4, 4), 2).flatten(1)


def test_linear_residual_is_fused_and_routed_calls_stay_routed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.torch import runtime

    torch.manual_seed(0)
    ref = _TransformerTail().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == ["<root>: out + residual add", "<root>: fc + relu"]
    residuals = _spy_linear_residuals(monkeypatch)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert sorted(residuals) == [False, True]
    # three kernels: fc + relu, out + residual, and the pooling call, which still goes through
    # optimize's router from inside the rewritten forward
    assert len(runtime.cache()) == 3


class _OptionalMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if mask is not None:  # a trace would always take this branch
            y = y * mask
        return y


class _KeywordOnlyMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if mask is not None:
            y = y * mask
        return y


def test_a_parameter_that_defaults_to_none_is_traced_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewritten forward stands for calls that leave ``mask`` None (left out, given by
    position or by name); a call with a mask runs the module's own forward, its branch
    taken."""
    torch.manual_seed(0)
    ref = _OptionalMask().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert [str(f) for f in report.fusions] == ["<root>: fc + relu"]
    fused: list[int] = []
    real = model.fc.fused_activation

    def spy(*args: Any) -> torch.Tensor | None:
        fused.append(1)
        out: torch.Tensor | None = real(*args)
        return out

    monkeypatch.setattr(model.fc, "fused_activation", spy)
    x, mask = torch.randn(3, 8), (torch.rand(3, 8) > 0.5).float()
    with torch.no_grad():
        for call in (lambda m: m(x), lambda m: m(x, None), lambda m: m(x, mask=None)):
            fused.clear()
            torch.testing.assert_close(call(model), call(ref), atol=1e-4, rtol=1e-4)
            assert fused == [1], "a call that leaves the mask None runs the fused forward"
        for call in (lambda m: m(x, mask), lambda m: m(x, mask=mask)):
            fused.clear()
            torch.testing.assert_close(call(model), call(ref), atol=1e-4, rtol=1e-4)
            assert fused == [], "a call with a mask runs the module's own forward"
        model.train()
        ref.train()
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("make", [_KeywordOnlyMask])
def test_forwards_a_trace_would_specialise_are_not_rewritten(make: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == []
    # only optimize's routing wrapper sits on top of the model's own forward: no fused rewrite
    assert getattr(type(model), "_dnntune_routed", False)
    assert type(model).__mro__[1].forward is type(ref).forward
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
        model.train()
        ref.train()
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


class _KeepsState(nn.Module):
    """A forward that sets attributes of its module (a cache it grows, a call counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.cache = torch.zeros(0, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = torch.cat([self.cache, x])
        self.calls += 1
        return torch.relu(self.lin(x)) + self.cache.sum(0)


def test_a_forward_that_sets_attributes_is_not_traced_into_them(tmp_path: Path) -> None:
    """The fusion trace ran the forward on proxies, and left a proxy in ``self.cache``."""
    torch.manual_seed(0)
    ref = _KeepsState().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == []  # its trace would freeze the state: left alone
    assert type(model.cache) is torch.Tensor and model.calls == 0
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8)
            torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert model.calls == ref.calls == 3 and model.cache.shape == (6, 8)


class _ActBlock(nn.Module):
    """A Linear and a Conv2d + BatchNorm2d, each followed by an activation module that a
    rewritten forward calls, and a Sequential whose Linear + GELU pair is fused."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv_act = nn.GELU()
        self.seq = nn.Sequential(nn.Linear(16, 16), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.seq(self.act(self.fc(x)))
        c = self.conv_act(self.bn(self.conv(h.reshape(-1, 1, 4, 4))))
        return c.flatten(1)


def test_an_activation_module_changed_after_optimize_is_what_runs(tmp_path: Path) -> None:
    """A GELU's ``approximate`` set after optimize(), and an activation child replaced, are
    what the fused calls compute (they once kept the activation traced at optimize time)."""
    ref, model = _pair(_ActBlock)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert any("fc + gelu" in f for f in report.fusions), report.fusions
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        for m in (model, ref):
            m.act.approximate = "tanh"
            m.conv_act.approximate = "tanh"
            m.seq[1].approximate = "tanh"
        # the tanh approximation differs from the exact GELU by up to ~5e-4 here
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        for m in (model, ref):
            m.act = nn.SiLU()
            m.conv_act = nn.Identity()  # no activation dnntune fuses: runs unfused
            m.seq[1] = nn.Sigmoid()
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


class StochasticDepth(nn.Module):
    """torchvision's ``ops.StochasticDepth`` (row mode), under its module and name: dnntune
    knows it by those, without importing torchvision, which CI does not install."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty([x.shape[0]] + [1] * (x.dim() - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


StochasticDepth.__module__ = "torchvision.ops.stochastic_depth"


def _conv_bn(c_in: int, c_out: int, k: int = 1, groups: int = 1, act: bool = True) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, k, padding=k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    return nn.Sequential(*layers, *([nn.SiLU()] if act else []))


class _MBConv(nn.Module):
    """torchvision's MBConv: a Sequential of Conv2dNormActivation-like Sequentials (expand,
    depthwise, project without an activation), stochastic depth, then ``result += input``."""

    def __init__(self, c: int = 8, drop: nn.Module | None = None) -> None:
        super().__init__()
        self.block = nn.Sequential(
            _conv_bn(c, 4 * c),
            _conv_bn(4 * c, 4 * c, 3, groups=4 * c),
            _conv_bn(4 * c, c, act=False),
        )
        self.stochastic_depth = drop if drop is not None else StochasticDepth(0.2)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        result = self.block(input)
        result = self.stochastic_depth(result)
        result += input
        return result


class _DropNet(nn.Module):
    """MBConv blocks with stochastic depth and dropout, a MobileNetV3-like block with no drop
    (``result = block(x); result += x``), and a Dropout subclass, which is not fused."""

    class _Scaled(nn.Dropout):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

    def __init__(self) -> None:
        super().__init__()
        self.a = _MBConv()
        self.b = _MBConv(drop=nn.Dropout(0.3))
        self.c = _MBConv(drop=nn.Identity())
        self.d = _MBConv(drop=self._Scaled())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(self.c(self.b(self.a(x))))


def test_a_residual_after_dropout_or_stochastic_depth_is_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``block(x)`` through a module that is the identity in eval mode, then ``+= x``, with
    the block's last conv inside a nested Sequential: the add runs in that conv's epilogue in
    eval mode; training, a hook on the drop module, and a Dropout subclass run PyTorch's ops."""
    ref, model = _pair(_DropNet)
    x = torch.randn(2, 8, 6, 6)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    residuals = [f for f in report.fusions if "residual" in f]
    assert residuals == [
        "a: block + stochastic_depth (identity in eval) + residual add",
        "b: block + stochastic_depth (identity in eval) + residual add",
        "c: block + stochastic_depth (identity in eval) + residual add",
    ]
    seen = _spy_residuals(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert seen == [None, None, None]  # three conv graphs took the add
    handles = [
        m.a.stochastic_depth.register_forward_hook(lambda m, i, o: o * 0.5) for m in (model, ref)
    ]
    seen.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert seen == [None, None]  # a's drop module ran, with its hook
    for h in handles:
        h.remove()
    model.train()
    ref.train()
    for m in (model, ref):
        torch.manual_seed(5)  # the same rows dropped, the same dropout mask
        y = m(x)
        y.square().sum().backward()
    seen.clear()
    torch.manual_seed(5)
    y_model = model(x)
    torch.manual_seed(5)
    torch.testing.assert_close(y_model, ref(x), atol=1e-4, rtol=1e-4)
    assert seen == []  # training: PyTorch's ops, drops included
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=name)


class _EncoderBlock(nn.Module):
    """torchvision's ViT encoder block's MLP (``x + mlp(ln(x))``, the MLP a Sequential ending
    in ``Linear, Dropout``) and transformers' BertOutput (``ln(dropout(dense(h)) + x)``)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * d, d), nn.Dropout(0.1)
        )
        self.dense = nn.Linear(d, d)
        self.dropout = nn.Dropout(0.1)
        self.out_ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.mlp(self.ln(x))
        return self.out_ln(self.dropout(self.dense(y)) + y)


def test_a_linear_residual_after_dropout_is_fused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Sequential branch ending in a Linear and a Dropout, and a Linear child followed by a
    Dropout: the add runs in the Linear's epilogue in eval mode, and training (dropout drawn)
    runs PyTorch's ops."""
    torch.manual_seed(0)
    ref = _EncoderBlock().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    assert [f for f in report.fusions if "residual" in f] == [
        "<root>: mlp + residual add",
        "<root>: dense + dropout (identity in eval) + residual add",
    ]
    residuals = _spy_linear_residuals(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert residuals == [False, True, True]  # fc1 (+ GELU), then both residual GEMMs
    model.mlp[4].train()  # one trailing dropout drawing: the MLP's add runs apart
    residuals.clear()
    with torch.no_grad():
        torch.manual_seed(3)
        y = model(x)
        ref.mlp[4].train()
        torch.manual_seed(3)
        torch.testing.assert_close(y, ref(x), atol=1e-5, rtol=1e-5)
    assert residuals == [False, False, True]
    model.train()
    ref.train()
    torch.manual_seed(4)
    y = model(x)
    torch.manual_seed(4)
    torch.testing.assert_close(y, ref(x), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_dropout_and_stochastic_depth_residuals_fuse_on_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA in bfloat16, as EfficientNet and ViT run: the MBConv and MLP residual adds run in
    their conv's and GEMM's epilogues, within bfloat16's tolerance of eager."""
    torch.manual_seed(0)
    cnn, mlp = _DropNet(), _EncoderBlock()
    randomize_batch_norms(cnn)
    for ref in (cnn, mlp):
        ref.to("cuda", torch.bfloat16).eval()
        model = copy.deepcopy(ref)
        x = torch.randn(2, 8, 6, 6) if ref is cnn else torch.randn(2, 5, 16)
        x = x.to("cuda", torch.bfloat16)
        report = optimize_as_it_runs(model, x, tmp_path / "ov.json")
        assert sum("residual" in f for f in report.fusions) == (3 if ref is cnn else 2)
        seen = _spy_residuals(monkeypatch)
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), atol=5e-2, rtol=5e-2)
        assert len(seen) == (3 if ref is cnn else 0)  # the MLP's adds go through dtf.linear
        monkeypatch.undo()


class _ResidualFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)  # the residual first: eager's add takes its layout


def test_a_linears_residual_of_another_layout_keeps_eagers_layout(tmp_path: Path) -> None:
    """A residual that is not contiguous is added by PyTorch (the fused GEMM writes a
    contiguous output), in the forward's operand order, so the output is laid out as eager's."""
    torch.manual_seed(0)
    ref = _ResidualFirst().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert [str(f) for f in report.fusions] == ["<root>: fc + residual add"]
    with torch.no_grad():
        x = torch.randn(5, 3, 16).transpose(0, 1)
        got, want = model(x), ref(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert got.stride() == want.stride() != got.contiguous().stride()
        x = torch.randn(3, 5, 16)  # contiguous: the fused call
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
