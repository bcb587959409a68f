"""EXHAUSTIVE mode: priming plans, workspace skips, priming-failure policies (RFC 6.4)."""

from __future__ import annotations

import logging

import pytest
from autotune_helpers import Pack, by_name, tune, workspace

import dnntune as dt
from dnntune.autotune.priming import NOT_CAPABLE
from dnntune.errors import AutotuneError, Status
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    PRIMED_KNOB,
    FakeEngines,
)

EXHAUSTIVE = {"mode": dt.TuneMode.EXHAUSTIVE, "recheck_within": 0.0}
UNPRIMED = dict(EXHAUSTIVE, priming_failure_policy=dt.PrimingFailurePolicy.BENCHMARK_UNPRIMED)


def primed_faster(fakes: FakeEngines, engine: str = FAKE_ENGINE_A, ms: float = 0.25) -> None:
    """Script ``engine``'s primed builds faster than its unprimed ones: its search helps, so
    the primed build beats the unprimed default EXHAUSTIVE mode also times."""
    fakes.timings.set(engine, ms, {PRIMED_KNOB: 1})


def test_priming_plan_built_run_once_and_discarded(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engine(FAKE_ENGINE_A, {"fake.variant": 2})
    graph.add_engine(FAKE_ENGINE_C)
    primed_faster(fakes)
    results = by_name(tune(graph, handle, pack, **EXHAUSTIVE))
    a = results[FAKE_ENGINE_A]
    assert a.ran_exhaustive and a.supports_exhaustive and a.mode_used is dt.TuneMode.EXHAUSTIVE
    assert a.exhaustive_not_run_reason == "" and a.priming_time_ms >= 0.0
    assert a.knobs == {"fake.variant": 2}  # the benchmarking knob is not part of the result
    assert fakes.counters.priming_compiles[FAKE_ENGINE_A] == 1
    assert fakes.counters.priming_executes[FAKE_ENGINE_A] == 1
    # the unprimed default (A is the heuristics' pick), the priming plan, the real plan
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 3
    c = results[FAKE_ENGINE_C]
    # RFC 6.5: under EXHAUSTIVE a result that was not primed says why (it was empty)
    assert not c.ran_exhaustive and c.exhaustive_not_run_reason == NOT_CAPABLE
    assert "supports_exhaustive is false" in NOT_CAPABLE
    assert fakes.counters.priming_compiles[FAKE_ENGINE_C] == 0


def test_priming_happens_before_any_real_compile(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_B])
    tune(graph, handle, pack, **EXHAUSTIVE)
    events = fakes.clock.events
    # the one priming execute comes first, before B's (or A's real plan's) executes
    assert events[0] == ("execute", FAKE_ENGINE_A)
    assert fakes.executions()[1] == FAKE_ENGINE_A  # A's real plan: its verification run


def test_standard_mode_never_primes(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_all_engines()
    results = tune(graph, handle, pack)
    assert not any(r.ran_exhaustive for r in results)
    assert sum(fakes.counters.priming_compiles.values()) == 0
    assert all(r.exhaustive_not_run_reason == "" for r in results)


def test_priming_failure_aborts_by_default(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_PRIMING_FAILS, FAKE_ENGINE_C])
    with pytest.raises(AutotuneError) as err:
        tune(graph, handle, pack, **EXHAUSTIVE)
    assert err.value.status is Status.EXECUTION_FAILED
    assert "priming of FAKE_ENGINE_PRIMING_FAILS failed" in str(err.value)
    assert "BENCHMARK_UNPRIMED" in str(err.value)
    results = err.value.results
    assert len(results) == 3 and all(not r.succeeded for r in results)
    failed = by_name(results)[FAKE_ENGINE_PRIMING_FAILS]
    assert "priming failed" in failed.exhaustive_not_run_reason
    assert fakes.counters.compiles[FAKE_ENGINE_C] == 0  # nothing compiled after the abort
    assert graph.active_plan is None


def test_benchmark_unprimed_continues(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_PRIMING_FAILS, FAKE_ENGINE_A])
    primed_faster(fakes)
    results = by_name(tune(graph, handle, pack, **UNPRIMED))
    pf = results[FAKE_ENGINE_PRIMING_FAILS]
    assert pf.succeeded and pf.error_message == "" and not pf.ran_exhaustive
    assert pf.exhaustive_not_run_reason.startswith("priming failed: priming execute failed")
    assert results[FAKE_ENGINE_A].ran_exhaustive


def test_priming_compile_failure_counts_as_priming_failure(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes[FAKE_ENGINE_PRIMING_FAILS].fail_stage = "compile"  # type: ignore[attr-defined]
    graph.add_engines([FAKE_ENGINE_PRIMING_FAILS])
    with pytest.raises(AutotuneError, match="priming plan failed compile"):
        tune(graph, handle, pack, **EXHAUSTIVE)
    r = tune(graph, handle, pack, **UNPRIMED)[0]
    assert r.succeeded and "failed compile" in r.exhaustive_not_run_reason


def test_priming_workspace_skip_is_not_a_failure(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    graph.add_engines([FAKE_ENGINE_WORKSPACE_GROWS])
    with caplog.at_level(logging.WARNING):
        # ABORT policy: a skip must not abort
        r = tune(graph, handle, pack, nbytes=1024, **EXHAUSTIVE)[0]
    assert r.succeeded and not r.ran_exhaustive
    assert r.exhaustive_not_run_reason == (
        "priming skipped: priming plan workspace 8192 exceeds limit 1024"
    )
    assert fakes.counters.priming_executes[FAKE_ENGINE_WORKSPACE_GROWS] == 0
    assert "estimate (1024) fit" in caplog.text  # the estimate said it would fit: warn
    assert r.workspace_size == 1024  # the real plan fits and is benchmarked


def test_priming_workspace_skip_without_warning(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, caplog: pytest.LogCaptureFixture
) -> None:
    graph.add_engines([FAKE_ENGINE_WORKSPACE_GROWS, FAKE_ENGINE_A])
    with caplog.at_level(logging.WARNING), pytest.raises(AutotuneError) as err:
        tune(graph, handle, pack, nbytes=512, **EXHAUSTIVE)
    assert "estimate (1024) fit" not in caplog.text
    grows = by_name(err.value.results)[FAKE_ENGINE_WORKSPACE_GROWS]
    assert "priming skipped" in grows.exhaustive_not_run_reason
    assert "exceeds limit 512" in grows.error_message  # then the normal post-compile check


def test_priming_with_enough_workspace(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_WORKSPACE_GROWS])
    primed_faster(fakes, FAKE_ENGINE_WORKSPACE_GROWS)
    r = tune(graph, handle, pack, nbytes=8192, **EXHAUSTIVE)[0]
    assert r.ran_exhaustive and r.workspace_size == 1024
    assert fakes.counters.priming_executes[FAKE_ENGINE_WORKSPACE_GROWS] == 1


def test_force_benchmarking_off_disables_priming(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "0")
    graph.add_engines([FAKE_ENGINE_A])
    r = tune(graph, handle, pack, **EXHAUSTIVE)[0]
    assert not r.ran_exhaustive and "DNNTUNE_FORCE_BENCHMARKING=0" in r.exhaustive_not_run_reason
    assert fakes.counters.priming_compiles[FAKE_ENGINE_A] == 0


def test_excluded_candidates_are_not_primed(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    tune(graph, handle, pack, engine_id_filter=[dt.engine_id(FAKE_ENGINE_C)], **EXHAUSTIVE)
    assert fakes.counters.priming_compiles[FAKE_ENGINE_A] == 0


def test_an_abort_under_a_budget_does_not_call_timed_candidates_unbenchmarked(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    """Under time_budget_s each candidate is primed in its turn, so the candidates timed before
    the priming failure were told "not benchmarked" beside their samples."""
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_PRIMING_FAILS, FAKE_ENGINE_C])
    cfg = dt.AutotuneConfig(time_budget_s=100.0, **EXHAUSTIVE)
    with pytest.raises(AutotuneError) as err:
        graph.autotune(handle, pack, workspace(), 1024, cfg)
    results = by_name(err.value.results)
    assert len(err.value.results) == 3 and not any(r.succeeded for r in err.value.results)
    timed = [r for r in err.value.results if r.benchmarked]
    assert timed and results[FAKE_ENGINE_PRIMING_FAILS] not in timed
    for r in timed:
        assert r.iterations_run > 0
        assert "not benchmarked" not in r.error_message
        assert "benchmarked, then discarded" in r.error_message
        assert FAKE_ENGINE_PRIMING_FAILS in r.error_message
