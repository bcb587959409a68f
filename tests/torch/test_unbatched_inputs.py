"""Inputs without a batch dimension that PyTorch's ops take run on dnntune, as a batch of one:
an image [C, H, W] through a conv or a pooling op, a vector through a layer norm or RMS norm,
[B, S, D] tensors through attention (new-user audits: each fell back to PyTorch's op with a warning,
"only 4-D" or "dnntune cannot run it (... needs rank >= 2 ...)")."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import runtime


@pytest.fixture(autouse=True)
def kernel_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every selected kernel runs through its dnntune graph (on the CPU TORCH_ENGINE's plan is
    PyTorch's own op, which would otherwise be called directly)."""
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: False))


def _ops_built() -> set[str]:
    return {key[0][0] for key in runtime.cache()._items}


def _quietly(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning fails the test
        return fn()


def test_a_conv_of_an_unbatched_image_runs_as_a_batch_of_one() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(4)
    r = torch.randn(4, 5, 5)
    for _ in range(2):  # first call, then the call memo
        y = _quietly(lambda: dtt.conv2d(x, w, b, stride=2, padding=1))
        torch.testing.assert_close(y, F.conv2d(x, w, b, stride=2, padding=1))
        y = _quietly(lambda: dtt.conv2d(x, w, b, 2, 1, activation="relu", residual=r))
        torch.testing.assert_close(y, F.relu(F.conv2d(x, w, b, stride=2, padding=1) + r))
    assert "conv2d" in _ops_built()


def test_an_unbatched_conv_trains_as_pytorchs() -> None:
    """With gradients wanted the batch of one runs dnntune's autograd function (its backward
    graphs), its gradients carried back through the views."""
    torch.manual_seed(0)
    x, w, g = torch.randn(3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4, 8, 8)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    (_quietly(lambda: dtt.conv2d(xa, wa, padding=1)) * g).sum().backward()
    (F.conv2d(xb, wb, padding=1) * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(wa.grad, wb.grad)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("affine", [True, False])
def test_a_norm_of_a_lone_vector_runs_as_one_row(kind: str, affine: bool) -> None:
    torch.manual_seed(0)
    w, b = (torch.randn(8), torch.randn(8)) if affine else (None, None)
    for x in (torch.randn(8), torch.randn(16)[::2]):  # contiguous, and strided
        for _ in range(2):  # first call, then the call memo
            if kind == "layer_norm":
                y = _quietly(lambda x=x: dtt.layer_norm(x, (8,), w, b))
                expected = F.layer_norm(x, (8,), w, b)
            else:
                y = _quietly(lambda x=x: dtt.rms_norm(x, (8,), w))
                expected = F.rms_norm(x, (8,), w)
            assert y.shape == (8,)
            torch.testing.assert_close(y, expected)
    assert kind in _ops_built()


@pytest.mark.parametrize(
    "mask", [None, (5, 7), (2, 5, 7), (2, 1, 7)], ids=["none", "2d", "3d", "3d-broadcast"]
)
def test_attention_over_3d_tensors_runs_as_one_head(mask: tuple[int, ...] | None) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 6)
    m = None if mask is None else torch.randn(mask)
    for _ in range(2):
        y = _quietly(lambda: dtt.scaled_dot_product_attention(q, k, v, attn_mask=m))
        torch.testing.assert_close(y, F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    if mask is None:
        y = _quietly(lambda: dtt.scaled_dot_product_attention(q, k, v, is_causal=True))
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(y, expected)
    assert "sdpa" in _ops_built()


class _Single(nn.Module):
    """A conv stack, a per-vector norm and a one-head attention pooling, fed one sample."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3))
        self.norm = nn.LayerNorm(8)
        self.query = nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.convs(x).flatten(-2).transpose(-1, -2)  # [S, 8] (or [B, S, 8])
        h = self.norm(h)
        if h.dim() == 2:
            h = h.unsqueeze(0)
        q = self.query.expand(h.shape[0], -1, -1)
        return self.norm(F.scaled_dot_product_attention(q, h, h)[:, 0]).squeeze(0)


def test_an_optimized_model_fed_one_sample_matches_eager_without_warnings() -> None:
    torch.manual_seed(0)
    model = _Single().eval()
    eager = copy.deepcopy(model)
    dtt.optimize(
        model, (torch.randn(2, 3, 9, 9),), policy="heuristic", overrides=None, check_speed=False
    )
    image = torch.randn(3, 9, 9)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(_quietly(lambda: model(image)), eager(image))


@pytest.mark.parametrize("pool", ["max", "avg", "avg_exclude_pad"])
def test_a_pool_of_an_unbatched_image_runs_as_a_batch_of_one(pool: str) -> None:
    """A CNN fed one image [C, H, W]: its convs ran it quietly as a batch of one, and its
    ``nn.MaxPool2d`` or ``nn.AvgPool2d`` warned "only 4-D input is supported, got 3-D" and ran
    PyTorch's op (new-user audit)."""
    torch.manual_seed(0)
    layer = {
        "max": nn.MaxPool2d(3, 2, 1),
        "avg": nn.AvgPool2d(3, 2, 1),
        "avg_exclude_pad": nn.AvgPool2d(3, 2, 1, count_include_pad=False),
    }[pool]
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), layer).eval()
    eager = copy.deepcopy(model)
    dtt.optimize(
        model, (torch.randn(2, 3, 9, 9),), policy="heuristic", overrides=None, check_speed=False
    )
    image = torch.randn(3, 9, 9)
    with torch.no_grad():
        for _ in range(2):  # first call, then the call memo
            torch.testing.assert_close(_quietly(lambda: model(image)), eager(image))
    assert f"{pool[:3]}_pool2d" in _ops_built()
    # with gradients wanted it takes PyTorch's op (an expected route) through the same views
    x = image.clone().requires_grad_()
    xe = image.clone().requires_grad_()
    _quietly(lambda: model(x)).sum().backward()
    eager(xe).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)
