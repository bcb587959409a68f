"""dnntune.torch's ops give their outputs the memory layout PyTorch's ops give theirs, for the
layouts models feed them: a layout that differs makes the next op copy (a reshape of a
transposed attention output) or run in another layout (a channels-last model fed NCHW images).
Each case runs twice: through dnntune's graph, and through PyTorch's op as the winner
(``Kernel.native``), the second call of a signature through its memo."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import dnntune.torch as dtt
from dnntune.torch import runtime

CL = torch.channels_last


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True, params=["dnntune", "native"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    native = request.param == "native"
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: native))
    return str(request.param)


def _same(ours: Callable[[], torch.Tensor], theirs: torch.Tensor) -> None:
    for _ in range(2):  # the first call builds the signature's plan, the second takes its memo
        y = ours()
        assert y.stride() == theirs.stride(), (y.stride(), theirs.stride())
        torch.testing.assert_close(y, theirs, atol=1e-3, rtol=1e-3)


def _cl(t: torch.Tensor, on: bool) -> torch.Tensor:
    return t.to(memory_format=CL) if on else t


@pytest.mark.parametrize("x_cl", [False, True])
@pytest.mark.parametrize("w_cl", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_conv2d_layout(device: str, x_cl: bool, w_cl: bool, k: int) -> None:
    """Channels-last if the input or the weight is, as PyTorch decides: a model converted with
    ``.to(memory_format=torch.channels_last)`` and fed NCHW images runs channels-last from its
    first convolution on, its input converted once."""
    g = torch.Generator().manual_seed(k)
    x = _cl(torch.randn(2, 8, 9, 9, generator=g).to(device), x_cl)
    w = _cl(torch.randn(6, 8, k, k, generator=g).to(device), w_cl)
    b = torch.randn(6, generator=g).to(device)
    theirs = F.conv2d(x, w, b, 1, k // 2)
    _same(lambda: dtt.conv2d(x, w, b, 1, k // 2), theirs)
    _same(lambda: dtt.conv2d(x, w, b, 1, k // 2, activation="relu"), torch.relu(theirs))


def test_conv2d_layout_when_training(device: str) -> None:
    x = torch.randn(2, 4, 7, 7, device=device, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device=device).to(memory_format=CL).requires_grad_()
    y = dtt.conv2d(x, w, None, 1, 1, activation="relu")
    ref = torch.relu(F.conv2d(x, w, None, 1, 1))
    assert y.is_contiguous(memory_format=CL) and y.stride() == ref.stride()
    grad = torch.randn_like(ref)
    ours = torch.autograd.grad(y, (x, w), grad)
    theirs = torch.autograd.grad(ref, (x, w), grad)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_linear_and_norm_layouts(device: str, layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = {
        "contiguous": lambda: torch.randn(2, 5, 32, generator=g),
        "transposed": lambda: torch.randn(5, 2, 32, generator=g).transpose(0, 1),
        "sliced": lambda: torch.randn(2, 5, 64, generator=g)[..., :32],
    }[layout]().to(device)
    w, b = torch.randn(16, 32, generator=g).to(device), torch.randn(16, generator=g).to(device)
    s, sb = torch.randn(32, generator=g).to(device), torch.randn(32, generator=g).to(device)
    _same(lambda: dtt.linear(x, w, b), F.linear(x, w, b))
    _same(lambda: dtt.layer_norm(x, (32,), s, sb), F.layer_norm(x, (32,), s, sb))
    _same(lambda: dtt.rms_norm(x, (32,), s), F.rms_norm(x, (32,), s))


@pytest.mark.parametrize("x_cl", [False, True])
def test_batch_norm_and_pooling_layouts(device: str, x_cl: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = _cl(torch.randn(2, 8, 9, 9, generator=g).to(device), x_cl)
    mean, var = torch.randn(8, generator=g).to(device), torch.rand(8, generator=g).to(device)
    s, b = torch.randn(8, generator=g).to(device), torch.randn(8, generator=g).to(device)
    var = var + 0.5
    _same(lambda: dtt.batch_norm(x, mean, var, s, b, False), F.batch_norm(x, mean, var, s, b))
    _same(lambda: dtt.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))
    _same(lambda: dtt.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1))
    _same(lambda: dtt.avg_pool2d(x, 9), F.avg_pool2d(x, 9))
