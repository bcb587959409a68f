"""FIXED_AVERAGE and RUN_UNTIL_STABLE on known sequences (RFC 6.4, 10.2)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import pytest

from dnntune.autotune.strategies import (
    STRATEGIES,
    fixed_average,
    run_strategy,
    run_until_stable,
)
from dnntune.rfc import AutotuneConfig, AutotuneStrategy


def _seq(values: Iterable[float]):
    it = iter(values)
    return lambda: next(it)


def test_every_strategy_is_registered() -> None:
    assert set(STRATEGIES) == set(AutotuneStrategy)


def test_fixed_average_runs_exactly_n() -> None:
    cfg = AutotuneConfig(strategy=AutotuneStrategy.FIXED_AVERAGE, timed_iterations=4)
    run = fixed_average(_seq([1.0, 5.0, 2.0, 3.0, 99.0]), cfg)
    assert run.samples_ms == [1.0, 5.0, 2.0, 3.0]
    assert run.converged and run.error is None and not run.failed


def test_constant_timings_converge_after_window() -> None:
    cfg = AutotuneConfig(window_size=3)
    run = run_until_stable(_seq(itertools.repeat(2.0)), cfg)
    assert run.converged
    assert len(run.samples_ms) == 3


def test_alternating_never_converges() -> None:
    cfg = AutotuneConfig(max_iterations=20, window_size=3, stability_threshold=0.05)
    run = run_until_stable(_seq(itertools.cycle([10.0, 20.0])), cfg)
    assert not run.converged
    assert len(run.samples_ms) == 20
    assert run.error is None and not run.failed


def test_converges_once_the_window_settles() -> None:
    cfg = AutotuneConfig(max_iterations=100, window_size=3, stability_threshold=0.05)
    run = run_until_stable(_seq([5, 9, 5, 10, 10, 10, 10]), cfg)
    assert run.converged
    assert len(run.samples_ms) == 6


def test_threshold_is_strict() -> None:
    # CoV of [1, 3] is exactly 0.5: not below a 0.5 threshold
    cfg = AutotuneConfig(max_iterations=4, window_size=2, stability_threshold=0.5)
    run = run_until_stable(_seq(itertools.cycle([1.0, 3.0])), cfg)
    assert not run.converged and len(run.samples_ms) == 4


def test_window_size_governs_first_check() -> None:
    cfg = AutotuneConfig(window_size=5, max_iterations=50)
    run = run_until_stable(_seq(itertools.repeat(1.0)), cfg)
    assert len(run.samples_ms) == 5


def test_iteration_failure_is_reported() -> None:
    calls = iter([1.0, 1.0])

    def time_once() -> float:
        try:
            return next(calls)
        except StopIteration:
            raise RuntimeError("device lost") from None

    run = fixed_average(time_once, AutotuneConfig(timed_iterations=5))
    assert run.failed and not run.converged
    assert run.error == "Benchmark failed on iteration 3: RuntimeError: device lost"
    assert run.samples_ms == [1.0, 1.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_non_finite_or_negative_time_fails(bad: float) -> None:
    run = run_until_stable(_seq([1.0, bad]), AutotuneConfig())
    assert run.failed
    assert "iteration 2" in (run.error or "")
    assert "non-finite or negative" in (run.error or "")


def test_should_stop_ends_loop_early() -> None:
    cfg = AutotuneConfig(strategy=AutotuneStrategy.FIXED_AVERAGE, timed_iterations=10)
    n = {"calls": 0}

    def stop() -> bool:
        n["calls"] += 1
        return n["calls"] > 2

    run = run_strategy(_seq(itertools.repeat(1.0)), cfg, None, stop)
    assert run.stopped_early and not run.converged and len(run.samples_ms) == 3


def test_on_sample_reports_cov_for_run_until_stable() -> None:
    seen: list[tuple[int, float, float | None]] = []
    run_until_stable(
        _seq(itertools.repeat(1.0)), AutotuneConfig(), lambda t, ms, cov: seen.append((t, ms, cov))
    )
    assert seen == [(1, 1.0, None), (2, 1.0, None), (3, 1.0, 0.0)]
