"""A conv + BN fold after optimize: a fused optimizer's step (it counts no tensor versions) and
a parametrization (a weight computed per call) never leave the fold stale or broken (an
audit's reproducers; each failed before its fix)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

import dnntune.torch as dtt


def _pair() -> tuple[nn.Sequential, nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    dtt.optimize(m, example_inputs=(x,), policy="heuristic", check_speed=False)
    return m, ref, x


@pytest.mark.parametrize("optimizer", ["adamw_fused", "sgd_fused", "adam_foreach"])
def test_an_optimizer_step_refreshes_the_fold(optimizer: str) -> None:
    m, ref, x = _pair()
    for model in (m, ref):
        with torch.no_grad():
            model(x)  # a validation pass: the fold is cached
        params = model.parameters()
        opt: torch.optim.Optimizer
        if optimizer == "adamw_fused":
            opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
        elif optimizer == "sgd_fused":
            opt = torch.optim.SGD(params, lr=1e-1, fused=True)
        else:
            opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
        model(x).square().mean().backward()
        opt.step()
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-4)


def test_a_conv_parametrized_after_optimize_runs_unfused() -> None:
    m, ref, x = _pair()
    weight_norm(m[0])
    weight_norm(ref[0])
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-4)  # was KeyError: 'weight'


class _Double(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


def test_a_parametrized_batch_norm_is_never_folded_stale() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    parametrize.register_parametrization(m[1], "weight", _Double())
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    dtt.optimize(m, example_inputs=(x,), policy="heuristic", check_speed=False)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-4)
        for model in (m, ref):
            model[1].parametrizations.weight.original.mul_(3)
        torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-4)  # was 10.2 off


@pytest.mark.parametrize("which", ["conv", "batch_norm", "both"])
def test_weights_set_as_plain_attributes_are_read_as_they_are_now(which: str) -> None:
    """A hypernetwork's (or a meta-learner's) pattern: the registered parameter deleted and a
    computed tensor set as a plain attribute, on each step. The fold tracks its sources in
    the modules' parameter and buffer dicts, so the pair runs as PyTorch runs it: a conv's
    weight so set raised KeyError: 'weight' inside the forward, and a batch norm's weight set
    anew kept the fold of the first one (0.03-0.05 off on the next calls)."""
    m, ref, x = _pair()
    hyper = torch.randn(8, 3, 3, 3, requires_grad=True)
    for step in range(3):
        torch.manual_seed(step)
        gamma = torch.rand(8) + 0.5
        for model in (m, ref):
            if which != "batch_norm":
                _set_plain(model[0], "weight", hyper * (step + 1))
            if which != "conv":
                _set_plain(model[1], "weight", gamma)
        with torch.no_grad():
            torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-4)
        if which != "batch_norm":
            (grad,) = torch.autograd.grad(m(x).sum(), hyper)  # the hypernetwork's gradient
            (want,) = torch.autograd.grad(ref(x).sum(), hyper)
            torch.testing.assert_close(grad, want, atol=1e-4, rtol=1e-4)


def _set_plain(module: nn.Module, name: str, value: torch.Tensor) -> None:
    if name in module._parameters:
        delattr(module, name)  # the registered parameter goes; a plain attribute takes its name
    setattr(module, name, value)
