"""An empty batch (a detector's frame with no boxes) runs PyTorch's own op, quietly: no graph
has a zero-sized dim, and that is an expected route, not a failure (helper audit, session 20:
each op warned "dnntune cannot run it" quoting a graph-validation error, and used up its one
such warning, so a later real failure of that op would have been silent)."""

from __future__ import annotations

import warnings

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
