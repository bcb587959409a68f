"""``dnntune.torch`` layers on views 2, 4 or 8 bytes into their buffers, where the heuristic
picks cuDNN (providers/cudnn/alignment.py). Before the fix, on an H100 with cuDNN 9.19
(session 59's probe), ``conv2d`` on such a view raised ``CUDNN_STATUS_BAD_PARAM_MISALIGNED_
POINTER`` and ``linear`` returned wrong numbers (max error 6.8) without an error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dnntune.torch as dtt

pytestmark = pytest.mark.gpu


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """``t``'s values in a new buffer, ``elements`` elements into it."""
    buffer = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = buffer[elements:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("aligned_first", [True, False])
@pytest.mark.parametrize("elements", [1, 2, 4])
def test_dnntune_torch_layers_on_misaligned_views_match_pytorch(
    elements: int, aligned_first: bool
) -> None:
    """The probe's calls: plans are cuDNN's where the heuristic picks it, the signature's
    kernel made (and checked) on an aligned tensor or on the misaligned view, then called on
    the other."""
    torch.manual_seed(0)
    dtt.configure(policy="heuristic")
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.half) * 0.05
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.half)
    lw = torch.randn(1024, 1024, device="cuda", dtype=torch.half) * 0.03
    lb = torch.randn(1024, device="cuda", dtype=torch.half)
    a = torch.randn(512, 1024, device="cuda", dtype=torch.half)
    shifted = (_offset(x, elements), _offset(a, elements))
    for xi, ai in [(x, a), shifted] if aligned_first else [shifted, (x, a)]:
        torch.testing.assert_close(
            dtt.conv2d(xi, w, padding=1), F.conv2d(xi, w, padding=1), atol=2e-2, rtol=2e-2
        )
        torch.testing.assert_close(
            dtt.linear(ai, lw, lb), F.linear(ai, lw, lb), atol=3e-2, rtol=2e-2
        )
    assert "CUDNN_ENGINE" in dtt.runtime_stats.decisions.values()
