"""timm's ``LayerNorm`` (ViT's, DeiT's and many more of timm's models' norm layer) runs dnntune's
``layer_norm``, as ``nn.LayerNorm`` does; with its fast-norm path on, as a subclass, or with a
forward set on the instance it runs as it is. Before, timm's ViT-B/16 ran all 25 of its layer
norms on PyTorch's op: the class is a subclass of ``nn.LayerNorm`` with a forward of its own.

CI has no timm: ``TimmLayerNorm`` is timm 1.0's class (``timm.layers.norm``) in its module and
name, with its forward's arithmetic; the zoo's timm models run the real one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import functional as dtf


class TimmLayerNorm(nn.LayerNorm):
    """timm's ``LayerNorm``: ``F.layer_norm`` with the module's settings, or its fast norm."""

    calls: ClassVar[list[str]] = []

    def __init__(self, c: int, eps: float = 1e-6) -> None:
        super().__init__(c, eps=eps)
        self._fast_norm = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        TimmLayerNorm.calls.append("fast" if self._fast_norm else "own")
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


TimmLayerNorm.__module__ = "timm.layers.norm"
TimmLayerNorm.__qualname__ = TimmLayerNorm.__name__ = "LayerNorm"
TimmLayerNorm.forward.__qualname__ = "LayerNorm.forward"


class _Subclass(TimmLayerNorm):
    pass


class _Net(nn.Module):
    def __init__(self, norm: type[nn.Module] = TimmLayerNorm) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = norm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))


def _pair(tmp_path: Path, norm: type[nn.Module] = TimmLayerNorm) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = _Net(norm).eval()
    with torch.no_grad():
        ref.norm.weight.uniform_(0.5, 1.5)
        ref.norm.bias.uniform_(-0.5, 0.5)
    return ref, copy.deepcopy(ref)


def _layer_norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = dtf.layer_norm

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dtf, "layer_norm", spy)
    return seen


def test_timms_layer_norm_runs_dnntunes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, model = _pair(tmp_path)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert [(r.name, r.kind) for r in report.swapped] == [("fc", "Linear"), ("norm", "LayerNorm")]
    assert isinstance(model.norm, TimmLayerNorm)
    seen = _layer_norm_calls(monkeypatch)
    x = torch.randn(3, 5, 16)
    TimmLayerNorm.calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert seen == [1] and TimmLayerNorm.calls == ["own"]  # the reference's call only


def test_its_own_forward_runs_where_dnntunes_would_not_stand_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model = _pair(tmp_path)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    seen = _layer_norm_calls(monkeypatch)
    x = torch.randn(3, 5, 16)
    TimmLayerNorm.calls.clear()
    with torch.no_grad():
        model.norm._fast_norm = True  # turned on after optimize
        model(x)
        model.norm._fast_norm = False
    assert seen == [] and TimmLayerNorm.calls == ["fast"]
    x.requires_grad_(True)  # training: gradients as eager's
    model(x).sum().backward()
    grad = x.grad
    x.grad = None
    ref(x).sum().backward()
    assert seen == [] and grad is not None
    torch.testing.assert_close(grad, x.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_a_fast_norm_a_subclass_or_a_forward_of_its_own_is_not_swapped(tmp_path: Path) -> None:
    _, model = _pair(tmp_path)
    model.norm._fast_norm = True
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "a.json")
    assert [r.name for r in report.swapped] == ["fc"]
    _, model = _pair(tmp_path, _Subclass)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "b.json")
    assert [r.name for r in report.swapped] == ["fc"]
    _, model = _pair(tmp_path)
    model.norm.forward = lambda x: x  # type: ignore[method-assign]
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "c.json")
    assert [r.name for r in report.swapped] == ["fc"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_timms_layer_norm_on_cuda_in_bfloat16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dnntune's layer_norm (the plan the first-call check keeps) within bfloat16's tolerance
    of the module in float64."""
    torch.manual_seed(0)
    ref = _Net().eval()
    model = copy.deepcopy(ref).cuda().to(torch.bfloat16)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert ("norm", "LayerNorm") in [(r.name, r.kind) for r in report.swapped]
    seen = _layer_norm_calls(monkeypatch)
    x = torch.randn(8, 197, 16)
    with torch.no_grad():
        got = model(x.cuda().to(torch.bfloat16)).double().cpu()
        exact = ref.double()(x.double())
    assert seen == [1]
    torch.testing.assert_close(got, exact, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_a_weight_set_as_a_plain_attribute_is_the_one_it_normalises_with(
    tmp_path: Path, name: str
) -> None:
    """A parameter deleted and a tensor set in its name (a hypernetwork's or meta-learner's
    step): the stand-in read the parameter dict alone and normalised without that weight or
    bias (the output off by the weight's whole effect, 2.0 here); it runs its own forward."""
    ref, model = _pair(tmp_path)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(3, 5, 16)
    for m in (ref, model):
        delattr(m.norm, name)
        setattr(m.norm, name, torch.full((16,), 3.0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
