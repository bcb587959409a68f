"""TRITON_ENGINE's attention kernel where it runs anywhere: which SDPA graphs it takes (and why
it declines the others), what the match hands the kernel, the config space and its
constraints; then the kernel itself in Triton's interpreter on the CPU against
``dnntune.reference`` (fp16 and fp32: the interpreter has no bf16 products; bf16 runs in the GPU
tests), skipped without triton."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interpreter import interpreter_problem, run_interpreted
from triton_cases import BF, F, H, attention_graph

import dnntune as dt
from dnntune.errors import NotSupportedError
from dnntune.providers.triton import TritonEngine
from dnntune.providers.triton.attention_match import AttentionMatch
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.solvers import (
    MAX_CANDIDATES,
    AttentionSolver,
    DeviceLimits,
    solver_for,
)

H200 = DeviceLimits(smem_per_block=232448, sm_count=132)
BOOL = dt.DataType.BOOLEAN
REPO = Path(__file__).resolve().parents[2]


def _attn(graph: dt.Graph) -> AttentionMatch:
    match = match_graph(graph)
    assert isinstance(match, AttentionMatch)
    return match


# ---- what the kernel takes ------------------------------------------------------------------
def test_a_swin_window_matches_with_its_layout() -> None:
    window = [8, 3, 49, 32]
    m = _attn(attention_graph(window, window, BF, mask=[8, 3, 49, 49], interleaved=True))
    assert (m.batch, m.heads, m.group, m.sq, m.skv, m.d) == (8, 3, 1, 49, 49, 32)
    # a Linear's qkv output: rows 3*H*D apart, heads D apart, the channels contiguous
    assert m.q.strides == (49 * 288, 32, 288, 1) == m.k.strides == m.v.strides
    assert m.o.strides == (3 * 49 * 32, 49 * 32, 32, 1)
    assert m.mask is not None and m.mask.strides == (3 * 49 * 49, 49 * 49, 49, 1)
    assert not m.mask_is_bool and not m.causal and not m.ieee
    assert m.scale == pytest.approx(32**-0.5)


def test_a_broadcast_mask_reads_stride_zero_where_it_broadcasts() -> None:
    m = _attn(attention_graph([2, 4, 5, 16], [2, 4, 5, 16], H, mask=[1, 4, 1, 5]))
    assert m.mask is not None and m.mask.strides == (0, 5, 0, 1)


def test_grouped_heads_causal_alignments_and_the_scale() -> None:
    q, kv, mask = [2, 4, 5, 16], [2, 2, 9, 16], [1, 1, 5, 9]
    top = _attn(attention_graph(q, kv, BF, mask=mask, mask_type=BOOL, causal=True))
    bottom = _attn(attention_graph(q, kv, BF, mask=mask, mask_type=BOOL, bottom_right=True))
    assert top.group == bottom.group == 2
    assert (top.causal, top.causal_offset) == (True, 0)
    assert (bottom.causal, bottom.causal_offset) == (True, 9 - 5)
    assert bottom.mask_is_bool
    assert _attn(attention_graph([1, 1, 4, 16], [1, 1, 4, 16], F, scale=0.3)).scale == 0.3
    assert _attn(attention_graph([1, 1, 4, 16], [1, 1, 4, 16], F)).ieee  # fp32: no tf32


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (lambda: attention_graph([1, 2, 8, 16], [1, 2, 8, 16], H, stats=True), "stats"),
        (lambda: attention_graph([1, 2, 8, 16], [1, 2, 65, 16], H), "65 keys > 64"),
        (lambda: attention_graph([1, 2, 8, 256], [1, 2, 8, 256], H), "head dimension 256"),
        (lambda: attention_graph([1, 2, 8, 16], [1, 2, 8, 16], H, dv=32), "value channels"),
    ],
    ids=["stats", "long_sequence", "wide_head", "other_value_width"],
)
def test_declines_say_why(graph: object, reason: str) -> None:
    with pytest.raises(NotSupportedError, match=reason):
        match_graph(graph())  # type: ignore[operator]


def test_a_strided_head_dimension_is_declined() -> None:
    g = dt.Graph(name="a", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    q = g.tensor("q", [1, 2, 8, 16], strides=[256, 1, 32, 2])
    k, v = g.tensor("k", [1, 2, 8, 16]), g.tensor("v", [1, 2, 8, 16])
    (o,) = g.sdpa(q, k, v)
    o.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="head dimension must be contiguous"):
        match_graph(g)


def test_the_engine_offers_its_knobs_for_an_attention() -> None:
    g = attention_graph([8, 3, 49, 32], [8, 3, 49, 32], BF, mask=[8, 3, 49, 49])
    knobs = {k.knob_id: k for k in TritonEngine().knobs(g)}
    solver_knobs = ("block_m", "block_n", "num_warps", "num_stages")
    assert {f"triton.{name}" for name in solver_knobs} <= set(knobs)
    # each knob's default-plan value is the default config's (a pin of it builds that again)
    assert knobs["triton.block_n"].default_plan_values == frozenset({32})
    assert knobs["triton.num_stages"].default_plan_values == frozenset({2})


# ---- the config space -----------------------------------------------------------------------
def test_a_short_window_runs_small_tiles_by_default() -> None:
    m = _attn(attention_graph([8, 3, 49, 32], [8, 3, 49, 32], BF, mask=[8, 3, 49, 49]))
    solver = solver_for(m)
    assert isinstance(solver, AttentionSolver)
    # small tiles, many programs (H100: 92-99 µs a call against 225-242 for one 64x64 pass)
    small = {"block_m": 32, "block_n": 32, "num_warps": 2, "num_stages": 2}
    assert solver.default(m, H200) == small
    # a head of 128 channels: 64-row blocks over 4 warps, the keys in one block
    m = _attn(attention_graph([8, 3, 49, 128], [8, 3, 49, 128], BF))
    assert solver.default(m, H200) == {
        "block_m": 64,
        "block_n": 64,
        "num_warps": 4,
        "num_stages": 1,
    }


def test_few_queries_take_the_smallest_tiles() -> None:
    m = _attn(attention_graph([2, 4, 1, 64], [2, 4, 40, 64], H))
    assert solver_for(m).default(m, H200) == {
        "block_m": 16,
        "block_n": 32,
        "num_warps": 2,
        "num_stages": 2,  # 40 keys in two blocks
    }


def test_candidates_fit_and_stay_bounded() -> None:
    for graph in (
        attention_graph([8, 3, 49, 32], [8, 3, 49, 32], BF, mask=[8, 3, 49, 49]),
        attention_graph([2, 16, 64, 64], [2, 4, 64, 64], H, causal=True),
        attention_graph([1, 4, 3, 128], [1, 4, 60, 128], F),
    ):
        m = _attn(graph)
        solver = solver_for(m)
        found = solver.candidates(m, H200, {})
        assert 1 < len(found) <= MAX_CANDIDATES
        assert found[0] == solver.default(m, H200)
        assert all(solver.check(c, m, H200) is None for c in found)
        assert all(c["block_m"] <= max(16, 1 << (m.sq - 1).bit_length()) for c in found)


def test_a_config_that_spills_names_the_knobs_to_change() -> None:
    m = _attn(attention_graph([1, 2, 64, 128], [1, 2, 64, 128], H))
    config = {"block_m": 64, "block_n": 64, "num_warps": 1, "num_stages": 1}
    violation = AttentionSolver().check(config, m, H200)
    assert violation is not None and "num_warps" in violation.knobs
    assert "per thread" in violation.reason


# ---- the kernel in Triton's interpreter (CPU) -----------------------------------------------
_SCRIPT = r"""
import json, math, sys
import torch
from dnntune import reference
from dnntune.providers.triton.engine import build_launcher
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.solvers import DeviceLimits, solver_for

sys.path.insert(0, sys.argv[1])
from triton_cases import attention_graph, F, H
import dnntune as dt

B = dt.DataType.BOOLEAN
W = [4, 3, 49, 32]
cases = {
    "swin_window_interleaved": attention_graph(W, W, H, mask=[4, 3, 49, 49], interleaved=True),
    "broadcast_bias_fp32": attention_graph([2, 3, 49, 32], [2, 3, 49, 32], F, mask=[1, 3, 49, 49]),
    "gqa_bool_bottom_right": attention_graph(
        [2, 4, 5, 16], [2, 2, 9, 16], H, mask=[1, 1, 5, 9], mask_type=B, bottom_right=True
    ),
    "causal_fp32_head24": attention_graph([1, 2, 60, 24], [1, 2, 60, 24], F, causal=True),
    "cross_keys_fp16": attention_graph([2, 2, 3, 64], [2, 2, 64, 64], H, scale=0.2),
    "head128_fp16": attention_graph([1, 2, 40, 128], [1, 2, 50, 128], H, bottom_right=True),
    "rows_with_no_key": attention_graph([1, 1, 6, 16], [1, 1, 3, 16], F, bottom_right=True),
}
ran, bad = 0, []
for name, graph in cases.items():
    match = match_graph(graph)
    solver = solver_for(match)
    configs = [solver.default(match, DeviceLimits())]
    found = solver.candidates(match, DeviceLimits(), {})
    configs += [c for c in found if c["block_n"] < match.skv][:2]  # several key blocks
    pack = reference.make_inputs(graph, "cpu", seed=0)
    out = graph.output_tensors()[0]
    if name == "swin_window_interleaved":  # -inf where a window's regions part: rows keep some keys
        m = [t for t in graph.tensors if t.name == "mask"][0]
        pack[m.uid].masked_fill_(torch.rand(pack[m.uid].shape) < 0.3, -math.inf)
        pack[m.uid][..., :, 0] = 0.0
    expected = reference.run(graph, {u: t for u, t in pack.items() if u != out.uid})
    for config in configs:
        pack[out.uid].fill_(float("nan"))
        build_launcher(match, config)(pack, torch.empty(1, dtype=torch.uint8))
        ran += 1
        tolerance = reference.tolerance_for(graph, out)
        cmp = reference.compare(pack[out.uid], expected[out.uid], tolerance)
        if not cmp.ok:
            bad.append({"case": name, "config": config, "message": cmp.message})
print(json.dumps({"ran": ran, "bad": bad}))
"""


def test_the_kernel_in_the_interpreter_matches_the_reference() -> None:
    pytest.importorskip("triton")
    problem = interpreter_problem()
    if problem is not None:
        pytest.skip(problem)
    result = run_interpreted(["-c", _SCRIPT, str(Path(__file__).parent)], timeout=280)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ran"] >= 12
    assert not report["bad"], json.dumps(report["bad"][:3], indent=1)


# ---- the graph dnntune.torch builds for Swin's window attention -------------------------------
def test_the_graph_of_swins_window_attention_call_runs_on_the_kernel_first() -> None:
    """``dnntune.torch``'s ``scaled_dot_product_attention`` builds its graph from the call's
    tensors (``torch/graphs.py``); for the window attention stand-in's call (q, k and v views of
    a Linear's qkv output, the bias + shift mask as a mask of every window) the kernel
    takes that graph, with the output laid out as the query, and static ordering puts it first
    on CUDA: the route that took Swin-T from 3.73 to 2.80-2.85 ms (session 48, H100)."""
    from types import SimpleNamespace
    from typing import Any

    import torch

    from dnntune.backend.heuristics import HeuristicMode, static_order
    from dnntune.torch.graphs import sdpa_graph

    windows, tokens, heads, dim = 256, 49, 3, 32  # 8 images of 32 windows
    qkv = torch.zeros(windows, tokens, 3, heads, dim, dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    mask = torch.zeros(windows, heads, tokens, tokens, dtype=torch.bfloat16)  # the input's type
    build = sdpa_graph(q, k, v, mask, causal=False, scale=dim**-0.5)
    build.graph.validate()
    m = _attn(build.graph)
    assert m.q.strides == (tokens * 3 * heads * dim, dim, 3 * heads * dim, 1)
    assert m.o.strides == (tokens * heads * dim, dim, heads * dim, 1)  # as the query: no copy
    assert m.mask is not None and m.mask.dtype is BF and not m.mask_is_bool

    class _Named:
        def __init__(self, name: str) -> None:
            self.name = name

    engines: list[Any] = [_Named(n) for n in ("CUDNN_ENGINE", "TORCH_ENGINE", "TRITON_ENGINE")]
    handle: Any = SimpleNamespace(is_cuda=True)
    order = static_order(build.graph, handle, engines, HeuristicMode.A)
    assert order[0].name == "TRITON_ENGINE"  # 768 windows x heads


def test_every_kernel_with_a_solver_has_a_launcher() -> None:
    """A build takes the match's kernel name to its solver and to its launcher: one table each
    (``solvers.SOLVERS``, ``launchers.LOADERS``), the same names in both."""
    from dnntune.providers.triton.launchers import LOADERS
    from dnntune.providers.triton.solvers import SOLVERS

    assert set(LOADERS) == set(SOLVERS)
    assert "attention" in LOADERS
