"""A training step runs attention and pooling on PyTorch's ops, an expected route that never
warns (torch.md, Training), whatever options the call has: the options dnntune does not model
(attention's dropout, a ``ceil_mode`` pool) were checked first, so every training run of a
transformer (dropout on) warned "dropout is not supported" (new-user audit)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
import torch.nn.functional as torch_f
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import functional as F


def test_a_transformer_trains_with_dropout_quietly_and_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    ref = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).train()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 7, 32)
    # torch.md's way to train on shapes that vary: optimize in train mode, no example inputs
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        torch.manual_seed(1)
        y = model(x)
        y.square().sum().backward()
    torch.manual_seed(1)
    y_ref = ref(x)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)  # the same dropout masks
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=name)


def test_functional_ops_with_unmodelled_options_take_the_gradient_route_quietly() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 8, requires_grad=True)
    img = torch.randn(1, 3, 7, 7, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.manual_seed(2)
        attn = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        pooled = F.max_pool2d(img, 2, ceil_mode=True)
        averaged = F.avg_pool2d(img, 3, 2, ceil_mode=True)
    torch.manual_seed(2)
    torch.testing.assert_close(attn, torch_f.scaled_dot_product_attention(q, q, q, dropout_p=0.5))
    torch.testing.assert_close(pooled, torch_f.max_pool2d(img, 2, ceil_mode=True))
    torch.testing.assert_close(averaged, torch_f.avg_pool2d(img, 3, 2, ceil_mode=True))
    assert attn.requires_grad and pooled.requires_grad and averaged.requires_grad


def test_functional_batch_norm_on_batch_statistics_is_quiet() -> None:
    """``batch_norm(training=True)`` (or without running statistics) normalises with the
    batch's statistics, PyTorch's op by design, as an optimized BatchNorm2d in training mode
    runs it without a warning: the functional op warned "batch-norm training runs in PyTorch"
    (new-user audit)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    weight, bias = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    mean, var = torch.zeros(3), torch.ones(3)
    mean_ref, var_ref = mean.clone(), var.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.2)
        y_stats = F.batch_norm(x, None, None, weight, bias, training=True)
    want = torch_f.batch_norm(x, mean_ref, var_ref, weight, bias, training=True, momentum=0.2)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close((mean, var), (mean_ref, var_ref))  # updated as PyTorch's
    torch.testing.assert_close(y_stats, torch_f.batch_norm(x, None, None, weight, bias, True))
    y.sum().backward()
    assert x.grad is not None and weight.grad is not None
