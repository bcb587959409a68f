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
