"""Boolean attention masks broadcast along the keys (Hugging Face's, inside a CUDA-graph
recording): dnntune.torch's attention gives PyTorch's op the additive mask, so that its fused
kernels take it; the result is PyTorch's for the boolean one."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._masks import additive_mask, fused_kernels_refuse
from dnntune.torch.cuda_graphs import graphs_of


def _broadcast_mask(batch: int, q: int, k: int, device: str, masked_out: int = 3) -> torch.Tensor:
    """A key-padding mask broadcast over batch and queries with zero strides, whose keys are a
    strided view (every other element of a buffer): its last dimension is not unit-strided."""
    keys = torch.ones(k, 2, dtype=torch.bool, device=device)[:, 0]
    keys[k - masked_out :] = False
    mask = keys.expand(batch, 1, q, k)
    assert mask.stride() == (0, 0, 0, 2)
    return mask


def _hf_recorded_mask(batch: int, q: int, k: int, device: str) -> torch.Tensor:
    """The layout BERT-base's attention got inside a CUDA-graph recording (transformers 5.17,
    H200): strides (0, q, 1, 0), one value per query, broadcast along the keys."""
    rows = torch.ones(q, dtype=torch.bool, device=device)
    rows[1] = False  # a fully masked query row
    mask = rows[:, None].expand(q, k)[None, None].expand(batch, 1, q, k)
    assert mask.stride() == (0, q, 1, 0)
    return mask


@pytest.mark.parametrize("layout", [_broadcast_mask, _hf_recorded_mask])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_additive_mask_is_pytorchs_for_the_boolean_one(
    dtype: torch.dtype, layout: Callable[..., torch.Tensor]
) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g).to(dtype)
    k = torch.randn(2, 3, 7, 8, generator=g).to(dtype)
    v = torch.randn(2, 3, 7, 8, generator=g).to(dtype)
    mask = layout(2, 5, 7, "cpu")
    bias = additive_mask(mask, dtype)
    assert bias.dtype is dtype and bias.is_contiguous() and bias.shape == mask.shape
    assert bool((bias[mask] == 0).all()) and bool(torch.isneginf(bias[~mask]).all())
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


def test_fully_masked_rows_stay_zero_as_with_the_boolean_mask() -> None:
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 1, :] = False  # query 1 attends to nothing
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask(mask, q.dtype))
    assert not bool(b.isnan().any())
    torch.testing.assert_close(b, a)


def test_which_masks_are_converted() -> None:
    mask = _broadcast_mask(2, 4, 6, "cpu")
    q = torch.randn(2, 1, 4, 8)
    assert not fused_kernels_refuse(mask, q)  # CPU: PyTorch's CPU kernels take it as it is
    meta_q = torch.empty(2, 1, 4, 8, device="meta")
    meta_mask = _broadcast_mask(2, 4, 6, "meta")
    # a meta tensor is not CUDA either: only CUDA queries are ever converted
    assert not fused_kernels_refuse(meta_mask, meta_q)


@pytest.mark.gpu
def test_broadcast_boolean_mask_runs_fused_and_records_in_a_cuda_graph() -> None:
    """On CUDA the broadcast mask is converted (PyTorch's math path would run otherwise); the
    result matches PyTorch's op on the boolean mask, also replayed from a CUDA graph with the
    mask's values changed in place, and a dense boolean mask is passed as it is."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 12, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = _broadcast_mask(4, 128, 128, "cuda", masked_out=28)
    keys = mask[0, 0, 0]
    assert fused_kernels_refuse(mask, q)
    assert not fused_kernels_refuse(mask.contiguous(), q)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = dtt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dtt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = dtt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keys[60:] = False  # the mask's values change; the recording reads them
    graph.replay()
    torch.cuda.synchronize()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


class _MaskedAttention(nn.Module):
    """An attention block that builds its key-padding mask inside the forward, broadcast with
    a non-unit stride along the keys (as transformers' mask builders do inside a recording)."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        keys = torch.stack([keep, keep], -1)[..., 0]  # stride 2 along the keys
        mask = keys[:, None, None, :].expand(b, 1, s, s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_the_masked_attention_block_builds_a_mask_the_fused_kernels_refuse() -> None:
    """The GPU test's model, on the CPU: its mask has the layout under test."""
    seen: list[torch.Tensor] = []
    model = _MaskedAttention().eval()
    x, keep = torch.randn(2, 8, 64), torch.ones(2, 8, dtype=torch.bool)

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor) -> Any:
        seen.append(attn_mask)
        return q

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = spy  # type: ignore[assignment]
    try:
        model(x, keep)
    finally:
        F.scaled_dot_product_attention = original
    assert seen[0].dtype is torch.bool and seen[0].stride(-1) == 2


@pytest.mark.gpu
def test_an_optimized_model_replays_its_broadcast_mask_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optimize(cuda_graph=True) on a block whose forward builds a broadcast boolean mask: the
    recording runs the converted mask (the route is taken inside the capture) and every replay
    matches the eager model's output for new padding."""
    from dnntune.torch import _attention

    converted: list[int] = []
    real = _attention.additive_mask

    def counting(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        converted.append(1)
        return real(mask, dtype)

    monkeypatch.setattr(_attention, "additive_mask", counting)
    torch.manual_seed(0)
    ref = _MaskedAttention().to("cuda", torch.bfloat16).eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16)
    keep = torch.ones(4, 128, dtype=torch.bool, device="cuda")
    dtt.optimize(
        model, (x, keep), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True
    )
    assert converted  # the broadcast mask took the additive route
    with torch.no_grad():
        for cut in (128, 100, 37):
            keep = torch.ones(4, 128, dtype=torch.bool, device="cuda")
            keep[:, cut:] = False
            x = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(model(x, keep), ref(x, keep), atol=3e-2, rtol=3e-2)
    state = graphs_of(model)
    assert state.records >= 1 and state.replays >= 2
