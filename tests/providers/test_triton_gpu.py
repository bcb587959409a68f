"""TRITON_ENGINE on a GPU: every kernel against ``dnntune.reference`` (fp16, bf16, fp32; odd
shapes, M=1, large N), split-K, the search and its perf db, the tuning policies and the
in-memory memo. Skipped without CUDA or without triton."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from triton_cases import (
    BF,
    F,
    H,
    attention_graph,
    matmul_graph,
    norm_graph,
    pointwise_graph,
    reduction_graph,
)

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.providers.triton import TritonEngine
from dnntune.providers.triton.perf_db import default_db
from dnntune.reference import compare, make_inputs, run, tolerance_for

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
pytest.importorskip("triton")


class CountingTimer:
    """Wraps the handle's timer and counts timed calls (the search's only clock)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.calls = 0

    def synchronize(self) -> None:
        self.inner.synchronize()

    def time_ms(self, fn: Any, repeats: int = 1) -> float:
        self.calls += 1
        return float(self.inner.time_ms(fn, repeats))


def _engine() -> TritonEngine:
    engine = get_registry().get("TRITON_ENGINE")
    assert isinstance(engine, TritonEngine)
    return engine


def _settings(**knobs: int) -> list[KnobSetting]:
    return [KnobSetting(k.replace("__", "."), v) for k, v in knobs.items()]


def check(graph: dt.Graph, handle: dt.Handle, settings: Sequence[KnobSetting] = ()) -> Any:
    """Build, run on reference inputs, compare every output; returns the plan."""
    engine = _engine()
    assert get_registry().why_not(engine, graph, handle) is None
    plan = engine.compile(graph, list(settings), handle)
    pack = make_inputs(graph, handle.device, seed=3)
    ws = (
        torch.empty(plan.workspace_size, dtype=torch.uint8, device=handle.device)
        if plan.workspace_size
        else None
    )
    plan.execute(pack, ws)
    torch.cuda.synchronize()
    expected = run(graph, pack)
    for t in graph.output_tensors():
        assert t.uid is not None
        result = compare(pack[t.uid], expected[t.uid], tolerance_for(graph, t))
        assert result.ok, f"{graph.name} {t.name} {plan.metadata.get('config')}: {result.message}"
    return plan


# ---- kernels against the reference ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [H, BF, F])
@pytest.mark.parametrize(
    ("m", "n", "k", "epilogue"),
    [
        (1, 4096, 4096, ("bias", "gelu")),
        (16, 6144, 1024, ("bias", "gelu_tanh")),
        (33, 100, 70, ("bias", "silu", "res")),
        (257, 1000, 300, ("relu", "scale")),
        (512, 3072, 768, ("bias", "gelu")),
        (7, 20000, 64, ()),
    ],
)
def test_matmul_epilogues(
    cuda_handle: dt.Handle, dtype: dt.DataType, m: int, n: int, k: int, epilogue: tuple[str, ...]
) -> None:
    check(matmul_graph(m, n, k, dtype, epilogue), cuda_handle)


@pytest.mark.parametrize("dtype", [H, BF])
def test_batched_transposed_matmul(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    check(matmul_graph(40, 72, 96, dtype, ("bias", "res"), batch=3, b_transposed=True), cuda_handle)


@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("dtype", [H, BF, F])
def test_split_k(cuda_handle: dt.Handle, dtype: dt.DataType, split: int) -> None:
    g = matmul_graph(3, 200, 2048, dtype, ("bias", "gelu", "res"))
    plan = check(g, cuda_handle, _settings(triton__split_k=split))
    assert plan.metadata["config"]["split_k"] == split
    assert plan.workspace_size == split * 3 * 200 * 4


@pytest.mark.parametrize("split", [1, 4])
def test_a_bound_matmul_call_is_right_on_new_buffers(cuda_handle: dt.Handle, split: int) -> None:
    """Issue 22: a Triton GEMM's bound call (what Graph.execute and dnntune.torch run) launches
    the compiled kernels directly once they are compiled (split-K: the GEMM and its reduction,
    on the workspace), and stays right on fresh buffers at new addresses, with the uids bound
    in another order."""
    g = matmul_graph(64, 96, 1024, H, ("bias", "gelu"))  # K: enough K tiles for 4 splits
    plan = check(g, cuda_handle, _settings(triton__split_k=split))
    uids = sorted((t.uid for t in g.io_tensors() if t.uid is not None), reverse=True)
    call = plan.bind(uids)
    ws = (
        torch.empty(plan.workspace_size, dtype=torch.uint8, device=cuda_handle.device)
        if plan.workspace_size
        else None
    )
    for seed in (11, 12, 13):
        pack = make_inputs(g, cuda_handle.device, seed=seed)
        call([pack[u] for u in uids], ws)
        torch.cuda.synchronize()
        expected = run(g, pack)
        for t in g.output_tensors():
            assert t.uid is not None
            assert compare(pack[t.uid], expected[t.uid], tolerance_for(g, t)).ok
    launcher = plan._launch
    assert launcher.mm._compiled is not None, "the direct launch path stayed off"
    if split > 1:
        assert launcher.reduce._compiled is not None, "the reduction's direct path stayed off"


@pytest.mark.parametrize("dtype", [H, BF, F])
@pytest.mark.parametrize("op", ["ln", "rms"])
@pytest.mark.parametrize(
    ("rows", "n"),
    [
        ([1], 1),
        ([3, 5], 50),
        ([64], 4096),
        ([2], 65536 + 37),
        ([1000], 1000),
        # several rows per program, unmasked (4096 rows) and with a ragged last program
        ([4096], 1024),
        ([2051], 1024),
    ],
)
def test_norms(
    cuda_handle: dt.Handle, dtype: dt.DataType, op: str, rows: list[int], n: int
) -> None:
    check(norm_graph(op, rows, n, dtype), cuda_handle)


@pytest.mark.parametrize("op", ["ln", "rms"])
def test_norm_training_statistics_and_chunked_rows(cuda_handle: dt.Handle, op: str) -> None:
    g = norm_graph(op, [37], 3000, BF, training=True, bias=False)
    check(g, cuda_handle)
    check(g, cuda_handle, _settings(triton__block_n=512, triton__num_warps=4))


@pytest.mark.parametrize("dtype", [H, BF, F])
@pytest.mark.parametrize("mode", ["ADD", "AVG", "MAX", "MIN", "AMAX", "NORM1", "NORM2"])
@pytest.mark.parametrize(("rows", "n"), [(1, 7), (300, 1000), (8, 70000)])
def test_reductions(
    cuda_handle: dt.Handle, dtype: dt.DataType, mode: str, rows: int, n: int
) -> None:
    # x in each io type (the kernel loads it as such), y in float32: tolerance_for's float32
    # tolerance, grown for the long sums (70000 terms)
    check(reduction_graph(rows, n, dt.ReductionMode[mode], dtype), cuda_handle)


@pytest.mark.parametrize("dtype", [H, BF, F])
@pytest.mark.parametrize("dims", [[1], [3, 5, 7], [1024, 4097], [2, 1, 3000]])
def test_pointwise_chains(cuda_handle: dt.Handle, dtype: dt.DataType, dims: list[int]) -> None:
    check(pointwise_graph(dims, dtype), cuda_handle)


def test_pointwise_every_mode(cuda_handle: dt.Handle) -> None:
    for mode in dt.PointwiseMode:
        g = dt.Graph(name=f"pw_{mode.json_name}", io_data_type=F, compute_data_type=F)
        args = [g.tensor("A", [65, 33], strides=[1, 65])]
        if mode.arity > 1:
            args.append(g.tensor("B", [1, 33]))
        if mode.arity > 2:
            args.append(g.tensor("C", [65, 33]))
        y = g.pointwise(*args, mode=mode)
        y.set_output(True)
        g.validate()
        check(g, cuda_handle)


# ---- search, perf db, policies --------------------------------------------------------------
def test_search_writes_the_db_and_a_plain_build_reuses_it(cuda_handle: dt.Handle) -> None:
    g = norm_graph("rms", [4096], 1024, BF)
    engine = _engine()
    timer = CountingTimer(cuda_handle.timer)
    cuda_handle.set_timer(timer)
    plan = check(g, cuda_handle, _settings(global__benchmarking=1))
    assert plan.metadata["config_source"] == "search"
    assert plan.metadata["timed_candidates"] >= 2
    assert timer.calls >= 2 * 6
    db = default_db()
    assert db is not None
    records = db.records("norm")
    assert len(records) == 1 and records[0]["config"] == plan.metadata["config"]
    timer.calls = 0
    again = engine.compile(g, [], cuda_handle)
    assert again.metadata["config_source"] == "perf_db"
    assert again.metadata["config"] == plan.metadata["config"]
    assert timer.calls == 0
    # benchmarking again (policy 0 = SEARCH when asked): the record is reused, no timing
    third = engine.compile(g, _settings(global__benchmarking=1), cuda_handle)
    assert third.metadata["config_source"] == "perf_db" and timer.calls == 0


def test_policies_end_to_end(cuda_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    g = matmul_graph(64, 512, 512, H, ("bias", "gelu"))
    engine = _engine()
    timer = CountingTimer(cuda_handle.timer)
    cuda_handle.set_timer(timer)
    db = default_db()
    assert db is not None

    none = engine.compile(
        g, _settings(triton__tuning_policy=1, global__benchmarking=1), cuda_handle
    )
    assert none.metadata["config_source"] == "default" and timer.calls == 0
    assert db.records("matmul") == []

    search = engine.compile(g, _settings(triton__tuning_policy=3), cuda_handle)
    assert search.metadata["config_source"] == "search" and timer.calls > 0
    assert len(db.records("matmul")) == 1

    # NONE again: now it reads the record (the memo of the first NONE build was dropped)
    calls = timer.calls
    reread = engine.compile(g, _settings(triton__tuning_policy=1), cuda_handle)
    assert reread.metadata["config_source"] == "perf_db" and timer.calls == calls

    update = engine.compile(
        g, _settings(triton__tuning_policy=2, global__benchmarking=1), cuda_handle
    )
    assert update.metadata["config_source"] == "search" and timer.calls > calls
    assert len(db.records("matmul")) == 2  # appended; the last line wins

    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "1")
    calls = timer.calls
    forced_none = engine.compile(g, _settings(triton__tuning_policy=1), cuda_handle)
    assert forced_none.metadata["config_source"] == "perf_db" and timer.calls == calls
    monkeypatch.delenv("DNNTUNE_FORCE_BENCHMARKING")

    clean = engine.compile(g, _settings(triton__tuning_policy=5), cuda_handle)
    assert clean.metadata["config_source"] == "default"
    assert clean.metadata["deleted_records"] == 2
    assert db.records("matmul") == []
    after = engine.compile(g, [], cuda_handle)
    assert after.metadata["config_source"] == "default"


def test_policies_never_share_a_memo_entry(cuda_handle: dt.Handle) -> None:
    g = pointwise_graph([256, 256], H)
    engine = _engine()
    a = engine.compile(g, _settings(triton__tuning_policy=1), cuda_handle)
    b = engine.compile(g, _settings(triton__tuning_policy=4), cuda_handle)
    c = engine.compile(g, _settings(triton__tuning_policy=1), cuda_handle)
    assert a.metadata["config_source"] == "default"
    assert b.metadata["config_source"] == "search"
    assert c.metadata["config_source"] == "perf_db"  # NONE's memo was dropped by the write


def test_through_the_graph_api(cuda_handle: dt.Handle) -> None:
    g = matmul_graph(128, 256, 512, BF, ("bias", "gelu"))
    g.build_operation_graph(cuda_handle)
    g.create_execution_plan_ext("TRITON_ENGINE", {"triton.tuning_policy": 4})
    g.check_support()
    g.build_plans()
    pack = make_inputs(g, "cuda", seed=1)
    ws_bytes = g.get_workspace_size()
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
    g.execute(cuda_handle, pack, ws)
    torch.cuda.synchronize()
    expected = run(g, pack)
    out = g.output_tensors()[0]
    assert out.uid is not None
    assert compare(pack[out.uid], expected[out.uid], tolerance_for(g, out)).ok


def test_launches_take_the_direct_path_and_stay_right_on_new_buffers(
    cuda_handle: dt.Handle,
) -> None:
    """Issue 22: Triton 3.6's launch hooks are an empty HookChain, never None; the direct
    launch must still switch on after the first launch (it cut a layernorm's raw call from
    about 20 us), and give right answers on fresh buffers and on misaligned ones (which take
    Triton's own path)."""
    g = norm_graph("layernorm", [128], 768, BF)
    plan = check(g, cuda_handle)
    launch = plan._launch.launch
    pack = make_inputs(g, cuda_handle.device, seed=4)
    plan.execute(pack, None)
    plan.execute(pack, None)
    assert launch._compiled is not None, "the direct launch path stayed off"
    for seed in (5, 6):  # new buffers at new addresses
        fresh = make_inputs(g, cuda_handle.device, seed=seed)
        plan.execute(fresh, None)
        torch.cuda.synchronize()
        expected = run(g, fresh)
        for t in g.output_tensors():
            assert t.uid is not None
            assert compare(fresh[t.uid], expected[t.uid], tolerance_for(g, t)).ok
    x = next(t for t in g.tensors if t.name == "X")
    assert x.uid is not None
    fresh = make_inputs(g, cuda_handle.device, seed=7)
    storage = torch.empty(fresh[x.uid].numel() + 1, dtype=fresh[x.uid].dtype, device="cuda")
    shifted = storage[1:].view_as(fresh[x.uid])  # 2 bytes off a 16-byte boundary
    shifted.copy_(fresh[x.uid])
    fresh[x.uid] = shifted
    plan.execute(fresh, None)
    torch.cuda.synchronize()
    expected = run(g, fresh)
    for t in g.output_tensors():
        assert t.uid is not None
        assert compare(fresh[t.uid], expected[t.uid], tolerance_for(g, t)).ok


# ---- attention ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [BF, H, F])
@pytest.mark.parametrize(
    ("q", "kv", "kw"),
    [
        # Swin-T's windows: a Linear's qkv output, the bias + shift mask materialized
        ([64, 3, 49, 32], [64, 3, 49, 32], {"mask": [64, 3, 49, 49], "interleaved": True}),
        # its unshifted blocks: the bias broadcast over the windows
        ([64, 6, 49, 32], [64, 6, 49, 32], {"mask": [1, 6, 49, 49], "interleaved": True}),
        # grouped heads, a boolean mask and the bottom-right diagonal
        ([2, 8, 40, 64], [2, 2, 64, 64], {"mask": [2, 1, 40, 64], "bool": True, "br": True}),
        # causal, and a head of 128 channels
        ([3, 4, 64, 128], [3, 4, 64, 128], {"causal": True}),
    ],
    ids=["swin_shifted", "swin_bias", "gqa_bool_br", "causal_64x128"],
)
def test_attention(
    cuda_handle: dt.Handle, dtype: dt.DataType, q: list[int], kv: list[int], kw: dict[str, Any]
) -> None:
    graph = attention_graph(
        q,
        kv,
        dtype,
        mask=kw.get("mask"),
        mask_type=dt.DataType.BOOLEAN if kw.get("bool") else None,
        causal=kw.get("causal", False),
        bottom_right=kw.get("br", False),
        interleaved=kw.get("interleaved", False),
    )
    check(graph, cuda_handle)
    # the keys walked in several blocks, pipelined over 3 stages
    check(graph, cuda_handle, _settings(triton__block_n=16, triton__num_stages=3))
