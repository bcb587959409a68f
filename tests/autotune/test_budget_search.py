"""Issue 25: tuning budgets (cheap and likely first, skipped candidates recorded) and early
abandonment of clearly slower candidates, on the fake engines' clock."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune import search
from dnntune.autotune.search import Budget, clearly_slower
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C, FakeEngines

WS = testing.ESTIMATED_WORKSPACE_BYTES


@contextmanager
def _fakes(timings: Mapping[str, Any] | None = None, noise: float = 0.0) -> Iterator[FakeEngines]:
    names = [FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C]  # FAKE_ENGINE_A is the default
    with testing.fake_engines(names=names, timings=timings, noise=noise, seed=3) as f:
        yield f


def _tune(
    order: Sequence[str | dt.EngineVariant], **config: Any
) -> tuple[list[dt.AutotuneResult], dt.Graph]:
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    for item in order:
        if isinstance(item, dt.EngineVariant):
            g.add_engine_variants([item])
        else:
            g.add_engine(item)
    pack = testing.make_pack(g)
    ws = torch.empty(WS, dtype=torch.uint8)
    return g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config)), g


def _by_name(results: list[dt.AutotuneResult]) -> dict[str, dt.AutotuneResult]:
    return {r.plan_name or r.engine_name: r for r in results}


def _first_runs(f: FakeEngines) -> list[str]:
    seen: list[str] = []
    for name in f.executions():
        if name not in seen:
            seen.append(name)
    return seen


# ---- budgets ---------------------------------------------------------------------------------
def test_a_budget_skips_the_dear_candidates_and_records_them() -> None:
    with _fakes({FAKE_ENGINE_C: 0.5}) as f:
        for name in (FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C):
            f.timings.set_compile(name, 100.0)  # each compile: 100 ms on the fake clock
        f[FAKE_ENGINE_C].compile_cost = 1.0
        f[FAKE_ENGINE_B].compile_cost = 50.0
        results, g = _tune([FAKE_ENGINE_B, FAKE_ENGINE_C, FAKE_ENGINE_A], time_budget_s=0.22)
    assert len(results) == 3  # one result per candidate still
    r = {x.engine_name: x for x in results}
    skipped = r[FAKE_ENGINE_B]
    assert not skipped.succeeded and skipped.failure_kind == "budget"
    assert skipped.excluded_by_caller and not skipped.benchmarked and skipped.rank == -1
    assert "skipped (time budget)" in skipped.error_message
    assert "time_budget_s=0.22" in skipped.error_message
    assert f.counters.compiles[FAKE_ENGINE_B] == 0  # never compiled
    # the cheap candidate ran and won; the confirmation against the default still ran
    assert results[0].engine_name == FAKE_ENGINE_C
    assert results[0].confirmation == "confirmed"
    s = g.last_autotune_summary
    assert s is not None
    assert s.time_budget_s == 0.22 and s.skipped_budget == 1 and s.excluded == 1
    assert s.failed == 0  # a skipped candidate is not a failure
    # the search stopped within its share; the confirmation's minimum rounds come on top
    assert 0.2 < s.budget_used_s < 0.22 * 1.5
    assert s.confirm_time_ms >= 0.0 and "budget 0.22 s" in s.describe()
    assert s.to_dict()["skipped_budget"] == 1


@pytest.fixture
def no_compiles_seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    seen: dict[str, float] = {}
    monkeypatch.setattr(search, "_compile_seen_s", seen)
    return seen


def test_a_compile_that_cannot_fit_the_budget_is_not_started(
    no_compiles_seen: dict[str, float],
) -> None:
    """The first Inductor compile of a process took 3.8-8 s of optimize's search share for a
    norm cuDNN won (session 44): an engine's first compile is expected to take its
    ``first_compile_s`` until one has been seen in this process, and a candidate whose compile
    does not fit in what is left of the search is skipped before it is built."""
    with _fakes({FAKE_ENGINE_C: 0.5}) as f:
        f[FAKE_ENGINE_B].first_compile_s = 5.0
        f[FAKE_ENGINE_C].first_compile_s = 0.5
        results, g = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C], time_budget_s=1.0)
        assert f.counters.compiles[FAKE_ENGINE_B] == 0  # never compiled
        assert f.counters.compiles[FAKE_ENGINE_C] == 1  # 0.5 s fits in the 0.85 s left
    r = _by_name(results)
    skipped = r[FAKE_ENGINE_B]
    assert skipped.failure_kind == "budget" and skipped.excluded_by_caller
    assert "skipped (time budget)" in skipped.error_message
    assert "expected to take 5.0 s" in skipped.error_message
    assert "time_budget_s=1" in skipped.error_message
    assert r[FAKE_ENGINE_C].succeeded and results[0].engine_name == FAKE_ENGINE_C
    s = g.last_autotune_summary
    assert s is not None and s.skipped_budget == 1
    # the default plan is tried whatever its compile is expected to cost
    with _fakes() as f:
        f[FAKE_ENGINE_A].first_compile_s = 50.0
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=1.0)
        assert f.counters.compiles[FAKE_ENGINE_A] == 1
    assert _by_name(results)[FAKE_ENGINE_A].succeeded


def test_a_compile_seen_in_this_process_replaces_the_first_compile_estimate(
    no_compiles_seen: dict[str, float],
) -> None:
    with _fakes() as f:
        f[FAKE_ENGINE_B].first_compile_s = 5.0
        _tune([FAKE_ENGINE_A, FAKE_ENGINE_B])  # no budget: every candidate compiled
        assert FAKE_ENGINE_B in no_compiles_seen and no_compiles_seen[FAKE_ENGINE_B] < 1.0
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B], time_budget_s=1.0)
        assert f.counters.compiles[FAKE_ENGINE_B] == 2  # its last compile fits: tried
    assert _by_name(results)[FAKE_ENGINE_B].succeeded
    # an EXHAUSTIVE-primed candidate runs its engine's search first: ten times dearer
    engine = SimpleNamespace(name="E", first_compile_s=2.0)
    primed = SimpleNamespace(
        engine=engine, prime=True, result=SimpleNamespace(supports_exhaustive=True)
    )
    exhaustive = dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE)
    assert search.expected_compile_s(primed, exhaustive) == pytest.approx(20.0)  # type: ignore[arg-type]
    assert search.expected_compile_s(primed, dt.AutotuneConfig()) == pytest.approx(2.0)  # type: ignore[arg-type]
    engine.first_compile_s = None  # short or unknown: never skipped for its compile
    assert search.expected_compile_s(primed, exhaustive) is None  # type: ignore[arg-type]


def test_a_budget_never_leaves_a_call_without_a_winner() -> None:
    with _fakes() as f:
        f.timings.set_compile(FAKE_ENGINE_A, 500.0)
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C], time_budget_s=0.01)
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].succeeded
    assert [r.failure_kind for r in results[1:]] == ["budget", "budget"]


def test_a_short_call_gets_three_samples_under_a_spent_budget() -> None:
    """Its time is the one ranked and, when it is the heuristic pick that wins, the one shown:
    one sample of a 1 ms call is no measurement (audit, session 20). A budget spent before its
    first sample (a 50 ms compile against 10 ms) still leaves it its 3 timed samples; a 25 ms
    call stops at one (below)."""
    for ms, expected in ((1.0, 3), (25.0, 1)):
        with _fakes({FAKE_ENGINE_A: ms}) as f:
            f.timings.set_compile(FAKE_ENGINE_A, 50.0)
            results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=0.01)
        assert results[0].engine_name == FAKE_ENGINE_A
        assert results[0].iterations_run == expected, ms


def test_no_secondary_clock_samples_once_the_budget_is_spent() -> None:
    """The secondary clock is informational: it took 3 more 400 ms runs after a 1 s budget was
    spent (2.4 s used); now a call stops at verify, warm-up and one timed sample."""
    with _fakes({FAKE_ENGINE_A: 400.0, FAKE_ENGINE_C: 300.0}) as f:
        start = f.clock.now_ms
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=1.0)
        used_s = (f.clock.now_ms - start) / 1e3
        runs = f.executions().count(FAKE_ENGINE_A)
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].iterations_run == 1
    assert runs == 3  # verification, warm-up, the one timed sample
    assert used_s < 1.3


def test_no_more_warm_ups_once_the_budget_is_spent() -> None:
    """``bench --oracle`` warms each candidate up 10 times: after a spent budget that was ten
    more 600 ms runs of each candidate; now one warm-up, then the timed minimum."""
    with _fakes({FAKE_ENGINE_A: 600.0, FAKE_ENGINE_C: 300.0}) as f:
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=1.0, warmup_iterations=10)
        runs = f.executions().count(FAKE_ENGINE_A)
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].iterations_run == 1
    assert runs == 3  # verification, one warm-up, the one timed sample
    with _fakes({FAKE_ENGINE_A: 1.0}) as f:
        _tune([FAKE_ENGINE_A], time_budget_s=1.0, warmup_iterations=10)
        assert f.executions().count(FAKE_ENGINE_A) >= 1 + 10  # within the budget: all of them


def test_the_recheck_and_confirmation_run_on_the_budget_clock() -> None:
    """Two plans 0.5 % apart with 3 % noise cannot be told apart: under a 5 s budget on the
    fake clock, the re-check and the confirmation stop at their minimum rounds. The
    confirmation's cap was read on perf_counter (241 s of fake time used) and the re-check
    took its 30 rounds after the budget was spent."""
    timings = {FAKE_ENGINE_A: 100.0, FAKE_ENGINE_C: 99.5, FAKE_ENGINE_B: 300.0}
    with _fakes(timings, noise=0.03) as f:
        start = f.clock.now_ms
        results, g = _tune([FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B], time_budget_s=5.0)
        used_s = (f.clock.now_ms - start) / 1e3
    s = g.last_autotune_summary
    assert s is not None and s.recheck_rounds == dt.AutotuneConfig().recheck_rounds
    assert s.confirmation is not None and s.confirmation.verdict == "kept_default_unsure"
    assert s.confirmation.rounds == dt.AutotuneConfig().confirm_rounds
    assert used_s < 15.0, used_s
    assert results[0].succeeded


def test_the_confirmation_stops_at_its_minimum_rounds_on_its_clock() -> None:
    from dnntune.autotune.confirm import confirm_winner
    from dnntune.autotune.verdicts import KEPT_UNSURE

    now = [0.0]
    rng = iter(range(10_000))

    def sample() -> float:  # 1 s per sample on the fake clock; the two plans indistinguishable
        now[0] += 1.0
        return 1.0 + 0.05 * ((next(rng) * 7919) % 13 - 6) / 6

    conf = confirm_winner(
        sample, sample, dt.AutotuneConfig(confirm_budget_ms=5000.0), clock=lambda: now[0]
    )
    assert conf.verdict == KEPT_UNSURE
    assert conf.rounds == dt.AutotuneConfig().confirm_rounds  # not 400 on a wall clock
    assert conf.time_ms == pytest.approx(2000.0 * conf.rounds)


def test_cheap_and_likely_first_under_a_budget() -> None:
    with _fakes() as f:
        f[FAKE_ENGINE_C].compile_cost = 1.0
        f[FAKE_ENGINE_B].compile_cost = 50.0
        variant = dt.EngineVariant(f.id(FAKE_ENGINE_A), {"fake.variant": 1})
        _tune([variant, FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=100.0)
        # the default plan, engines' default plans by compile cost, then the knob variant
        assert _first_runs(f) == [FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B]
        a_runs = [n for n in f.executions() if n == FAKE_ENGINE_A]
        assert len(a_runs) > 1


def _learned(monkeypatch: pytest.MonkeyPatch, result: Any) -> list[list[str]]:
    """rank_engines returns ``result`` (or raises it); the candidates it was asked about."""
    from dnntune.backend import learned

    asked: list[list[str]] = []

    def rank(graph: Any, device: Any, candidates: Sequence[str], path: Any = None) -> Any:
        asked.append(list(candidates))
        if isinstance(result, Exception):
            raise result
        return result, None

    monkeypatch.setattr(learned, "rank_engines", rank)
    return asked


def test_the_learned_ranking_orders_the_engines_under_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dnntune.backend.learned.predict import Neighbour, Prediction

    near = Neighbour("a trained problem", 0.1, 1.0, FAKE_ENGINE_C)
    ranking = Prediction([FAKE_ENGINE_C, FAKE_ENGINE_A, FAKE_ENGINE_B], {}, 0.9, [near])
    asked = _learned(monkeypatch, ranking)
    with _fakes() as f:
        f[FAKE_ENGINE_C].compile_cost = 50.0  # dearer to build, but predicted fastest
        f[FAKE_ENGINE_B].compile_cost = 1.0
        _tune([FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=100.0)
        assert _first_runs(f) == [FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B]
    assert sorted(asked[0]) == sorted([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C])


@pytest.mark.parametrize("declined", ["decline", "unreadable"])
def test_without_a_learned_ranking_the_compile_cost_orders_them(
    declined: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.backend.learned import Decline
    from dnntune.errors import ConfigFileError

    _learned(
        monkeypatch,
        Decline("no data") if declined == "decline" else ConfigFileError("corrupt model file"),
    )
    with _fakes() as f:
        f[FAKE_ENGINE_C].compile_cost = 50.0
        f[FAKE_ENGINE_B].compile_cost = 1.0
        _tune([FAKE_ENGINE_C, FAKE_ENGINE_A, FAKE_ENGINE_B], time_budget_s=100.0)
        assert _first_runs(f) == [FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C]


def test_a_corrupt_model_file_under_a_budget_warns_once_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DNNTUNE_HEUR_MODEL_PATH at a truncated model: the budget's search order fell back to
    the compile cost with a DEBUG line only (audit, session 18). It warns once, naming the
    file, and falls back (HeuristicMode.A: the heuristics' chain never read the file)."""
    from dnntune.autotune import search

    monkeypatch.setattr(search, "_MODEL_REPORTED", set())
    bad = tmp_path / "truncated_model.json"
    bad.write_text('{"format": "dnntune-heuristics-model", "format_ver')
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", str(bad))
    with _fakes() as f, caplog.at_level(logging.DEBUG, logger="dnntune.autotune.search"):
        f[FAKE_ENGINE_C].compile_cost = 50.0
        f[FAKE_ENGINE_B].compile_cost = 1.0
        for _ in range(2):
            f.clock.events.clear()
            _tune([FAKE_ENGINE_C, FAKE_ENGINE_A, FAKE_ENGINE_B], time_budget_s=100.0)
            assert _first_runs(f)[:3] == [FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C]
    said = [r for r in caplog.records if "learned model unusable" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
    assert str(bad) in said[0].getMessage() and "compile cost" in said[0].getMessage()


def test_without_a_budget_the_candidate_order_is_kept() -> None:
    with _fakes() as f:
        f[FAKE_ENGINE_C].compile_cost = 1.0
        _tune([FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C])
        assert _first_runs(f) == [FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_budget_is_refused(bad: float) -> None:
    with pytest.raises(dt.InvalidValueError, match="time_budget_s"):
        dt.AutotuneConfig(time_budget_s=bad).validate()


def test_the_budget_reserves_a_share_for_the_confirmation() -> None:
    now = [0.0]
    b = Budget(10.0, 0.2, lambda: now[0])
    assert not b.search_spent() and b.reserve_s == 2.0
    now[0] = 8.5
    assert b.search_spent()
    assert b.confirm_budget_ms(5000.0) == pytest.approx(2000.0)
    assert b.confirm_budget_ms(500.0) == 500.0
    assert Budget(None).confirm_budget_ms(700.0) == 700.0 and not Budget(None).search_spent()


# ---- early abandonment -------------------------------------------------------------------------
_NEVER_STABLE = {"stability_threshold": 1e-6, "max_iterations": 40}


def test_a_clearly_slower_candidate_is_abandoned_and_a_close_one_is_not() -> None:
    with _fakes({FAKE_ENGINE_B: 3.0, FAKE_ENGINE_C: 1.04}, noise=0.01):
        results, g = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C], **_NEVER_STABLE)
    r = {x.engine_name: x for x in results}
    slow, close, default = r[FAKE_ENGINE_B], r[FAKE_ENGINE_C], r[FAKE_ENGINE_A]
    assert slow.abandoned and slow.succeeded and slow.iterations_run == 3
    assert not slow.converged and slow.rank == 2
    assert not close.abandoned and close.iterations_run == 40
    assert not default.abandoned and default.iterations_run == 40
    s = g.last_autotune_summary
    assert s is not None and s.abandoned == 1


def test_the_default_plan_is_never_abandoned() -> None:
    with _fakes({FAKE_ENGINE_A: 3.0, FAKE_ENGINE_C: 1.0}, noise=0.01):
        results, _ = _tune([FAKE_ENGINE_C, FAKE_ENGINE_A], **_NEVER_STABLE)
    r = {x.engine_name: x for x in results}
    assert r[FAKE_ENGINE_A].is_default and not r[FAKE_ENGINE_A].abandoned
    assert r[FAKE_ENGINE_A].iterations_run == 40
    assert results[0].engine_name == FAKE_ENGINE_C and results[0].confirmation == "confirmed"


def test_abandonment_can_be_switched_off() -> None:
    with _fakes({FAKE_ENGINE_B: 3.0}, noise=0.01):
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B], abandon_slow=False, **_NEVER_STABLE)
    r = {x.engine_name: x for x in results}
    assert not r[FAKE_ENGINE_B].abandoned and r[FAKE_ENGINE_B].iterations_run == 40


def test_fixed_average_is_never_cut_short() -> None:
    with _fakes({FAKE_ENGINE_B: 3.0}):
        results, _ = _tune(
            [FAKE_ENGINE_A, FAKE_ENGINE_B],
            strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
            timed_iterations=9,
        )
    assert all(r.iterations_run == 9 and not r.abandoned for r in results)


def test_clearly_slower_needs_samples_margin_and_to_beat_the_noise() -> None:
    best = [1.0, 1.0, 1.0]
    assert not clearly_slower([2.0, 2.0], 1.0, best, 0.1)  # too few samples
    assert clearly_slower([2.0, 2.0, 2.0], 1.0, best, 0.1)
    assert not clearly_slower([1.05, 1.05, 1.05], 1.0, best, 0.1)  # within the margin
    assert not clearly_slower([1.3, 2.5, 4.0], 1.0, best, 0.1)  # too noisy to tell
