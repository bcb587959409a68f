"""An empty batch (a detector's frame with no boxes) runs PyTorch's own op, quietly: no graph
has a zero-sized dim, and that is an expected route, not a failure (helper audit, session 20:
each op warned "dnntune cannot run it" quoting a graph-validation error, and used up its one
such warning, so a later real failure of that op would have been silent)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as torch_f

from dnntune.torch import functional as F


def test_empty_batches_run_pytorchs_op_without_a_warning() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(0, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    rows = torch.randn(0, 16)
    q = torch.randn(0, 2, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        conv = F.conv2d(x, w, b, padding=1)
        norm = F.layer_norm(rows, (16,))
        attn = F.scaled_dot_product_attention(q, q, q)
    assert conv.shape == torch_f.conv2d(x, w, b, padding=1).shape == (0, 4, 8, 8)
    assert norm.shape == (0, 16) and attn.shape == (0, 2, 4, 8)
    # the same ops on non-empty inputs still run (and agree with PyTorch's)
    x1 = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(
        F.conv2d(x1, w, b, padding=1), torch_f.conv2d(x1, w, b, padding=1), rtol=1e-4, atol=1e-4
    )


def test_an_empty_batch_through_linear_is_quiet_too() -> None:
    """``linear`` set its own "empty input" reason, so an empty batch warned (and used up that
    warning) where every other op runs PyTorch's quietly (new-user audit)."""
    torch.manual_seed(0)
    w, b = torch.randn(4, 16), torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rows in (torch.randn(0, 16), torch.randn(0, 3, 5, 16)):
            y = F.linear(rows, w, b)
            assert y.shape == torch_f.linear(rows, w, b).shape
            assert F.linear(rows, w, b, activation="gelu").shape == y.shape
    # a 0-d input is refused with PyTorch's own error, as before
    with pytest.raises(RuntimeError):
        F.linear(torch.tensor(1.0), w, b)
    x = torch.randn(3, 16)
    torch.testing.assert_close(F.linear(x, w, b), torch_f.linear(x, w, b), rtol=1e-4, atol=1e-4)


def test_an_empty_batch_builds_no_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each empty call built its graph and failed (a failed signature is not remembered):
    75-100 µs per conv or norm call against PyTorch's 2 µs, on every frame without boxes
    (new-user audit). Now PyTorch's op runs before any graph is built."""
    import sys

    def no_graph(*args: object, **kwargs: object) -> None:
        raise AssertionError("a graph was built for an empty tensor")

    for name in ("functional", "norms", "pooling", "_attention"):
        module = sys.modules[f"dnntune.torch.{name}"]
        monkeypatch.setattr(module, "kernel_for", no_graph)
    x, w = torch.randn(0, 3, 8, 8), torch.randn(4, 3, 3, 3)
    rows, q = torch.randn(0, 16), torch.randn(0, 2, 4, 8)
    stats = torch.zeros(3), torch.ones(3)
    for _ in range(2):
        assert F.conv2d(x, w, padding=1).shape == (0, 4, 8, 8)
        assert F.linear(rows, torch.randn(4, 16)).shape == (0, 4)
        assert F.layer_norm(rows, (16,)).shape == (0, 16)
        assert F.rms_norm(rows, (16,)).shape == (0, 16)
        assert F.batch_norm(x, *stats).shape == x.shape
        assert F.max_pool2d(x, 2).shape == F.avg_pool2d(x, 2).shape == (0, 3, 4, 4)
        assert F.scaled_dot_product_attention(q, q, q).shape == q.shape
