"""Attention rows that see no key: one behaviour for the reference, every engine and PyTorch.

A bottom-right causal mask with s_q > s_kv keeps key j for query i where j <= i + (s_kv - s_q),
so the first s_q - s_kv rows keep none. An audit read the reference's 0 there against a NaN
from "torch"; that NaN is the plain softmax of PyTorch's documentation (0/0), not PyTorch's op:
``F.scaled_dot_product_attention`` gives 0 since PyTorch 2.5, as the reference does. The CPU
engines are held to the same rows here (exactly 0, stats -inf: not a sentinel left unwritten);
CUDNN_ENGINE declines the graph, as cuDNN frontend refuses it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import dnntune as dt
from dnntune import reference
from dnntune.graph.ops.sdpa import DiagonalAlignment
from dnntune.providers.cudnn.support import unsupported_reason

FLOAT, HALF, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
SQ, SKV = 6, 4  # rows 0 and 1 see no key under bottom-right alignment
BLIND = SQ - SKV


def _attention(
    io: dt.DataType,
    *,
    heads: tuple[int, int] = (2, 2),
    mask: str = "",
    stats: bool = False,
    seq: tuple[int, int] = (SQ, SKV),
    **flags: Any,
) -> tuple[dt.Graph, list[dt.TensorAttributes]]:
    g = dt.Graph(name="rows_without_keys", io_data_type=io, compute_data_type=FLOAT)
    (h, hk), (sq, skv) = heads, seq
    q = g.tensor("Q", [2, h, sq, 16])
    k, v = g.tensor("K", [2, hk, skv, 16]), g.tensor("V", [2, hk, skv, 16])
    m = None
    if mask == "bool":
        m = g.tensor("M", [2, 1, sq, skv], data_type=dt.DataType.BOOLEAN)
    elif mask == "additive":
        m = g.tensor("M", [1, h, sq, skv])
    flags = flags or {"causal_mask_bottom_right": True}
    outs = g.sdpa(q, k, v, attn_mask=m, generate_stats=stats, **flags)
    for t in outs:
        t.set_output(True)
    return g, outs


def _bottom_right_keep(sq: int, skv: int) -> torch.Tensor:
    return torch.arange(skv)[None, :] <= torch.arange(sq)[:, None] + (skv - sq)


def test_the_reference_gives_zero_and_minus_inf() -> None:
    g, (o, stats) = _attention(FLOAT, stats=True)
    pack = reference.make_inputs(g, "cpu", seed=3)
    out = reference.run(g, pack)
    assert o.uid is not None and stats.uid is not None
    assert torch.equal(out[o.uid][:, :, :BLIND], torch.zeros(2, 2, BLIND, 16))
    assert out[stats.uid][:, :, :BLIND].isneginf().all()
    assert out[o.uid][:, :, BLIND:].abs().sum() > 0
    assert out[stats.uid][:, :, BLIND:].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], ids=str)
def test_pytorch_gives_zero_and_its_documented_formula_nan(
    backend: SDPBackend, dtype: torch.dtype
) -> None:
    """What the reference's 0 agrees with (PyTorch's op, either CPU kernel, a boolean or an
    additive mask) and what it does not (the softmax written out in PyTorch's docs)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 8, generator=gen, dtype=dtype) for s in (SQ, SKV, SKV))
    keep = _bottom_right_keep(SQ, SKV)
    additive = torch.zeros(SQ, SKV, dtype=dtype).masked_fill(~keep, -math.inf)
    for mask in (keep, additive):
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q, k, v, mask)
        assert torch.equal(o[:, :, :BLIND], torch.zeros_like(o[:, :, :BLIND])), torch.__version__
        assert o[:, :, BLIND:].isfinite().all()
    documented = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + additive, -1) @ v
    assert documented[:, :, :BLIND].isnan().all()


@pytest.mark.parametrize(
    ("engine", "knobs"),
    [
        ("TORCH_ENGINE", {}),
        ("TORCH_ENGINE", {"torch.sdpa_backend": "math"}),
        ("TORCH_ENGINE", {"torch.sdpa_backend": "flash"}),
        pytest.param("TORCH_COMPILE_ENGINE", {}, marks=pytest.mark.slow),  # compiles: seconds
    ],
    ids=["eager", "eager-math", "eager-flash", "compile"],
)
@pytest.mark.parametrize(
    ("io", "heads", "mask", "stats"),
    [
        (FLOAT, (2, 2), "", False),
        (FLOAT, (4, 2), "bool", True),
        (HALF, (4, 2), "additive", False),
        (BF16, (2, 2), "", True),
    ],
    ids=["float", "float-gqa-bool-stats", "half-gqa-additive", "bf16-stats"],
)
def test_cpu_engines_give_the_reference_rows(
    engine: str,
    knobs: dict[str, str],
    io: dt.DataType,
    heads: tuple[int, int],
    mask: str,
    stats: bool,
    cpu_handle: dt.Handle,
) -> None:
    g, outs = _attention(io, heads=heads, mask=mask, stats=stats)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(engine, knobs)
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    pack = reference.make_inputs(g, "cpu", seed=5)
    for t in outs:
        assert t.uid is not None
        pack[t.uid].fill_(float("nan"))  # an unwritten row is no answer
    g.execute(cpu_handle, pack)
    o = pack[outs[0].uid]  # type: ignore[index]
    assert torch.equal(o[:, :, :BLIND], torch.zeros_like(o[:, :, :BLIND]))
    if stats:
        assert pack[outs[1].uid][:, :, :BLIND].isneginf().all()  # type: ignore[index]
    result = reference.check_outputs(g, pack, reference.run(g, pack))
    assert result.ok, result


def test_a_nan_where_a_row_sees_no_key_fails_the_check() -> None:
    g, (o,) = _attention(FLOAT)
    pack = reference.make_inputs(g, "cpu", seed=5)
    expected = reference.run(g, pack)
    assert o.uid is not None
    pack[o.uid].copy_(expected[o.uid])
    assert reference.check_outputs(g, pack, expected).ok
    pack[o.uid][:, :, :BLIND] = float("nan")
    assert not reference.check_outputs(g, pack, expected).ok


def _cudnn_reason(g: dt.Graph) -> str | None:
    g.validate()
    return unsupported_reason(g)


def test_cudnn_engine_declines_bottom_right_with_more_queries_than_keys() -> None:
    """cuDNN frontend refuses it (GRAPH_NOT_SUPPORTED unless a padding mask is set): CUDNN_ENGINE
    says so from the graph, before any GPU work."""
    flag, _ = _attention(HALF, causal_mask_bottom_right=True)
    aligned, _ = _attention(HALF, causal_mask=True)  # the alignment, as hipDNN files give it
    aligned.nodes[0].params["diagonal_alignment"] = DiagonalAlignment.BOTTOM_RIGHT
    for g in (flag, aligned):
        reason = _cudnn_reason(g) or ""
        assert "bottom-right causal mask with more queries than keys (s_q 6 > s_kv 4" in reason
        assert "the first 2 query rows see no key" in reason
    # the same mask with no more queries than keys, and top-left with more, lower as before
    assert _cudnn_reason(_attention(HALF, seq=(4, 4))[0]) is None
    assert _cudnn_reason(_attention(HALF, seq=(4, 6))[0]) is None
    assert _cudnn_reason(_attention(HALF, causal_mask=True)[0]) is None
