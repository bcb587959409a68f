"""Benchmarking one compiled candidate: verify, warm up, synchronize, time (RFC 0013 section 6.4).

Per candidate, in this order:

1. one run into fresh output buffers, compared with the reference (when ``config.verify``);
   it is also the candidate's first execution, so lazy compilation happens outside timing;
2. ``warmup_iterations`` untimed runs;
3. a device synchronize, so no earlier work leaks into this candidate's timings;
4. the strategy's timed loop, one sample per iteration through ``handle.timer``.

Samples follow ``config.ranking_metric``: "latency" times one execute on an idle device (host
submit included: what a latency-bound caller gets); "device" times back-to-back launches and
divides (what the kernels take). After the loop the other clock is sampled briefly so both are
reported. Every failure becomes data in the result; nothing here raises for a bad candidate.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dnntune.autotune.candidates import Candidate
from dnntune.autotune.statistics import TimingStats
from dnntune.autotune.strategies import run_strategy
from dnntune.autotune.types import AutotuneConfig, AutotuneResult

if TYPE_CHECKING:
    import torch

    from dnntune.autotune.verification import Verifier
    from dnntune.backend.engine import Plan
    from dnntune.backend.handle import Handle

__all__ = ["ExecutionContext", "benchmark_candidate", "record_samples"]

_log = logging.getLogger(__name__)

#: a "device" sample launches enough back-to-back calls to span about this long
DEVICE_SAMPLE_TARGET_MS = 1.0
MAX_LAUNCHES_PER_SAMPLE = 100
#: samples of the secondary clock (the one not used for ranking)
SECONDARY_SAMPLES = 3


@dataclass
class ExecutionContext:
    """Where candidates run: the handle (stream, timer), the caller's buffers, the workspace."""

    handle: Handle
    pack: dict[int, torch.Tensor]
    workspace: torch.Tensor | None
    flush: Callable[[], None] | None = None

    def run(self, plan: Plan, pack: Mapping[int, torch.Tensor] | None = None) -> None:
        with self.handle.stream_context():
            plan.execute(self.pack if pack is None else pack, self.workspace, self.handle.stream)

    def run_once_synchronized(self, plan: Plan) -> None:
        self.run(plan)
        self.handle.timer.synchronize()

    # ---- the two clocks -----------------------------------------------------------------
    def latency_sample(self, plan: Plan) -> float:
        """One execute on an idle device (cache flushed first in cold mode)."""
        timer = self.handle.timer
        if self.flush is not None:
            self.flush()
        timer.synchronize()
        return timer.time_ms(lambda: self.run(plan), 1)

    def device_sample(self, plan: Plan, launches: int) -> float:
        """Mean per launch of ``launches`` back-to-back executes."""
        timer = self.handle.timer
        if self.flush is not None:
            self.flush()
        timer.synchronize()
        return timer.time_ms(lambda: self.run(plan), launches)


def launches_for(latency_ms: float) -> int:
    """Back-to-back launches per device-time sample so one sample spans ~1 ms."""
    if latency_ms <= 0.0 or not math.isfinite(latency_ms):
        return MAX_LAUNCHES_PER_SAMPLE
    return max(1, min(MAX_LAUNCHES_PER_SAMPLE, math.ceil(DEVICE_SAMPLE_TARGET_MS / latency_ms)))


def record_samples(result: AutotuneResult, samples: list[float], metric: str) -> None:
    """Fill the timing fields of ``result`` from ``samples`` (milliseconds)."""
    stats = TimingStats.of(samples)
    result.samples_ms = list(samples)
    result.iterations_run = stats.count
    result.min_time_ms = stats.min_ms
    result.avg_time_ms = stats.mean_ms
    result.median_time_ms = stats.median_ms
    result.stddev_ms = stats.stddev_ms
    result.cov = stats.cov
    result.robust_time_ms = stats.robust_mean_ms
    if metric == "latency":
        result.latency_ms = stats.min_ms
    else:
        result.device_time_ms = stats.min_ms


def _fail(c: Candidate, message: str) -> None:
    c.fail(message)
    _log.warning("autotune: %s failed: %s", c.name, message)


def benchmark_candidate(
    c: Candidate,
    ctx: ExecutionContext,
    config: AutotuneConfig,
    verifier: Verifier | None,
    position: str = "",
) -> None:
    """Verify, warm up, synchronize and time one compiled candidate; fill ``c.result``."""
    plan = c.plan
    assert plan is not None and c.in_play
    r = c.result
    timer = ctx.handle.timer
    r.timer_kind = getattr(timer, "kind", type(timer).__name__)
    start = time.perf_counter()
    _log.info("autotune: benchmarking %s%s", c.name, f" ({position})" if position else "")
    try:
        _run_candidate(c, plan, ctx, config, verifier)
    finally:
        r.benchmark_time_ms = (time.perf_counter() - start) * 1e3


def _run_candidate(
    c: Candidate,
    plan: Plan,
    ctx: ExecutionContext,
    config: AutotuneConfig,
    verifier: Verifier | None,
) -> None:
    r = c.result
    timer = ctx.handle.timer
    # 1. correctness first, in fresh output buffers
    if verifier is not None:
        try:
            verdict = verifier.check(lambda p: ctx.run(plan, p), timer.synchronize)
        except Exception as exc:
            _fail(
                c, f"failed warmup (first execution, for verification): {type(exc).__name__}: {exc}"
            )
            return
        r.verified = verdict.ok
        r.max_abs_error = verdict.max_abs_error
        if verdict.ok is False:
            _fail(c, f"failed verification: {verdict.message}")
            return
    # 2. warmup (untimed)
    for i in range(config.warmup_iterations):
        try:
            ctx.run(plan)
        except Exception as exc:
            _fail(c, f"failed warmup (iteration {i + 1}): {type(exc).__name__}: {exc}")
            return
    # 3. device synchronize: nothing queued before may leak into this candidate's samples
    try:
        timer.synchronize()
    except Exception as exc:
        _fail(c, f"device synchronize after warmup failed: {type(exc).__name__}: {exc}")
        return
    # 4. the timed loop
    r.benchmarked = True
    metric = config.ranking_metric
    launches = 1
    if metric == "device":
        try:
            launches = launches_for(ctx.latency_sample(plan))
        except Exception as exc:
            _fail(c, f"Benchmark failed calibrating launches: {type(exc).__name__}: {exc}")
            return
    r.launches_per_sample = launches

    def time_once() -> float:
        if metric == "device":
            return ctx.device_sample(plan, launches)
        return ctx.latency_sample(plan)

    def on_sample(t: int, ms: float, cov: float | None) -> None:
        if cov is None:
            _log.debug("autotune: %s iteration %d: %.4f ms", c.name, t, ms)
        else:
            _log.debug("autotune: %s iteration %d: %.4f ms (CoV %.4f)", c.name, t, ms, cov)

    should_stop = None
    if config.candidate_timeout_s is not None:
        deadline = time.perf_counter() + config.candidate_timeout_s

        def should_stop() -> bool:
            return time.perf_counter() > deadline

    run = run_strategy(time_once, config, on_sample, should_stop)
    record_samples(r, run.samples_ms, metric)
    r.converged = run.converged
    if run.stopped_early:
        _log.warning(
            "autotune: %s: stopped after %d iteration(s): candidate_timeout_s=%s reached",
            c.name,
            len(run.samples_ms),
            config.candidate_timeout_s,
        )
    if run.failed:
        _fail(c, run.error or "Benchmark produced no samples")
        return
    r.succeeded = True
    _secondary_clock(c, plan, ctx, metric)
    _log.info(
        "autotune: %s: min=%.4f ms avg=%.4f ms median=%.4f ms stddev=%.4f ms iterations=%d "
        "converged=%s",
        c.name,
        r.min_time_ms,
        r.avg_time_ms,
        r.median_time_ms,
        r.stddev_ms,
        r.iterations_run,
        r.converged,
    )


def _secondary_clock(c: Candidate, plan: Plan, ctx: ExecutionContext, metric: str) -> None:
    """Sample the clock not used for ranking, so results report both (failures ignored)."""
    r = c.result
    try:
        if metric == "latency":
            launches = launches_for(r.min_time_ms)
            r.device_time_ms = min(
                ctx.device_sample(plan, launches) for _ in range(SECONDARY_SAMPLES)
            )
        else:
            r.latency_ms = min(ctx.latency_sample(plan) for _ in range(SECONDARY_SAMPLES))
    except Exception as exc:
        _log.debug("autotune: %s: secondary clock failed: %s", c.name, exc)
