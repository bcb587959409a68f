"""Issue 25: a candidate whose engine's measured call floor already loses to the best candidate
timed so far is not built or timed, and is recorded (``autotune.call_floor``), on the fake
engines' clock with a scripted floor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune.call_floor import cannot_win
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C, FakeEngines

WS = testing.ESTIMATED_WORKSPACE_BYTES


@contextmanager
def _fakes(
    monkeypatch: pytest.MonkeyPatch, floors: dict[str, float], timings: dict[str, float]
) -> Iterator[FakeEngines]:
    """FAKE_ENGINE_A (the default, 1 ms), B and C; ``floors``: engine -> call floor (ms)."""
    names = [FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings=timings, seed=3) as f:
        for name, floor in floors.items():
            monkeypatch.setattr(f[name], "has_call_floor", lambda handle: True)
            monkeypatch.setattr(f[name], "call_floor_ms", lambda handle, floor=floor: floor)
        yield f


def _tune(order: Sequence[str], **config: Any) -> tuple[list[dt.AutotuneResult], dt.Graph]:
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    for name in order:
        g.add_engine(name)
    pack = testing.make_pack(g)
    ws = torch.empty(WS, dtype=torch.uint8)
    return g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config)), g


def _first_runs(f: FakeEngines) -> list[str]:
    return list(dict.fromkeys(f.executions()))


@pytest.mark.parametrize("budget", [None, 100.0])
def test_a_candidate_whose_floor_loses_is_not_built_and_is_recorded(
    monkeypatch: pytest.MonkeyPatch, budget: float | None
) -> None:
    # B's calls take at least 2 ms here; A (the default) was timed at 1 ms: B cannot win
    timings = {FAKE_ENGINE_B: 3.0, FAKE_ENGINE_C: 2.0}
    with _fakes(monkeypatch, {FAKE_ENGINE_B: 2.0}, timings) as f:
        results, g = _tune([FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C], time_budget_s=budget)
        assert f.counters.compiles[FAKE_ENGINE_B] == 0  # never built
        assert FAKE_ENGINE_B not in f.executions()
    assert len(results) == 3  # one result per candidate still
    skipped = {r.engine_name: r for r in results}[FAKE_ENGINE_B]
    assert not skipped.succeeded and skipped.failure_kind == "floor"
    assert skipped.excluded_by_caller and not skipped.benchmarked and skipped.rank == -1
    assert "skipped (call floor)" in skipped.error_message
    assert "at least 2000.0 us" in skipped.error_message
    assert "FAKE_ENGINE_A at 1000.0 us" in skipped.error_message
    assert results[0].engine_name == FAKE_ENGINE_A
    s = g.last_autotune_summary
    assert s is not None and s.excluded == 1 and s.failed == 0 and s.skipped_budget == 0


def test_a_candidate_whose_floor_can_still_win_is_built_after_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # B's floor (0.5 ms) is below A's 1 ms: it may win, and does (0.7 ms), built last
    timings = {FAKE_ENGINE_B: 0.7, FAKE_ENGINE_C: 2.0}
    with _fakes(monkeypatch, {FAKE_ENGINE_B: 0.5}, timings) as f:
        results, _ = _tune([FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C])
        assert f.counters.compiles[FAKE_ENGINE_B] == 1
        # without a budget the caller's order, but the floored candidate after the others
        assert _first_runs(f) == [FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B]
    assert all(r.succeeded for r in results)
    assert results[0].engine_name == FAKE_ENGINE_B


def test_the_default_plan_is_never_skipped_for_its_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    # C (0.5 ms) is timed before A, whose floor (5 ms) is far above: A is the baseline still
    with _fakes(monkeypatch, {FAKE_ENGINE_A: 5.0}, {FAKE_ENGINE_C: 0.5}) as f:
        results, _ = _tune([FAKE_ENGINE_C, FAKE_ENGINE_A])
        assert f.counters.compiles[FAKE_ENGINE_A] >= 1
    assert all(r.succeeded for r in results)


def test_nothing_is_skipped_for_its_floor_with_abandon_slow_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _fakes(monkeypatch, {FAKE_ENGINE_B: 2.0}, {FAKE_ENGINE_B: 3.0}) as f:
        results, _ = _tune([FAKE_ENGINE_A, FAKE_ENGINE_B], abandon_slow=False)
        assert f.counters.compiles[FAKE_ENGINE_B] == 1
    assert all(r.succeeded for r in results)


def test_cannot_win_compares_the_fastest_samples_beyond_the_margin() -> None:
    best = dt.AutotuneResult(min_time_ms=0.010, decision_time_ms=16.0)  # a busy CPU's median
    assert cannot_win(0.030, best, 0.10)
    assert not cannot_win(0.0105, best, 0.10)  # within the margin: might still win
    assert not cannot_win(0.030, dt.AutotuneResult(min_time_ms=0.0), 0.10)  # not timed
