"""What autotune_exhaustive_sweep reports about its exact-match ranking-cache write, beside
test_persistence.py's written / partial / unchanged cases: each outcome names the reason that
really kept the ranking out of the cache, and the sweep's results survive the write."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from autotune_helpers import Pack, workspace

import dnntune as dt
from dnntune import testing
from dnntune.overrides import exact_cache
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_C, FakeEngines

BUSY_ADVICE = "sweep again with nothing else running"


def test_a_busy_sweep_into_a_disabled_cache_says_the_cache_is_disabled(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A quiet sweep would not write either: the outcome was NOT_ATTEMPTED_BUSY_CPU, with the
    advice to sweep again on a quiet machine, which writes nothing."""
    fakes.clock.busy_share = 0.6
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "1")
    with caplog.at_level(logging.INFO, logger="dnntune.autotune"):
        results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert results[0].succeeded
    assert outcome is dt.CacheWriteOutcome.DECLINED_DISABLED
    assert BUSY_ADVICE not in caplog.text


def test_a_busy_partial_sweep_says_it_is_partial(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A filtered sweep is never cached: sweeping it again on a quiet machine (the advice it
    got) would only meet NOT_ATTEMPTED_PARTIAL_SWEEP."""
    fakes.clock.busy_share = 0.6
    cfg = dt.AutotuneConfig(engine_id_filter=[dt.engine_id(FAKE_ENGINE_C)])
    with caplog.at_level(logging.INFO, logger="dnntune.autotune"):
        _, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024, cfg)
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    assert BUSY_ADVICE not in caplog.text
    assert exact_cache.read_record(graph, handle) is None


def test_a_busy_complete_sweep_is_still_refused(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.clock.busy_share = 0.6
    _, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU
    assert exact_cache.read_record(graph, handle) is None


def test_a_sweep_cut_short_by_its_budget_says_so(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Candidates the time budget skipped made the sweep partial, and the log blamed the
    workspace limit ("some candidates were excluded (workspace limit)")."""
    cfg = dt.AutotuneConfig(time_budget_s=0.001)
    with caplog.at_level(logging.INFO, logger="dnntune.autotune"):
        results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024, cfg)
    skipped = [r for r in results if r.failure_kind == "budget"]
    assert skipped
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    partial = [m for m in caplog.messages if "exhaustive sweep is partial" in m]
    assert len(partial) == 1
    assert "workspace" not in partial[0]
    assert f"time_budget_s=0.001 left no time for {len(skipped)} candidate(s)" in partial[0]


def test_a_failing_ranking_write_costs_the_sweep_only_its_record(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ranking write that raised (a ranking file whose first line was JSON nested beyond
    Python's recursion limit did, until the reader treated it as a foreign file) escaped
    autotune_exhaustive_sweep after every candidate had been tuned: the results were lost and
    no winner was selected."""
    from dnntune.autotune import exhaustive

    path = exact_cache.cache_path(exact_cache.cache_key(graph, handle))

    def broken(*args: object) -> dt.CacheWriteOutcome:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(exhaustive, "write_ranking", broken)
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert results[0].succeeded
    assert outcome is dt.CacheWriteOutcome.DECLINED_DISABLED  # as an unwritable cache
    assert "RecursionError" in caplog.text and str(path) in caplog.text
    graph.execute(handle, pack, workspace())  # the winner was selected
    assert fakes.executions()[-1] == results[0].engine_name


def test_a_ranking_file_nested_past_the_recursion_limit_is_replaced(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its first line is no ranking-file stamp: like any foreign file it is warned about and
    replaced by the sweep's ranking (it was DECLINED_DISABLED, the RecursionError of the read
    caught only by the sweep's safety net)."""
    path = exact_cache.cache_path(exact_cache.cache_key(graph, handle))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert outcome is dt.CacheWriteOutcome.WRITTEN
    assert "starting a new file" in caplog.text and "RecursionError" not in caplog.text
    record = exact_cache.read_record(graph, handle)
    assert record is not None and record.order[0] == results[0].engine_id


@pytest.mark.parametrize(
    ("broken", "verdict"),
    [(FAKE_ENGINE_C, "kept_default_unsure"), (FAKE_ENGINE_A, "default_failed")],
)
def test_a_plan_that_breaks_while_being_confirmed_is_failed_and_not_cached(
    handle: dt.Handle,
    broken: str,
    verdict: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C, the sweep's winner, or A, the default, raises from the first confirmation round on:
    its result kept ``succeeded=True`` (the verdict named the break, the result did not), and
    the sweep wrote it to the ranking cache as a success, for later runs to follow untimed."""
    from dnntune.autotune import baseline

    confirming = [False]
    original = baseline.confirm_winner

    def confirm(*args: Any, **kwargs: Any) -> Any:
        confirming[0] = True
        return original(*args, **kwargs)

    monkeypatch.setattr(baseline, "confirm_winner", confirm)
    timings = {FAKE_ENGINE_A: 1.0, FAKE_ENGINE_C: 0.5}
    with testing.fake_engines(names=[FAKE_ENGINE_A, FAKE_ENGINE_C], timings=timings) as fakes:

        def check_execute(plan: Any) -> None:
            if confirming[0]:
                raise dt.ExecutionError(f"{broken}: broke (test)")

        monkeypatch.setattr(fakes[broken], "check_execute", check_execute)
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        pack = testing.make_pack(g)
        results, outcome = g.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    named = {r.engine_name: r for r in results}
    assert named[FAKE_ENGINE_A].is_default
    bad = named[broken]
    assert not bad.succeeded and bad.rank == -1 and results[-1] is bad
    assert "failed while being confirmed against the default" in bad.error_message
    assert "broke (test)" in bad.error_message and bad.failure_kind
    good = results[0]
    assert good.succeeded and good.engine_name != broken and good.confirmation == verdict
    summary = g.last_autotune_summary
    assert summary is not None and summary.winner == good.engine_name
    assert outcome is dt.CacheWriteOutcome.WRITTEN
    record = exact_cache.read_record(g, handle)
    assert record is not None and record.order == [dt.engine_id(good.engine_name)]


@pytest.mark.parametrize(
    ("compile_share", "timing_share", "compile_ms"),
    [(0.9, 0.0, 200.0), (0.0, 0.6, 10_000.0)],
    ids=["busy-compiles-quiet-timing", "quiet-compiles-busy-timing"],
)
def test_under_a_budget_the_busy_share_is_the_timings_alone(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
    compile_share: float,
    timing_share: float,
    compile_ms: float,
) -> None:
    """Under time_budget_s each candidate is primed and compiled in its turn, between the
    timings, and the run-queue wait was read across all of it: compiles that kept the CPU busy
    (torch.compile's Inductor threads) flagged a quiet timing "CPU busy" and refused the
    sweep's ranking, and long quiet compiles diluted a busy timing below the threshold."""
    fakes.clock.busy_share = timing_share
    for name, engine in fakes.engines.items():
        fakes.timings.set_compile(name, compile_ms)

        def compile(*args: Any, _original: Any = engine.compile) -> Any:
            fakes.clock.busy_share = compile_share
            try:
                return _original(*args)
            finally:
                fakes.clock.busy_share = timing_share

        monkeypatch.setattr(engine, "compile", compile)
    cfg = dt.AutotuneConfig(time_budget_s=3600.0)
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024, cfg)
    assert results[0].succeeded and not any(r.failure_kind == "budget" for r in results)
    summary = graph.last_autotune_summary
    assert summary is not None
    assert summary.timing_cpu_wait_share == pytest.approx(timing_share, abs=1e-6)
    busy = timing_share >= 0.25
    assert summary.timed_while_busy is busy
    expected = dt.CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU if busy else dt.CacheWriteOutcome.WRITTEN
    assert outcome is expected
