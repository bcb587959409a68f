"""autotune() on the plan-spec path: coverage, dispositions, flows, timing (RFC 6.3, 6.4)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from autotune_helpers import Pack, by_name, check_coverage, tune, workspace

import dnntune as dt
from dnntune import testing
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.errors import AutotuneError, ExecutionError, Status
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    FAKE_ENGINE_WRONG,
    FakeEngine,
    FakeEngines,
    FakePlan,
)

FAST = {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 3, "recheck_within": 0.0}


@pytest.fixture
def specced(graph: dt.Graph) -> dt.Graph:
    graph.add_all_engines()
    return graph


# ---- the basic run -----------------------------------------------------------------------
def test_standard_run_ranks_every_candidate(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    results = tune(specced, handle, pack)
    assert [r.engine_name for r in results if r.succeeded] == [
        FAKE_ENGINE_A,
        FAKE_ENGINE_PRIMING_FAILS,
        FAKE_ENGINE_WORKSPACE_GROWS,
        FAKE_ENGINE_C,
        FAKE_ENGINE_B,
    ]
    assert [r.engine_name for r in results if not r.succeeded] == [
        FAKE_ENGINE_FAILS,
        FAKE_ENGINE_WRONG,
    ]
    a = results[0]
    assert a.min_time_ms == 1.0 and a.avg_time_ms == 1.0 and a.stddev_ms == 0.0
    assert a.converged and a.iterations_run == 3 and a.workspace_size == 1024
    assert a.estimated_workspace_size == 1024 and a.benchmarked and a.timer_kind == "fake"
    assert a.mode_used is dt.TuneMode.STANDARD and not a.ran_exhaustive
    assert a.strategy_used is dt.AutotuneStrategy.RUN_UNTIL_STABLE
    assert a.supports_exhaustive and not by_name(results)[FAKE_ENGINE_C].supports_exhaustive
    assert a.samples_ms == [1.0, 1.0, 1.0] and a.median_time_ms == 1.0
    assert a.plan_name == FAKE_ENGINE_A


def test_execute_runs_the_winner(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    tune(specced, handle, pack)
    before = dict(fakes.counters.executes)
    specced.execute(handle, pack, workspace())
    after = fakes.counters.executes
    assert [n for n in after if after[n] != before.get(n, 0)] == [FAKE_ENGINE_A]
    assert specced.get_plan_name() == FAKE_ENGINE_A
    assert specced.get_workspace_size() == 1024
    y = specced.output_tensors()[0]
    x, b = (pack[t.uid] for t in specced.input_tensors())
    torch.testing.assert_close(pack[y.uid], torch.relu(x + b))


def test_compiled_plan_indices(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    results = tune(specced, handle, pack)
    ok = [r.compiled_plan_index for r in results if r.succeeded]
    assert sorted(ok) == [0, 1, 2, 4, 5]  # plans compiled in candidate order
    assert len(set(ok)) == len(ok)


def test_timings_follow_the_script(
    handle: dt.Handle, graph: dt.Graph, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, 0.25).set(FAKE_ENGINE_B, 0.5, {"fake.algorithm": "fft"})
    graph.add_engine(FAKE_ENGINE_C)
    graph.add_engine(FAKE_ENGINE_B, {"fake.algorithm": "fft"})
    graph.add_engine(FAKE_ENGINE_B)
    results = tune(graph, handle, pack, **FAST)
    assert [(r.engine_name, r.min_time_ms) for r in results] == [
        (FAKE_ENGINE_C, 0.25),
        (FAKE_ENGINE_B, 0.5),
        (FAKE_ENGINE_B, 3.0),
    ]
    assert results[1].knobs == {"fake.algorithm": "fft"} and results[2].knobs == {}
    assert all(r.iterations_run == 3 and r.converged for r in results)


def test_fixed_average_counts(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    results = tune(
        specced,
        handle,
        pack,
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        timed_iterations=7,
        warmup_iterations=2,
        recheck_within=0.0,
    )
    ok = [r for r in results if r.succeeded]
    assert all(r.iterations_run == 7 and r.converged for r in ok)
    assert all(r.strategy_used is dt.AutotuneStrategy.FIXED_AVERAGE for r in results)
    # verification run + 2 warmups + 7 timed + 3 secondary-clock samples
    assert fakes.counters.executes[FAKE_ENGINE_B] == 1 + 2 + 7 + 3


def test_run_until_stable_unstable_engine(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, [10.0, 20.0])
    graph.add_engines([FAKE_ENGINE_C, FAKE_ENGINE_B])
    results = tune(graph, handle, pack, max_iterations=12, window_size=3, recheck_within=0.0)
    c = by_name(results)[FAKE_ENGINE_C]
    assert c.succeeded and not c.converged and c.iterations_run == 12
    assert c.min_time_ms == 10.0 and c.avg_time_ms == 15.0 and c.stddev_ms == 5.0
    assert c.cov == pytest.approx(1 / 3)
    b = by_name(results)[FAKE_ENGINE_B]
    assert b.converged and b.iterations_run == 3


def test_sync_after_warmup_before_timing(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engine(FAKE_ENGINE_C)
    tune(graph, handle, pack, warmup_iterations=2, verify=False, **FAST)
    events = fakes.clock.events
    first_sync = events.index(("sync", ""))
    assert events[:first_sync] == [("execute", FAKE_ENGINE_C)] * 2  # warmups, then sync
    # the post-warmup device sync, then each latency sample starts on an idle device
    timed = events[first_sync + 1 : first_sync + 7]
    assert timed == [("sync", ""), ("execute", FAKE_ENGINE_C)] * 3


def test_noise_is_reproducible(graph: dt.Graph, pack: Pack) -> None:
    def run() -> list[float]:
        with testing.fake_engines(noise=0.05, seed=3):
            h = dt.create_handle("cpu")
            g = testing.small_pointwise_graph()
            g.build_operation_graph(h)
            g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
            return [r.min_time_ms for r in tune(g, h, testing.make_pack(g))]

    first = run()
    assert first == run()
    assert first[0] != 1.0


# ---- exclusions -----------------------------------------------------------------------------
def test_engine_id_filter_subset(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    keep = [dt.engine_id(FAKE_ENGINE_B), dt.engine_id(FAKE_ENGINE_C), 42]  # 42 matches nothing
    results = tune(specced, handle, pack, engine_id_filter=keep)
    assert [r.engine_name for r in results if r.succeeded] == [FAKE_ENGINE_C, FAKE_ENGINE_B]
    filtered = [r for r in results if not r.succeeded]
    assert len(filtered) == 5
    for r in filtered:
        assert "engineIdFilter" in r.error_message and r.excluded_by_caller
        assert r.workspace_size == -1 and r.estimated_workspace_size == 1024
        assert r.compiled_plan_index == -1 and r.rank == -1
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 0  # excluded before compiling


def test_engine_id_filter_excluding_everything(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    with pytest.raises(AutotuneError) as err:
        tune(specced, handle, pack, engine_id_filter=[42])
    assert err.value.status is Status.INVALID_VALUE
    assert "no candidates remain after filtering" in str(err.value)
    assert "7 excluded by engineIdFilter" in str(err.value)
    assert "barred" not in str(err.value)
    assert len(err.value.results) == 7
    assert all(not r.succeeded and r.excluded_by_caller for r in err.value.results)


def test_deselect_engines_on_plan_spec_path(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    specced.deselect_engines([FAKE_ENGINE_A, str(dt.engine_id(FAKE_ENGINE_FAILS))])
    results = tune(specced, handle, pack)
    barred = [r for r in results if "Plan barred" in r.error_message]
    assert {r.engine_name for r in barred} == {FAKE_ENGINE_A, FAKE_ENGINE_FAILS}
    assert all(r.workspace_size == -1 and r.excluded_by_caller for r in barred)
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 0
    assert results[0].engine_name == FAKE_ENGINE_PRIMING_FAILS


def test_deselect_workspace_on_plan_spec_path(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    specced.deselect_workspace_greater_than(1000)
    with pytest.raises(AutotuneError) as err:
        tune(specced, handle, pack)
    assert err.value.status is Status.INVALID_VALUE
    assert "7 barred by deselect_*()" in str(err.value)
    assert all(
        "Plan barred" in r.error_message and r.workspace_size == 1024 for r in err.value.results
    )


def test_deselect_all_engines(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    specced.deselect_engines(list(testing.ALL_FAKE_ENGINES))
    with pytest.raises(AutotuneError) as err:
        tune(specced, handle, pack)
    assert err.value.status is Status.INVALID_VALUE
    assert len(err.value.results) == 7
    assert sum(fakes.counters.compiles.values()) == 0


def test_deselect_and_filter_combined_summary(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    specced.deselect_engines([FAKE_ENGINE_A])
    with pytest.raises(AutotuneError) as err:
        tune(specced, handle, pack, engine_id_filter=[dt.engine_id(FAKE_ENGINE_A)])
    assert "1 barred by deselect_*(), 6 excluded by engineIdFilter" in str(err.value)


def test_deselect_with_no_match_changes_nothing(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    specced.deselect_engines([]).deselect_engines(["NO_SUCH_ENGINE"])
    specced.deselect_workspace_greater_than(1 << 30)
    results = tune(specced, handle, pack)
    assert sum(r.succeeded for r in results) == 5


def _also(fakes: FakeEngines, *engines: FakeEngine) -> Any:
    """Register more engines next to the fakes (still hiding every other engine)."""
    return get_registry().extra_engines([*fakes.engines.values(), *engines], exclusive=True)


class _GrowingEngine(FakeEngine):
    """Estimates 1024 bytes, compiles to 4096."""

    def compiled_workspace_size(self, resolved: Mapping[str, Any]) -> int:
        return 4096


def test_post_compile_workspace_skip(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    grows = _GrowingEngine("FAKE_GROWING", [], fakes.clock, fakes.timings, fakes.counters)
    with _also(fakes, grows):
        graph.add_engines(["FAKE_GROWING", FAKE_ENGINE_C])
        with caplog.at_level(logging.WARNING):
            results = tune(graph, handle, pack, nbytes=2048)
    skipped = by_name(results)["FAKE_GROWING"]
    assert not skipped.succeeded and skipped.excluded_by_caller
    assert skipped.error_message == "Workspace size 4096 exceeds limit 2048"
    assert skipped.workspace_size == 4096 and skipped.estimated_workspace_size == 1024
    assert skipped.compiled_plan_index == -1
    assert fakes.counters.compiles["FAKE_GROWING"] == 1  # compiled, not pre-filtered
    assert fakes.counters.executes["FAKE_GROWING"] == 0  # never executed
    assert "estimate (1024) fit" in caplog.text
    assert results[0].engine_name == FAKE_ENGINE_C


def test_workspace_skip_without_warning_when_estimate_did_not_fit(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(AutotuneError) as err:
        tune(specced, handle, pack, nbytes=0)
    assert "7 skipped (compiled workspace exceeds limit)" in str(err.value)
    assert all("exceeds limit 0" in r.error_message for r in err.value.results)
    assert "fit" not in caplog.text


# ---- failures -----------------------------------------------------------------------------
def test_compile_failure_for_unknown_id(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engine_configs(
        [dt.EngineConfigInfo(engine_id=77, engine_name="GHOST", estimated_workspace_size=5)]
    )
    graph.add_engine(FAKE_ENGINE_C)
    results = tune(graph, handle, pack)
    ghost = results[1]
    assert "failed compile" in ghost.error_message and "unknown engine id 77" in ghost.error_message
    assert ghost.workspace_size == -1 and ghost.estimated_workspace_size == 5
    assert not ghost.excluded_by_caller and ghost.engine_name == "0x000000000000004D"


class _BadPlanEngine(FakeEngine):
    def compile(self, graph: Any, knob_settings: Sequence[KnobSetting], handle: Any) -> Any:
        plan = super().compile(graph, knob_settings, handle)
        plan.workspace_size = -5
        return plan


class _CompileRaises(FakeEngine):
    def check_compile(self, resolved: Mapping[str, Any]) -> None:
        raise RuntimeError("kernel too large")


def test_compile_and_finalize_failures(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    shared = (fakes.clock, fakes.timings, fakes.counters)
    extra = [
        _BadPlanEngine("FAKE_BAD_PLAN", [], *shared),
        _CompileRaises("FAKE_NO_COMPILE", [], *shared),
    ]
    with _also(fakes, *extra):
        graph.add_engines(["FAKE_BAD_PLAN", "FAKE_NO_COMPILE", FAKE_ENGINE_C])
        results = tune(graph, handle, pack)
    named = by_name(results)
    assert "failed finalize" in named["FAKE_BAD_PLAN"].error_message
    assert "failed compile" in named["FAKE_NO_COMPILE"].error_message
    assert "RuntimeError: kernel too large" in named["FAKE_NO_COMPILE"].error_message
    assert named["FAKE_NO_COMPILE"].workspace_size == -1


class _FlakyEngine(FakeEngine):
    """Fails on its Nth execute."""

    fail_on = 3

    def check_execute(self, plan: FakePlan) -> None:
        if self.counters.executes[self.name] == self.fail_on:
            raise ExecutionError("lost the device")


def test_warmup_failure_marks_failed_and_moves_on(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    flaky = _FlakyEngine("FAKE_FLAKY", [], fakes.clock, fakes.timings, fakes.counters)
    flaky.fail_on = 2  # verification run ok, first warmup fails
    with _also(fakes, flaky):
        graph.add_engines(["FAKE_FLAKY", FAKE_ENGINE_C])
        results = tune(graph, handle, pack)
    f = by_name(results)["FAKE_FLAKY"]
    assert not f.succeeded and f.error_message.startswith("failed warmup (iteration 1)")
    assert "lost the device" in f.error_message and not f.benchmarked
    assert f.verified is True
    assert results[0].engine_name == FAKE_ENGINE_C and results[0].succeeded


def test_timed_iteration_failure(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    flaky = _FlakyEngine("FAKE_FLAKY", [], fakes.clock, fakes.timings, fakes.counters)
    flaky.fail_on = 4  # verify, warmup, timed 1, timed 2 fails
    with _also(fakes, flaky):
        graph.add_engines(["FAKE_FLAKY", FAKE_ENGINE_C])
        results = tune(graph, handle, pack)
    f = by_name(results)["FAKE_FLAKY"]
    assert f.error_message.startswith("Benchmark failed on iteration 2: ExecutionError")
    assert f.benchmarked and not f.converged and f.iterations_run == 1


def test_all_fail(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_FAILS, FAKE_ENGINE_WRONG])
    with pytest.raises(AutotuneError) as err:
        tune(graph, handle, pack)
    assert err.value.status is Status.EXECUTION_FAILED
    assert "all engines failed" in str(err.value)
    assert len(err.value.results) == 2
    assert all(r.rank == -1 for r in err.value.results)
    assert graph.active_plan is None


def test_failed_entries_never_precede_successes(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_FAILS, 0.001)
    results = tune(specced, handle, pack)
    check_coverage(specced, results)


# ---- measurement extensions ----------------------------------------------------------------
def test_device_metric_launches_back_to_back(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, 0.01)
    graph.add_engines([FAKE_ENGINE_C])
    r = tune(graph, handle, pack, ranking_metric="device", **FAST)[0]
    assert r.launches_per_sample == 10  # a 10 us kernel: 100 us per sample
    assert r.min_time_ms == pytest.approx(0.01) and r.device_time_ms == pytest.approx(0.01)
    assert r.latency_ms == pytest.approx(0.01)


def test_both_clocks_reported(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_B])
    r = tune(graph, handle, pack, **FAST)[0]
    assert r.latency_ms == 3.0 and r.device_time_ms == 3.0 and r.launches_per_sample == 1


def test_recheck_retimes_only_close_contenders(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    from dnntune.autotune.recheck import RECHECK_ROUNDS

    fakes.timings.set(FAKE_ENGINE_C, 1.02)
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B])
    cfg = dict(FAST, recheck_within=0.03)
    results = by_name(tune(graph, handle, pack, **cfg))
    assert results[FAKE_ENGINE_A].iterations_run == 3 + RECHECK_ROUNDS
    assert results[FAKE_ENGINE_C].iterations_run == 3 + RECHECK_ROUNDS
    assert results[FAKE_ENGINE_B].iterations_run == 3
    assert results[FAKE_ENGINE_A].rank == 0


def test_cold_cache_mode_is_recorded(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_C])
    r = tune(graph, handle, pack, cache_mode="cold", **FAST)[0]
    assert r.cache_mode == "cold" and r.succeeded and r.min_time_ms == 2.0


def test_custom_ranking_fn(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_B, 5.0)

    def slowest_first(results: list[dt.AutotuneResult]) -> None:
        results.sort(key=lambda r: -r.min_time_ms)

    results = tune(specced, handle, pack, ranking_fn=slowest_first)
    assert results[0].engine_name == FAKE_ENGINE_B and results[0].rank == 0
    specced.execute(handle, pack, workspace())
    assert fakes.executions()[-1] == FAKE_ENGINE_B


def test_workspace_buffer_reaches_the_plan(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_C])
    # a 2048-byte buffer with workspace_size 1024 is fine (the buffer may be larger)
    results = graph.autotune(handle, pack, workspace(2048), 1024)
    assert results[0].succeeded
