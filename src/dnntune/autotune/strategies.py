"""Timed-loop strategies (RFC 0013 section 6.4): functions over a ``time_once`` callable.

A strategy decides how many samples to take and whether the candidate converged. It knows
nothing of engines, plans or devices: ``time_once()`` returns one sample in milliseconds (or
raises), which keeps every strategy testable with a list of numbers. Strategies are looked up
in :data:`STRATEGIES` by :class:`AutotuneStrategy`; adding one means adding a function there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from dnntune.autotune.failures import describe_failure, failure_kind
from dnntune.measure.stats import coefficient_of_variation
from dnntune.rfc import AutotuneConfig, AutotuneStrategy

__all__ = [
    "STRATEGIES",
    "OnSample",
    "Strategy",
    "TimedRun",
    "fixed_average",
    "run_strategy",
    "run_until_stable",
]

#: one timed sample in milliseconds; raises on failure
TimeOnce = Callable[[], float]
#: progress callback: (1-based iteration, sample ms, CoV of the current window or None)
OnSample = Callable[[int, float, float | None], None]
#: polled before each iteration; True stops the loop (a per-candidate time budget)
ShouldStop = Callable[[], bool]


@dataclass
class TimedRun:
    """What a strategy measured. ``error`` is set when an iteration failed."""

    samples_ms: list[float] = field(default_factory=list)
    converged: bool = False
    error: str | None = None
    #: the loop stopped because ``should_stop`` said so (time budget), not by its own rule
    stopped_early: bool = False
    #: ``failures.failure_kind`` of the failed iteration ("" when none failed)
    error_kind: str = ""

    @property
    def failed(self) -> bool:
        return self.error is not None or not self.samples_ms


Strategy = Callable[[TimeOnce, AutotuneConfig, OnSample | None, ShouldStop | None], TimedRun]


class _IterationFailed(Exception):
    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def _sample(time_once: TimeOnce, iteration: int) -> float:
    try:
        ms = float(time_once())
    except Exception as exc:
        # no "from exc": the failed call's frames (and tensors) must not outlive this block
        raise _IterationFailed(
            f"Benchmark failed on iteration {iteration}: {describe_failure(exc)}",
            failure_kind(exc),
        ) from None
    if not math.isfinite(ms) or ms < 0.0:
        raise _IterationFailed(
            f"Benchmark failed on iteration {iteration}: the timer reported a non-finite or "
            f"negative elapsed time ({ms})"
        )
    return ms


#: after each sample: (CoV of the window to report or None, True to stop converged)
_Judge = Callable[[list[float]], tuple[float | None, bool]]


def _timed_loop(
    time_once: TimeOnce,
    iterations: int,
    judge: _Judge,
    on_sample: OnSample | None,
    should_stop: ShouldStop | None,
) -> TimedRun:
    """Up to ``iterations`` samples; ``judge`` decides after each one whether the loop
    converged. Stops early when ``should_stop`` says so or a sample fails."""
    run = TimedRun()
    for t in range(1, iterations + 1):
        if should_stop is not None and run.samples_ms and should_stop():
            run.stopped_early = True
            return run
        try:
            ms = _sample(time_once, t)
        except _IterationFailed as exc:
            run.error, run.error_kind = str(exc), exc.kind
            return run
        run.samples_ms.append(ms)
        cov, done = judge(run.samples_ms)
        if on_sample is not None:
            on_sample(t, ms, cov)
        if done:
            run.converged = True
            return run
    return run


def fixed_average(
    time_once: TimeOnce,
    config: AutotuneConfig,
    on_sample: OnSample | None = None,
    should_stop: ShouldStop | None = None,
) -> TimedRun:
    """Exactly ``timed_iterations`` samples; converged means all of them succeeded."""
    n = config.timed_iterations
    return _timed_loop(
        time_once, n, lambda samples: (None, len(samples) == n), on_sample, should_stop
    )


def run_until_stable(
    time_once: TimeOnce,
    config: AutotuneConfig,
    on_sample: OnSample | None = None,
    should_stop: ShouldStop | None = None,
) -> TimedRun:
    """Sample until the CoV of the last ``window_size`` samples is below the threshold.

    Converged when CoV < ``stability_threshold`` (strict); stops unconverged after
    ``max_iterations``. Constant samples converge after exactly ``window_size`` iterations.
    """
    window = config.window_size

    def judge(samples: list[float]) -> tuple[float | None, bool]:
        if len(samples) < window:
            return None, False
        cov = coefficient_of_variation(samples[-window:])
        return cov, cov < config.stability_threshold

    return _timed_loop(time_once, config.max_iterations, judge, on_sample, should_stop)


STRATEGIES: dict[AutotuneStrategy, Strategy] = {
    AutotuneStrategy.FIXED_AVERAGE: fixed_average,
    AutotuneStrategy.RUN_UNTIL_STABLE: run_until_stable,
}


def run_strategy(
    time_once: TimeOnce,
    config: AutotuneConfig,
    on_sample: OnSample | None = None,
    should_stop: ShouldStop | None = None,
) -> TimedRun:
    """Run the strategy ``config.strategy`` names."""
    return STRATEGIES[config.strategy](time_once, config, on_sample, should_stop)
