"""Issue 21: a winner must beat the default (heuristic) plan beyond noise, in fresh rounds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune.confirm import confirm_winner
from dnntune.autotune.verdicts import (
    CONFIRMED,
    DEFAULT_FAILED,
    KEPT_SLOWER,
    KEPT_TIE,
    KEPT_UNSURE,
    NO_DEFAULT,
    WINNER_IS_DEFAULT,
)
from dnntune.backend.knobs import (
    BENCHMARKING,
    WORKSPACE_SIZE_LIMIT,
    KnobSetting,
    KnobValue,
    benchmarking_knob,
    workspace_limit_knob,
)
from dnntune.backend.registry import get_registry
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C

WS = testing.ESTIMATED_WORKSPACE_BYTES


def _tune(
    timings: Mapping[str, Any],
    order: Sequence[str],
    noise: float = 0.0,
    seed: int = 0,
    **config: Any,
) -> tuple[list[dt.AutotuneResult], dt.Graph]:
    names = sorted(set(order))  # registry order A, B, C: FAKE_ENGINE_A is the default
    with testing.fake_engines(names=names, timings=timings, noise=noise, seed=seed):
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_engines(list(order))
        pack = testing.make_pack(g)
        ws = torch.empty(WS, dtype=torch.uint8)
        results = g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config))
        return results, g


def _by_name(results: list[dt.AutotuneResult]) -> dict[str, dt.AutotuneResult]:
    return {r.engine_name: r for r in results}


def test_the_default_is_marked_and_a_clear_win_is_confirmed() -> None:
    results, g = _tune({FAKE_ENGINE_C: 0.9}, [FAKE_ENGINE_C, FAKE_ENGINE_A], noise=0.05)
    w = results[0]
    assert w.engine_name == FAKE_ENGINE_C and not w.is_default
    assert _by_name(results)[FAKE_ENGINE_A].is_default
    assert w.confirmation == CONFIRMED
    assert w.speedup_vs_default == pytest.approx(1.0 / 0.9, rel=0.05)
    assert w.confirm_rounds >= 10 and 0.0 < w.clock_noise < 0.15
    summary = g.last_autotune_summary
    assert summary is not None and summary.confirmation is not None
    assert summary.confirmation.confirmed and not summary.kept_default
    assert summary.to_dict()["confirmation"]["verdict"] == CONFIRMED


def test_lucky_sample_does_not_win() -> None:
    """C is 2.0 ms but its first sample reads 0.1 ms (a lucky clock read); A is 1.0 ms."""
    lucky = [2.0, 2.0, 0.1, *[2.0] * 97]  # verification, warmup, then the first sample
    results, _ = _tune(
        {FAKE_ENGINE_C: lucky},
        [FAKE_ENGINE_C, FAKE_ENGINE_A],
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        timed_iterations=5,
    )
    c = _by_name(results)[FAKE_ENGINE_C]
    assert c.min_time_ms == pytest.approx(0.1)  # the lucky sample stays in the record
    assert c.median_time_ms == pytest.approx(2.0)
    assert results[0].engine_name == FAKE_ENGINE_A
    assert results[0].confirmation == WINNER_IS_DEFAULT


def test_lucky_sample_ranked_by_min_is_caught_by_the_confirmation() -> None:
    """Ranked on the RFC's minimum, the lucky candidate leads; the confirmation keeps A."""
    lucky = [2.0, 2.0, 0.1, *[2.0] * 997]
    results, g = _tune(
        {FAKE_ENGINE_C: lucky},
        [FAKE_ENGINE_C, FAKE_ENGINE_A],
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        timed_iterations=5,
        ranking_statistic="min",
    )
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].is_default
    assert results[0].confirmation == KEPT_SLOWER and results[0].speedup_vs_default == 1.0
    challenger = _by_name(results)[FAKE_ENGINE_C]
    assert challenger.confirmation == KEPT_SLOWER
    assert challenger.speedup_vs_default == pytest.approx(0.5, rel=0.05)
    assert g.last_autotune_summary is not None and g.last_autotune_summary.kept_default


def test_noisy_tie_keeps_the_default() -> None:
    """A and C take the same time under 10 % noise. Whichever one the pass ranks first, the
    default (A) stays: the confirmation's false-switch rate is about 1 % per tune (sequential
    looks at 3.29 standard errors), so at most one of 24 seeded tunes may switch."""
    switched = 0
    for seed in range(24):
        results, _ = _tune(
            {FAKE_ENGINE_C: 1.0}, [FAKE_ENGINE_C, FAKE_ENGINE_A], noise=0.10, seed=seed
        )
        w = results[0]
        if w.engine_name == FAKE_ENGINE_A:
            assert w.confirmation in (WINNER_IS_DEFAULT, KEPT_TIE, KEPT_UNSURE, KEPT_SLOWER)
        else:
            switched += 1
            assert w.confirmation == CONFIRMED
    assert switched <= 1


def test_a_small_gain_under_heavy_noise_is_unsure_and_keeps_the_default() -> None:
    results, _ = _tune(
        {FAKE_ENGINE_C: 0.98},
        [FAKE_ENGINE_C, FAKE_ENGINE_A],
        noise=0.30,
        seed=3,
        recheck_within=0.0,
        ranking_statistic="min",
        confirm_max_rounds=20,
    )
    w = results[0]
    if w.engine_name == FAKE_ENGINE_A and w.confirmation != WINNER_IS_DEFAULT:
        assert w.confirmation in (KEPT_UNSURE, KEPT_SLOWER, KEPT_TIE)
        assert w.confirm_rounds <= 20 and w.clock_noise > 0.1
    else:  # the pass ranked A first: nothing to confirm
        assert w.engine_name == FAKE_ENGINE_A


def test_small_kernels_get_enough_rounds_and_report_the_clock_noise() -> None:
    """20 us against 21 us, 15 % noise per call: the 5 % gain needs more than 10 rounds. A
    call-latency sample of a 20 us call is the mean of 8 calls (LATENCY_SAMPLE_MIN_MS), so the
    noise per sample is about 0.15 / sqrt(8)."""
    results, _ = _tune(
        {FAKE_ENGINE_A: 0.021, FAKE_ENGINE_C: 0.020},
        [FAKE_ENGINE_C, FAKE_ENGINE_A],
        noise=0.15,
        seed=1,
        recheck_within=0.0,
        ranking_statistic="min",
    )
    w = results[0]
    assert w.engine_name == FAKE_ENGINE_C
    assert w.confirmation == CONFIRMED
    assert w.confirm_rounds > 10
    assert w.clock_noise == pytest.approx(0.15 / 8**0.5, rel=0.5)
    assert 0.0 < w.confirm_noise < 0.05


def test_baseline_none_is_the_rfc_behaviour() -> None:
    results, _ = _tune({FAKE_ENGINE_C: 1.0}, [FAKE_ENGINE_C, FAKE_ENGINE_A], baseline=None)
    assert not any(r.is_default for r in results)
    assert results[0].confirmation == NO_DEFAULT and results[0].confirm_rounds == 0


def test_a_default_the_caller_filtered_out_is_not_the_default() -> None:
    results, _ = _tune(
        {},
        [FAKE_ENGINE_B, FAKE_ENGINE_C],
        engine_id_filter=[dt.engine_id(FAKE_ENGINE_B), dt.engine_id(FAKE_ENGINE_C)],
    )
    by = _by_name(results)
    assert by[FAKE_ENGINE_B].is_default  # registry order: B before C
    assert results[0].engine_name == FAKE_ENGINE_C and results[0].confirmation == CONFIRMED


def test_confirm_winner_alone() -> None:
    clock = iter(range(10**6))

    def fixed(ms: float) -> Any:
        return lambda: ms + 1e-9 * next(clock)

    def idle() -> float:  # the CPU's run-queue wait: none (the real one depends on the host)
        return 0.0

    assert confirm_winner(fixed(1.0), fixed(2.0), cpu_wait=idle).verdict == CONFIRMED
    assert confirm_winner(fixed(2.0), fixed(1.0), cpu_wait=idle).verdict == KEPT_SLOWER
    tie = confirm_winner(fixed(1.0), fixed(1.0), cpu_wait=idle)
    assert tie.verdict == KEPT_TIE and tie.rounds == 10 and tie.kept_default

    def broken() -> float:
        raise RuntimeError("device lost")

    assert confirm_winner(broken, fixed(1.0), cpu_wait=idle).verdict == KEPT_UNSURE
    # a default that breaks cannot be kept: the winner stands, unconfirmed
    gone = confirm_winner(fixed(1.0), broken, cpu_wait=idle)
    assert gone.verdict == DEFAULT_FAILED and not gone.kept_default and gone.speedup is None
    config = dt.AutotuneConfig(confirm_min_gain=0.5)
    assert confirm_winner(fixed(1.0), fixed(1.2), config, cpu_wait=idle).verdict != CONFIRMED


@pytest.mark.parametrize(("share", "verdict"), [(0.1, CONFIRMED), (0.3, KEPT_UNSURE)])
def test_a_win_timed_while_the_cpu_was_busy_is_not_trusted(share: float, verdict: str) -> None:
    """Seconds of waiting for a core against seconds of wall time, both scripted: from
    BUSY_WAIT_SHARE (25 %) up, the scheduler's time slices decide such timings."""
    from dnntune.measure.contention import BUSY_WAIT_SHARE

    assert 0.1 < BUSY_WAIT_SHARE < 0.3
    now = [0.0]

    def sample(ms: float) -> Any:
        def once() -> float:
            now[0] += ms / 1e3
            return ms

        return once

    conf = confirm_winner(
        sample(1.0), sample(2.0), clock=lambda: now[0], cpu_wait=lambda: share * now[0]
    )
    assert conf.verdict == verdict and conf.speedup == pytest.approx(2.0)
    assert conf.cpu_wait_share == pytest.approx(share)
    assert conf.cpu_busy is (verdict == KEPT_UNSURE)
    assert ("the CPU was busy" in conf.describe()) is conf.cpu_busy
    unmeasured = confirm_winner(
        sample(1.0), sample(2.0), clock=lambda: now[0], cpu_wait=lambda: None
    )
    assert unmeasured.verdict == CONFIRMED and unmeasured.cpu_wait_share is None


def test_the_run_queue_wait_is_read_from_the_kernel() -> None:
    import os

    from dnntune.measure.contention import run_queue_wait_s

    own = run_queue_wait_s()
    if not os.path.exists("/proc/self/task"):
        assert own is None
        return
    assert own is not None and own >= 0.0
    assert run_queue_wait_s(2**22 + 12345) is None  # no such process


# ---- EXHAUSTIVE: an engine's own search stays within the caller's workspace ----------------
class _SearchRemembers(testing.FakeEngine):
    """Like CUDNN_ENGINE: a search (benchmarking=1) finds a faster plan needing 272 bytes,
    within ``global.workspace_size_limit``, and a later plain build reuses its record."""

    def __init__(self, **shared: Any) -> None:
        super().__init__(
            "FAKE_SEARCH_REMEMBERS", [benchmarking_knob(), workspace_limit_knob()], **shared
        )
        self.records: dict[int, int] = {}

    def compiled_workspace_size(self, resolved: Mapping[str, KnobValue]) -> int:
        limit = int(resolved[WORKSPACE_SIZE_LIMIT])
        if resolved.get(BENCHMARKING, 0) == 1:
            self.records[limit] = 272 if limit >= 272 else 0
        return self.records.get(limit, 0)

    def estimate_workspace_size(self, graph: Any, knob_settings: Sequence[KnobSetting]) -> int:
        return 0


@pytest.fixture
def remembers() -> Iterator[tuple[testing.FakeEngines, _SearchRemembers]]:
    with testing.fake_engines(names=[FAKE_ENGINE_C]) as fakes:
        engine = _SearchRemembers(clock=fakes.clock, timings=fakes.timings, counters=fakes.counters)
        with get_registry().extra_engines([engine]):
            yield fakes, engine


@pytest.mark.parametrize("limit", [0, 272])
def test_exhaustive_search_stays_within_the_rfc_sequence_workspace(
    remembers: tuple[testing.FakeEngines, _SearchRemembers], limit: int
) -> None:
    _, engine = remembers
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    g.add_engines([engine.name, FAKE_ENGINE_C])
    ws = g.get_estimated_max_workspace_size()
    assert ws == WS  # FAKE_ENGINE_C's 1024 bytes; the searching engine estimates 0
    limit = min(limit, ws)
    workspace = torch.empty(max(limit, 1), dtype=torch.uint8)
    results = g.autotune(
        handle,
        testing.make_pack(g),
        workspace,
        limit,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE),
    )
    r = _by_name(results)[engine.name]
    assert r.succeeded, r.error_message
    assert r.ran_exhaustive and r.workspace_size <= limit
    assert r.knobs[WORKSPACE_SIZE_LIMIT] == limit  # rebuilt later with the same search record
    assert engine.records == {limit: 272 if limit >= 272 else 0}
