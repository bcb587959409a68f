"""TRITON_ENGINE's search for memory-bound kernels, on any machine: the byte-count prior and
the space pruned around it (row_configs), sample sizing and the interleaved search on a fake
clock (search), and a perf-db record reused by another process without searching again."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from triton_cases import BF, F, norm_graph, reduction_graph

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.providers.triton import TritonEngine, search
from dnntune.providers.triton import engine as engine_module
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.perf_db import default_db
from dnntune.providers.triton.row_configs import (
    MIN_PROGRAMS_PER_SM,
    SINGLE_PASS_DEFAULT_N,
    row_prior,
    row_space,
)
from dnntune.providers.triton.solvers import (
    MAX_CANDIDATES,
    DeviceLimits,
    NormSolver,
    ReductionSolver,
)

H200 = DeviceLimits(smem_per_block=232448, sm_count=132)
HERE = Path(__file__).resolve().parent


def _bytes_per_thread(config: dict[str, int], itemsize: int) -> float:
    return config["block_m"] * config["block_n"] * itemsize / (32 * config["num_warps"])


# ---- the prior ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "n", "warps"), [(16384, 4096, 4), (4096, 8192, 8), (65536, 16384, 16)]
)
def test_long_rows_get_one_program_each_and_warps_scale_with_n(
    rows: int, n: int, warps: int
) -> None:
    prior = row_prior(rows, n, 2, H200.sm_count)
    assert prior == {"block_m": 1, "block_n": n, "num_warps": warps}


def test_short_rows_are_packed_by_bytes_and_each_thread_loads_four_vectors() -> None:
    prior = row_prior(65536, 1024, 2, H200.sm_count)  # BERT-large layernorm
    assert prior["block_n"] == 1024 and prior["block_m"] > 1
    assert prior["block_m"] * 1024 * 2 >= 8192  # a program moves at least 8 KiB
    assert _bytes_per_thread(prior, 2) == 64
    # fp32: the same bytes, so half the rows per program and half the values per thread
    fp32 = row_prior(65536, 1024, 4, H200.sm_count)
    assert fp32["block_m"] == prior["block_m"] // 2
    assert _bytes_per_thread(fp32, 4) == 64


def test_few_rows_spread_over_the_sms_instead_of_packing() -> None:
    prior = row_prior(64, 1024, 2, H200.sm_count)
    assert prior["block_m"] == 1
    # fewer programs than SMs: latency-bound, so more warps with one vector per thread each
    assert _bytes_per_thread(prior, 2) == 16
    assert row_prior(64, 4096, 2, H200.sm_count)["num_warps"] == 16
    rows = 4 * MIN_PROGRAMS_PER_SM * H200.sm_count
    packed = row_prior(rows, 1024, 2, H200.sm_count)
    assert math.ceil(rows / packed["block_m"]) >= MIN_PROGRAMS_PER_SM * H200.sm_count


def test_rows_too_long_for_registers_are_chunked() -> None:
    prior = row_prior(4, 100_000, 2, H200.sm_count)
    assert prior["block_n"] < 100_000 and prior["block_m"] == 1
    assert row_prior(4, SINGLE_PASS_DEFAULT_N, 2, H200.sm_count)["block_n"] == SINGLE_PASS_DEFAULT_N


def test_tiny_rows_still_give_every_thread_work() -> None:
    solver = NormSolver()
    for rows, n in ((1, 1), (15, 50), (3, 7)):
        match = match_graph(norm_graph("ln", [rows], n, F))
        assert solver.check(solver.default(match, H200), match, H200) is None


# ---- the pruned space -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "n", "dtype"),
    [(65536, 1024, BF), (16384, 4096, BF), (4096, 8192, BF), (1000, 1000, F), (2, 65573, BF)],
)
def test_space_is_the_priors_neighbourhood(rows: int, n: int, dtype: dt.DataType) -> None:
    match = match_graph(norm_graph("rms", [rows], n, dtype))
    solver = NormSolver()
    candidates = solver.candidates(match, H200, {})
    assert candidates[0] == solver.default(match, H200)  # the prior is timed first
    assert 2 <= len(candidates) <= 12 < MAX_CANDIDATES
    itemsize = dtype.itemsize
    for c in candidates:
        assert solver.check(c, match, H200) is None
        assert _bytes_per_thread(c, itemsize) >= 16  # at least one 16-byte vector per thread
        if n >= 4096:
            assert c["block_m"] == 1
        if n <= SINGLE_PASS_DEFAULT_N:
            assert c["block_n"] == max(32, 1 << (n - 1).bit_length())  # one pass over the row


def test_space_for_short_rows_varies_rows_per_program_around_the_prior() -> None:
    prior = row_prior(65536, 1024, 2, H200.sm_count)
    space = row_space(65536, 1024, 2, H200.sm_count)
    assert space[0] == prior
    assert {c["block_m"] for c in space} == {
        prior["block_m"] // 2,
        prior["block_m"],
        2 * prior["block_m"],
    }
    assert {c["num_warps"] for c in space if c["block_m"] == prior["block_m"]} == {2, 4, 8, 16}


def test_space_for_rows_beyond_registers_holds_only_chunks() -> None:
    space = row_space(2, 200_000, 2, H200.sm_count)
    assert space and {c["block_n"] for c in space} == {4096, 8192}


def test_reductions_share_the_prior() -> None:
    match = match_graph(reduction_graph(4096, 1024, dt.ReductionMode.ADD, BF))
    assert ReductionSolver().default(match, H200) == row_prior(4096, 1024, 2, H200.sm_count)


# ---- sample sizing --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("probe_ms", "repeats"),
    [(0.05, 20), (0.07, 15), (0.3, 4), (1.0, 1), (2.5, 1), (1e-5, 1000), (0.0, 1000)],
)
def test_samples_cover_at_least_a_millisecond(probe_ms: float, repeats: int) -> None:
    assert search.sample_repeats(probe_ms) == repeats
    if probe_ms > 1e-3:
        assert probe_ms * search.sample_repeats(probe_ms) >= min(search.MIN_SAMPLE_MS, probe_ms)


def test_sample_repeats_handles_unreadable_probes() -> None:
    assert search.sample_repeats(math.nan) == search.MAX_REPEATS
    assert search.sample_repeats(-1.0, max_repeats=7) == 7
    assert search.sample_repeats(0.25, min_sample_ms=0.5) == 2


# ---- the search on a fake clock -------------------------------------------------------------
class FakeClock:
    """Each config's kernel takes a scripted time; a timed span also pays ``launch_ms`` once
    (host latency) unless measured on the device clock. Records every timed call."""

    def __init__(
        self, kernel_ms: dict[int, float], launch_ms: float = 0.02, device: bool = False
    ) -> None:
        self.kind = "fake"
        self.kernel_ms = kernel_ms
        self.launch_ms = launch_ms
        self.calls: list[tuple[int, int]] = []  # (config id, repeats)
        self.last: int | None = None
        if device:
            self.device_time_ms = self._device

    def synchronize(self) -> None:
        return None

    def _span(self, fn: Callable[[], object], repeats: int, host: float) -> float:
        fn()
        assert self.last is not None
        self.calls.append((self.last, repeats))
        return self.kernel_ms[self.last] + host / repeats

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        return self._span(fn, repeats, self.launch_ms)

    def _device(self, fn: Callable[[], object], repeats: int = 1) -> float:
        return self._span(fn, repeats, 0.0)


def _configs(n: int) -> list[dict[str, int]]:
    return [{"block_m": 1, "block_n": 1024, "num_warps": 1 << i} for i in range(n)]


def _runner_for(clock: FakeClock, failing: frozenset[int] = frozenset()) -> Any:
    def runner_for(config: dict[str, int]) -> Callable[[], None]:
        key = config["num_warps"]

        def run() -> None:
            if key in failing:
                raise RuntimeError("out of resources")
            clock.last = key

        return run

    return runner_for


def _search(clock: FakeClock, configs: list[dict[str, int]], **kw: Any) -> search.Outcome:
    failing = kw.pop("failing", frozenset())
    return search.run_search(
        configs, _runner_for(clock, failing), clock, contextlib.nullcontext, **kw
    )


def test_search_keeps_the_fastest_and_sizes_samples_from_the_probe() -> None:
    clock = FakeClock({1: 0.080, 2: 0.060, 4: 0.070, 8: 0.065})
    outcome = _search(clock, _configs(4))
    assert outcome.config["num_warps"] == 2
    repeats = math.ceil(search.MIN_SAMPLE_MS / (0.060 + 0.02 / search.PROBE_REPEATS))
    assert outcome.median_ms == pytest.approx(0.060 + 0.02 / repeats)
    assert outcome.timed == 4
    sampled = [(k, r) for k, r in clock.calls if r != search.PROBE_REPEATS]
    for key, repeats in sampled:  # every sample spans at least a millisecond of kernels
        assert repeats * clock.kernel_ms[key] >= 0.75 * search.MIN_SAMPLE_MS


def test_search_samples_in_interleaved_rounds() -> None:
    clock = FakeClock({1: 0.050, 2: 0.051, 4: 0.052}, device=True)
    _search(clock, _configs(3))
    sampled = [k for k, r in clock.calls if r != search.PROBE_REPEATS]
    assert sampled == [1, 2, 4] * search.SAMPLES  # round-robin, not one config at a time


def test_search_prefers_the_device_clock() -> None:
    clock = FakeClock({1: 0.05, 2: 0.04}, launch_ms=10.0, device=True)
    outcome = _search(clock, _configs(2))
    assert outcome.median_ms == pytest.approx(0.04)  # no host latency in the span


def test_search_stops_sampling_clearly_slower_configs() -> None:
    clock = FakeClock({1: 0.05, 2: 0.20, 4: 0.051}, device=True)
    outcome = _search(clock, _configs(3))
    taken = {config["num_warps"]: count for config, _, count in outcome.results}
    assert taken == {1: search.SAMPLES, 2: 1, 4: search.SAMPLES}


def test_search_tie_goes_to_the_config_listed_first() -> None:
    clock = FakeClock({1: 0.0502, 2: 0.0500}, device=True)
    assert _search(clock, _configs(2)).config["num_warps"] == 1  # within 1%: the prior


def test_failing_configs_score_infinity_and_all_failing_raises() -> None:
    clock = FakeClock({1: 0.05, 2: 0.01, 4: 0.06}, device=True)
    outcome = _search(clock, _configs(3), failing=frozenset({2}))
    assert outcome.config["num_warps"] == 1
    assert dict((c["num_warps"], ms) for c, ms, _ in outcome.results)[2] == math.inf
    with pytest.raises(RuntimeError, match="every one of the 2 configs failed"):
        _search(clock, _configs(2), failing=frozenset({1, 2}))


# ---- the perf db across processes -----------------------------------------------------------
class _FakeHandle:
    """What a build's config choice reads from a handle, without a GPU."""

    device = types.SimpleNamespace(type="cuda", index=None)

    @staticmethod
    def device_signature() -> dict[str, Any]:
        return {"type": "cuda", "name": "NVIDIA H200 (fake)", "sm_count": 132}


@pytest.fixture
def fake_triton(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(engine_module, "_triton_version", lambda: "3.6.0")
    monkeypatch.setattr(engine_module, "_Scratch", lambda graph, handle, ws: None)
    yield


#: a second process: a fresh engine builds the same graph with benchmarking on; searching is
#: an error, so the record must be found
_SECOND_PROCESS = textwrap.dedent(
    """
    import json, sys, types
    sys.path.insert(0, {tests!r})
    from triton_cases import norm_graph
    from dnntune.backend.knobs import KnobSetting
    from dnntune.providers.triton import TritonEngine
    from dnntune.providers.triton import engine as m
    from dnntune.providers.triton.patterns import match_graph
    from dnntune.providers.triton.solvers import solver_for

    class Handle:
        device = types.SimpleNamespace(type="cuda", index=None)
        @staticmethod
        def device_signature():
            return {{"type": "cuda", "name": "NVIDIA H200 (fake)", "sm_count": 132}}

    def no_search(*args, **kwargs):
        raise AssertionError("searched again")

    m._triton_version = lambda: "3.6.0"
    m.TritonEngine._search = no_search
    engine = TritonEngine()
    g = norm_graph("ln", [65536], 1024)
    match = match_graph(g)
    values = engine.resolve_settings([KnobSetting("global.benchmarking", 1)], g)
    config, meta, _ = engine._choose_config(g, match, solver_for(match), values, Handle())
    print(json.dumps({{"config": config, "source": meta["config_source"]}}))
    """
)


def test_a_searched_winner_is_reused_by_another_process(
    fake_triton: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    g = norm_graph("ln", [65536], 1024)
    match = match_graph(g)
    solver = NormSolver()
    picked = solver.candidates(match, H200, {})[2]  # not the default: the search's choice
    searched: list[int] = []

    def fake_search(self: Any, match: Any, candidates: Any, handle: Any, scratch: Any) -> Any:
        searched.append(len(candidates))
        return picked, 0.07, len(candidates)

    monkeypatch.setattr(TritonEngine, "_search", fake_search)
    engine = TritonEngine()
    values = engine.resolve_settings([KnobSetting("global.benchmarking", 1)], g)
    config, meta, _ = engine._choose_config(g, match, solver, values, _FakeHandle())  # type: ignore[arg-type]
    assert meta["config_source"] == "search" and config == picked and searched
    db = default_db()
    assert db is not None and len(db.records("norm")) == 1
    assert db.records("norm")[0]["versions"]["solver"] == "norm-r2"

    # another process (fresh engine, fresh memo) finds the record: no second search
    code = _SECOND_PROCESS.format(tests=str(HERE))
    env = {**os.environ, "DNNTUNE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"config": picked, "source": "perf_db"}


def test_a_record_of_an_older_solver_revision_is_not_reused(
    fake_triton: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    g = norm_graph("rms", [4096], 8192)
    match = match_graph(g)
    picked = NormSolver().candidates(match, H200, {})[1]
    monkeypatch.setattr(
        TritonEngine, "_search", lambda self, match, candidates, handle, scratch: (picked, 0.1, 2)
    )

    def source(revision: int, benchmarking: int) -> str:
        monkeypatch.setattr(NormSolver, "revision", revision)
        engine = TritonEngine()  # a fresh memo, as in a new process
        values = engine.resolve_settings([KnobSetting("global.benchmarking", benchmarking)], g)
        _, meta, _ = engine._choose_config(g, match, NormSolver(), values, _FakeHandle())  # type: ignore[arg-type]
        return str(meta["config_source"])

    assert source(revision=1, benchmarking=1) == "search"
    assert source(revision=1, benchmarking=0) == "perf_db"
    assert source(revision=2, benchmarking=0) == "default"  # searched for other code


# ---- compiling autotune's candidates ahead ---------------------------------------------------
def test_candidates_are_compiled_ahead_once_per_distinct_config(
    fake_triton: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``TritonEngine.precompile``: each setting's config (invalid settings left to their own
    compile), duplicates compiled once, all on the compile pool in one call."""
    from dnntune.autotune import knob_variants

    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    g = norm_graph("ln", [65536], 1024)
    engine = TritonEngine()
    monkeypatch.setattr(TritonEngine, "check_support", lambda self, graph, handle: None)
    pooled: list[list[dict[str, int]]] = []
    monkeypatch.setattr(
        TritonEngine,
        "_precompile",
        staticmethod(lambda match, configs, scratch: pooled.append(list(configs)) or {}),
    )
    handle = _FakeHandle()
    handle.is_cuda = True  # type: ignore[attr-defined]
    variants = knob_variants(engine, g)
    settings = [[KnobSetting(k, v) for k, v in variant.items()] for variant in variants]
    settings += [settings[0], [KnobSetting("triton.block_m", 3)]]  # a repeat; an invalid value
    # builds that would search, write or clean the perf db are left to their own compile
    searching = [[KnobSetting("triton.tuning_policy", p)] for p in (2, 3, 4, 5)]
    searching.append([KnobSetting("global.benchmarking", 1)])
    chosen: list[int] = []
    choose = TritonEngine._choose_config

    def recorded_choice(self: Any, graph: Any, match: Any, solver: Any, values: Any, h: Any) -> Any:
        chosen.append(int(values["triton.tuning_policy"]) * 10 + int(values["global.benchmarking"]))
        return choose(self, graph, match, solver, values, h)

    monkeypatch.setattr(TritonEngine, "_choose_config", recorded_choice)
    engine.precompile(g, settings + searching, handle)  # type: ignore[arg-type]
    assert len(pooled) == 1
    configs = pooled[0]
    assert len(configs) == len({tuple(sorted(c.items())) for c in configs})  # no duplicates
    assert 1 < len(configs) <= len(variants)
    from dnntune.providers.triton.policy import read_only

    assert chosen and all(read_only(c // 10, c % 10, None) for c in chosen)
    assert 20 in chosen and 30 not in chosen and 40 not in chosen and 50 not in chosen

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no pool")

    monkeypatch.setattr(TritonEngine, "_precompile", staticmethod(broken))
    engine.precompile(g, settings, handle)  # type: ignore[arg-type]  # best effort: no raise
    off_gpu = types.SimpleNamespace(is_cuda=False)
    engine.precompile(g, settings, off_gpu)  # type: ignore[arg-type]  # nothing to do off CUDA
