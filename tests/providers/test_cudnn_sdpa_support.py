"""CUDNN_ENGINE declines, from the graph alone, the attention graphs cuDNN frontend's validation
refuses (GRAPH_NOT_SUPPORTED), so the planner moves to another engine with a reason instead of
a failed build, and keeps the ones it accepts.

The rules come from NVIDIA/cudnn-frontend 1.16 to 1.23 (``node/sdpa_support_surface.h`` and
``node/scaled_dot_product_flash_attention.h``); see ``providers/cudnn/support._sdpa_reason``.
No cuDNN and no GPU are needed.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

import dnntune as dt
from dnntune.errors import NotSupportedError
from dnntune.graph.ops.sdpa import DiagonalAlignment
from dnntune.providers.cudnn import CudnnEngine, _runtime
from dnntune.providers.cudnn.support import unsupported_reason

HALF = dt.DataType.HALF


def _attention(
    *,
    seq: tuple[int, int] = (64, 64),
    d: tuple[int, int] = (64, 64),
    mask: bool = False,
    q_strides: list[int] | None = None,
    o_strides: list[int] | None = None,
    alignment: bool = False,
    **flags: Any,
) -> dt.Graph:
    """A validated fp16 attention graph: b 2, h 4, (s_q, s_kv), (d_qk, d_v)."""
    g = dt.Graph(name="att", io_data_type=HALF, compute_data_type=dt.DataType.FLOAT)
    (sq, skv), (dqk, dv) = seq, d
    q = g.tensor("Q", [2, 4, sq, dqk], q_strides)
    k, v = g.tensor("K", [2, 4, skv, dqk]), g.tensor("V", [2, 4, skv, dv])
    m = g.tensor("M", [1, 4, sq, skv]) if mask else None
    (o,) = g.sdpa(q, k, v, attn_mask=m, **flags)
    o.set_output(True)
    if o_strides is not None:
        o.set_strides(o_strides)
    if alignment:  # causal_mask with a BOTTOM_RIGHT alignment, as hipDNN files give it
        g.nodes[0].params["diagonal_alignment"] = DiagonalAlignment.BOTTOM_RIGHT
    g.validate()
    return g


# ---- bottom-right causal with a bias ---------------------------------------------------------
@pytest.mark.parametrize("spelling", ["flag", "alignment"])
def test_bottom_right_causal_with_an_attention_bias_is_declined(spelling: str) -> None:
    """cuDNN frontend 1.9 to 1.23 refuse a bottom-right causal mask with a bias, whatever the
    lengths (s_q > s_kv was declined before, with its own reason)."""
    flags: dict[str, Any] = (
        {"causal_mask_bottom_right": True}
        if spelling == "flag"
        else {"causal_mask": True, "alignment": True}
    )
    fewer = unsupported_reason(_attention(seq=(48, 64), mask=True, **flags)) or ""
    assert "bottom-right causal mask (causal_mask_bottom_right)" in fewer
    assert "together with an additive attn_mask" in fewer
    assert "fold the causal mask into attn_mask (-inf where key j > i + 16)" in fewer
    square = unsupported_reason(_attention(seq=(64, 64), mask=True, **flags)) or ""
    assert "with s_q == s_kv the top-left causal_mask is the same mask" in square
    more = unsupported_reason(_attention(seq=(80, 64), mask=True, **flags)) or ""
    assert "more queries than keys (s_q 80 > s_kv 64" in more


def test_bottom_right_without_a_bias_and_top_left_with_one_still_lower() -> None:
    assert unsupported_reason(_attention(seq=(48, 64), causal_mask_bottom_right=True)) is None
    assert unsupported_reason(_attention(seq=(64, 64), causal_mask_bottom_right=True)) is None
    assert unsupported_reason(_attention(seq=(48, 64), mask=True, causal_mask=True)) is None
    assert unsupported_reason(_attention(seq=(80, 64), mask=True, causal_mask=True)) is None
    assert unsupported_reason(_attention(seq=(80, 64), mask=True)) is None


# ---- head dims -------------------------------------------------------------------------------
@pytest.mark.parametrize(("d", "shown"), [((12, 12), "d_qk 12, d_v 12"), ((64, 20), "d_v 20")])
def test_head_dims_that_are_not_multiples_of_8_are_declined(d: tuple[int, int], shown: str) -> None:
    reason = unsupported_reason(_attention(d=d)) or ""
    assert "head dims are not multiples of 8" in reason and shown in reason
    assert f"attn_scale set to 1/sqrt({d[0]})" in reason


@pytest.mark.parametrize("d", [(8, 8), (72, 72), (192, 128), (256, 256), (264, 264)])
def test_head_dims_the_frontend_accepts_are_not_declined(d: tuple[int, int]) -> None:
    """Multiples of 8; past 256 too: cuDNN frontend 1.12 to 1.23 refuse d > 256 only on cuDNN
    9.9 and older (and per architecture), so the graph alone does not decide it."""
    assert unsupported_reason(_attention(d=d)) is None
    assert unsupported_reason(_attention(d=d), backend_version=91900) is None


# ---- layouts ---------------------------------------------------------------------------------
def test_a_head_dim_that_is_not_contiguous_is_declined() -> None:
    # [B, H, S, D] read from a [B, H, D, S] buffer: the head dim has stride S
    reason = unsupported_reason(_attention(q_strides=[4 * 64 * 64, 64 * 64, 1, 64])) or ""
    assert "head dim (the last) is not contiguous; q_tensor_uid has strides" in reason
    reason = unsupported_reason(_attention(o_strides=[4 * 64 * 64, 64 * 64, 1, 64])) or ""
    assert "o_tensor_uid has strides [16384, 4096, 1, 64]" in reason
    # a [B, S, H, D] buffer keeps the head dim contiguous: accepted
    assert unsupported_reason(_attention(q_strides=[64 * 4 * 64, 64, 4 * 64, 1])) is None


# ---- rules that depend on the cuDNN version -------------------------------------------------
def test_bottom_right_lengths_below_cudnn_9_6() -> None:
    """cuDNN frontend 1.10 to 1.23: bottom-right needs s_q, s_kv multiples of 64 on cuDNN
    below 9.6.0; at 9.6.0 and without a known version nothing is declined."""
    odd = _attention(seq=(100, 100), causal_mask_bottom_right=True)
    reason = unsupported_reason(odd, backend_version=90501) or ""
    assert "multiples of 64 on cuDNN below 9.6.0 (this is 9.5.1; s_q 100, s_kv 100)" in reason
    assert unsupported_reason(odd, backend_version=90600) is None
    assert unsupported_reason(odd) is None
    even = _attention(seq=(64, 128), causal_mask_bottom_right=True)
    assert unsupported_reason(even, backend_version=90500) is None
    top_left = _attention(seq=(100, 100), causal_mask=True)
    assert unsupported_reason(top_left, backend_version=90500) is None


def test_one_query_under_a_causal_mask_on_cudnn_9_9_and_older() -> None:
    """cuDNN frontend 1.12 to 1.23 refuse s_q == 1 with a right bound (any causal mask) on
    cuDNN 9.9.0 and older."""
    top_left = _attention(seq=(1, 40), causal_mask=True)
    reason = unsupported_reason(top_left, backend_version=90900) or ""
    assert "causal mask (causal_mask) over a single query (s_q 1)" in reason
    assert "(this is 9.9.0)" in reason and "keeps every key" not in reason
    bottom_right = _attention(seq=(1, 40), causal_mask_bottom_right=True)
    reason = unsupported_reason(bottom_right, backend_version=90700) or ""
    assert "causal_mask_bottom_right" in reason and "keeps every key" in reason
    assert unsupported_reason(top_left, backend_version=91000) is None
    assert unsupported_reason(top_left) is None
    assert unsupported_reason(_attention(seq=(1, 40)), backend_version=90900) is None


# ---- the engine asks with the loaded cuDNN's version ----------------------------------------
class _CudaLike:
    is_cuda = True

    class device:
        type = "cuda"
        index = 0


@pytest.fixture
def cudnn_9_5(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The loaded ``cudnn`` says cuDNN 9.5.0 (a stand-in: nothing else is called)."""
    fake = types.SimpleNamespace(backend_version=lambda: 90500, __version__="1.16.0")
    monkeypatch.setattr(_runtime, "_module", fake)
    yield
    _runtime.reset_for_tests()


def test_check_support_applies_the_loaded_cudnn_version(cudnn_9_5: None) -> None:
    g = _attention(seq=(100, 100), causal_mask_bottom_right=True)
    with pytest.raises(NotSupportedError, match=r"below 9\.6\.0 \(this is 9\.5\.0"):
        CudnnEngine().check_support(g, _CudaLike())  # type: ignore[arg-type]
    g = _attention(seq=(64, 64), d=(12, 12))
    with pytest.raises(NotSupportedError, match="not multiples of 8"):
        CudnnEngine().check_support(g, _CudaLike())  # type: ignore[arg-type]
