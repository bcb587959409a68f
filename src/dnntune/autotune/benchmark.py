"""Benchmarking one compiled candidate: verify, warm up, synchronize, time (RFC 0013 section 6.4).

Per candidate, in this order:

1. one run into fresh output buffers, compared with the reference (when ``config.verify``);
   it is also the candidate's first execution, so lazy compilation happens outside timing;
2. ``warmup_iterations`` untimed runs;
3. a device synchronize, so no earlier work leaks into this candidate's timings;
4. the strategy's timed loop, one sample per iteration through ``handle.timer``.

Equal conditions: in cold mode the last-level cache is flushed before the verification run,
before every warmup run and before every sample (always outside the timed span), so every
candidate has the same history when its samples are taken.

Samples follow ``config.ranking_metric``: "latency" (the default, the RFC's per-iteration
timing) times one execute on an idle device, host submit included: what a latency-bound caller
gets. "device" times what the kernels take: the stream is held behind a stall gate while the
host queues the launches, and a kernel shorter than ``measure.clocks.SHORT_KERNEL_MS`` is
launched N times back to back per sample (N so that a sample spans
``measure.clocks.DEVICE_SAMPLE_MIN_MS``), recorded in ``launches_per_sample``. "throughput"
times N calls issued back to back with no gate (at least ``THROUGHPUT_MIN_LAUNCHES``, N so a
sample spans ``THROUGHPUT_SAMPLE_MIN_MS``): host submit and kernels overlap as in a model's
forward pass, so a sample is about max(host, device) per call. After the loop another clock is
sampled briefly so results report the latency or device time too. The clocks, the launch
counts, the steady-state sample and the statistics are :mod:`dnntune.measure`'s; this module
adds what is autotune's own: the candidate's order of steps, the watchdog and the result fields.

Every call into the candidate goes through the context's :class:`Watchdog` (a deadline when
``candidate_timeout_s`` is set). Every failure becomes data in the result; nothing here raises
for a bad candidate.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dnntune.autotune.candidates import Candidate
from dnntune.autotune.failures import (
    OOM,
    TIMEOUT,
    VERIFICATION,
    CandidateTimeout,
    describe_failure,
    expected_failure,
    failure_kind,
    release_memory,
)
from dnntune.autotune.search import Budget, SampleStop
from dnntune.autotune.strategies import run_strategy
from dnntune.autotune.watchdog import Watchdog
from dnntune.errors import DnnTuneError
from dnntune.measure import clocks, sampling
from dnntune.measure.stats import SampleStats
from dnntune.rfc import AutotuneConfig, AutotuneResult

if TYPE_CHECKING:
    import torch

    from dnntune.autotune.verification import Verdict, Verifier
    from dnntune.backend.engine import BoundCall, Plan
    from dnntune.backend.handle import Handle

__all__ = [
    "CLOCKS",
    "Clock",
    "ExecutionContext",
    "benchmark_candidate",
    "fail_candidate",
    "log_cost",
    "record_samples",
    "steady_sample",
]

_log = logging.getLogger(__name__)

#: where a plan keeps its call bound by the tuner: (the pack's uids, the call or None)
_BOUND = "_autotune_bound"

#: samples of the secondary clock (the one not used for ranking)
SECONDARY_SAMPLES = 3


@dataclass
class ExecutionContext:
    """Where candidates run: the handle (stream, timer), the caller's buffers, the workspace,
    the cold-cache flush and the watchdog every call into a candidate goes through.

    A candidate runs on the caller's buffers through its plan's bound call
    (:meth:`~dnntune.backend.engine.Plan.bind`), the call ``Graph.execute`` and the PyTorch
    layers make per execute: the tuner times each engine's plan with the host cost the user
    will pay for it. ``Plan.execute`` with a pack costs each engine differently (cuDNN's
    resolves the pack's pointers on every call: 1.4 µs more than its bound call on the H200,
    5 % of a 27 µs GEMM, where a PyTorch plan's costs 0.3 µs more), and ranking on it tilted
    close decisions away from cuDNN's plan (issue 21, session 16).
    """

    handle: Handle
    pack: dict[int, torch.Tensor]
    workspace: torch.Tensor | None
    flush: Callable[[], None] | None = None
    watchdog: Watchdog = field(default_factory=Watchdog)

    def run(self, plan: Plan, pack: Mapping[int, torch.Tensor] | None = None) -> None:
        """One execute on the handle's stream (unguarded: call it inside a guarded call): on
        the caller's buffers through the plan's bound call, on another pack (a verification
        run's fresh outputs) through ``execute``."""
        with self.handle.stream_context():
            if pack is None:
                call = self._bound_call(plan)
                if call is not None:
                    call(self._tensors, self.workspace)
                    return
                pack = self.pack
            plan.execute(pack, self.workspace, self.handle.stream)

    def __post_init__(self) -> None:
        # the pack's uids and tensors in one order, once: every timed run passes them
        self._keys = tuple(self.pack)
        self._tensors = list(self.pack.values())
        # the plans this context kept a bound call on, weakly: release() takes the calls back
        self._bound: list[weakref.ref[Plan]] = []

    def release(self) -> None:
        """Take back the bound calls this context kept on plans. A plan's call refers to the
        plan (a cycle only Python's cycle collector frees, which counts objects, not device
        memory): without this, a discarded priming plan or a losing candidate would keep its
        device memory (a cuDNN plan, a CUDA-graph pool) after the tune returned."""
        for ref in self._bound:
            plan = ref()
            if plan is not None:
                vars(plan).pop(_BOUND, None)
        self._bound.clear()

    def _bound_call(self, plan: Plan) -> BoundCall | None:
        """The plan's call bound to this pack's uids (None: it runs through ``execute``),
        kept on the plan itself until :meth:`release`, and reused by another context with the
        same uids meanwhile."""
        keys = self._keys
        state = getattr(plan, "__dict__", None)
        kept = None if state is None else state.get(_BOUND)
        if kept is not None and (kept[0] is keys or kept[0] == keys):
            return kept[1]
        call: BoundCall | None
        try:
            call = plan.bind(list(keys))
        except (DnnTuneError, ValueError) as exc:  # it runs through execute (its own checks)
            _log.debug("autotune: %s runs unbound: %s", plan.name, exc)
            call = None
        if state is None:
            return None  # nowhere to keep it: execute, not a bind per call
        try:
            self._bound.append(weakref.ref(plan))
        except TypeError:  # no weak references to it: not kept, bound again per context
            return call
        state[_BOUND] = (keys, call)
        return call

    def _cold(self) -> None:
        if self.flush is not None:
            self.flush()

    # ---- guarded calls ------------------------------------------------------------------
    def run_once_synchronized(self, plan: Plan) -> None:
        def once() -> None:
            self.run(plan)
            self.handle.timer.synchronize()

        self.watchdog.call(once, f"execute of {plan.name}")

    def warmup_run(self, plan: Plan) -> None:
        """One untimed run, after a flush in cold mode (the same history as a sample)."""

        def once() -> None:
            self._cold()
            self.run(plan)

        self.watchdog.call(once, f"warmup of {plan.name}")

    def synchronize(self) -> None:
        self.watchdog.call(self.handle.timer.synchronize, "device synchronize")

    def verify(self, plan: Plan, verifier: Verifier) -> Verdict:
        """The verification run: into fresh output buffers, compared with the reference."""

        def once() -> Verdict:
            self._cold()
            return verifier.check(lambda p: self.run(plan, p), self.handle.timer.synchronize)

        return self.watchdog.call(once, f"verification run of {plan.name}")

    # ---- the two clocks -----------------------------------------------------------------
    def latency_sample(self, plan: Plan, calls: int = 1) -> float:
        """The mean latency of ``calls`` executes, each on an idle device (cache flushed first
        in cold mode)."""

        def once() -> float:
            self._bound_call(plan)  # bound before the clock starts
            return clocks.latency_sample(
                self.handle.timer, lambda: self.run(plan), self.flush, calls
            )

        return self.watchdog.call(once, f"timed execute of {plan.name}")

    def device_sample(self, plan: Plan, launches: int) -> float:
        """Per-launch device time of ``launches`` back-to-back executes (behind a stall gate
        where the timer has one, see ``CudaEventTimer.device_time_ms``)."""

        def once() -> float:
            self._bound_call(plan)  # bound before the clock starts
            return clocks.device_sample(
                self.handle.timer, lambda: self.run(plan), launches, self.flush
            )

        return self.watchdog.call(once, f"timed launches of {plan.name}")

    def throughput_sample(self, plan: Plan, launches: int) -> float:
        """Per-call time of ``launches`` executes issued back to back, no gate: host submit
        and kernels overlap as they do when a model runs its layers (warm cache only)."""

        def once() -> float:
            self._bound_call(plan)  # bound before the clock starts
            return clocks.throughput_sample(self.handle.timer, lambda: self.run(plan), launches)

        return self.watchdog.call(once, f"back-to-back executes of {plan.name}")

    def calibrate_launches(self, plan: Plan) -> tuple[int, float]:
        """(launches per device sample, the single-launch calibration sample in ms)."""
        first = self.device_sample(plan, 1)
        return clocks.launches_for(first), first

    def calibrate_throughput(self, plan: Plan) -> int:
        """Back-to-back calls per throughput sample, from one call's latency."""
        return clocks.throughput_launches_for(self.latency_sample(plan))


@dataclass(frozen=True)
class Clock:
    """One ranking clock (``AutotuneConfig.ranking_metric``): how many launches a sample takes,
    how a sample is taken, which result field keeps its minimum, and whether the clock reported
    beside it is the device time (else the call latency)."""

    field: str
    calibrate: Callable[[ExecutionContext, Plan], int]
    sample: Callable[[ExecutionContext, Plan, int], float]
    secondary_is_device: bool
    #: launches per sample after the first, from the first sample (None: ``calibrate``'s
    #: count throughout); the call-latency clock times a short call several times per sample
    adapt: Callable[[float], int] | None = None


#: the clocks by ``ranking_metric`` name (see the module docstring)
CLOCKS: dict[str, Clock] = {
    "latency": Clock(
        "latency_ms",
        lambda ctx, plan: 1,
        lambda ctx, plan, launches: ctx.latency_sample(plan, launches),
        secondary_is_device=True,
        adapt=clocks.latency_calls_for,
    ),
    "device": Clock(
        "device_time_ms",
        lambda ctx, plan: ctx.calibrate_launches(plan)[0],
        lambda ctx, plan, launches: ctx.device_sample(plan, launches),
        secondary_is_device=False,
    ),
    "throughput": Clock(
        "throughput_ms",
        lambda ctx, plan: ctx.calibrate_throughput(plan),
        lambda ctx, plan, launches: ctx.throughput_sample(plan, launches),
        secondary_is_device=True,
    ),
}


def steady_sample(ctx: ExecutionContext, plan: Plan, metric: str, launches: int = 1) -> float:
    """One sample of ``metric``'s clock taken in ``plan``'s own steady state, for interleaved
    re-timing (:func:`dnntune.measure.steady_sample`: untimed runs of the same plan first, each
    after a flush in cold mode)."""
    return sampling.steady_sample(
        lambda: CLOCKS[metric].sample(ctx, plan, launches), lambda: ctx.warmup_run(plan)
    )


def record_samples(
    result: AutotuneResult, samples: list[float], metric: str, statistic: str = "median"
) -> None:
    """Fill the timing fields of ``result`` from ``samples`` (milliseconds); the decision time
    is their median (``statistic="min"``: their minimum)."""
    stats = SampleStats.of(samples)
    result.samples_ms = list(samples)
    result.iterations_run = stats.count
    result.min_time_ms = stats.min_ms
    result.avg_time_ms = stats.mean_ms
    result.median_time_ms = stats.median_ms
    result.stddev_ms = stats.stddev_ms
    result.cov = stats.cov
    result.robust_time_ms = stats.robust_mean_ms
    result.decision_time_ms = stats.min_ms if statistic == "min" else stats.median_ms
    setattr(result, CLOCKS[metric].field, stats.min_ms)


def fail_candidate(c: Candidate, message: str, kind: str) -> None:
    """Fail ``c`` with ``message`` (logged as a warning, at INFO when it is an expected
    outcome: ``failures.expected_failure``) and its failure kind."""
    c.fail(message)
    c.result.failure_kind = kind
    level = logging.INFO if expected_failure(kind) else logging.WARNING
    _log.log(level, "autotune: %s failed: %s", c.name, message)


def log_cost(c: Candidate) -> None:
    """Log what the candidate cost, step by step."""
    r = c.result
    _log.info(
        "autotune: %s: cost - compile %.1f ms, priming %.1f ms, benchmark %.1f ms",
        c.name,
        r.compile_time_ms,
        r.priming_time_ms,
        r.benchmark_time_ms,
    )


def benchmark_candidate(
    c: Candidate,
    ctx: ExecutionContext,
    config: AutotuneConfig,
    verifier: Verifier | None,
    position: str = "",
    *,
    budget: Budget | None = None,
    best: AutotuneResult | None = None,
) -> None:
    """Verify, warm up, synchronize and time one compiled candidate; fill ``c.result``.

    ``budget``: no new sample once the search's share of it is spent. ``best``: the fastest
    candidate so far; with ``config.abandon_slow`` the timing stops once this one is clearly
    slower (``search.clearly_slower``; never for the default plan).
    """
    plan = c.plan
    assert plan is not None and c.in_play
    r = c.result
    timer = ctx.handle.timer
    r.timer_kind = getattr(timer, "kind", type(timer).__name__)
    start = time.perf_counter()
    _log.info("autotune: benchmarking %s%s", c.name, f" ({position})" if position else "")
    try:
        stop = SampleStop(c, config, start, budget, best)
        _run_candidate(c, plan, ctx, config, verifier, start, stop)
    finally:
        r.benchmark_time_ms = (time.perf_counter() - start) * 1e3
    log_cost(c)
    if r.failure_kind == OOM:
        # outside every except block: the failed call's frames are gone, so is their memory
        release_memory(ctx.handle.device)


def _run_candidate(
    c: Candidate,
    plan: Plan,
    ctx: ExecutionContext,
    config: AutotuneConfig,
    verifier: Verifier | None,
    start: float,
    stop: SampleStop,
) -> None:
    r = c.result
    # 1. correctness first, in fresh output buffers
    if verifier is not None:
        try:
            verdict = ctx.verify(plan, verifier)
        except Exception as exc:
            fail_candidate(
                c,
                "failed warmup (first execution, for verification): " + describe_failure(exc),
                failure_kind(exc),
            )
            return
        r.verified = verdict.ok
        r.max_abs_error = verdict.max_abs_error
        if verdict.ok is False:
            fail_candidate(c, f"failed verification: {verdict.message}", VERIFICATION)
            return
    # 2. warmup (untimed): after the first, none once the budget or the candidate's timeout
    # is spent (ten 50 ms warm-ups of the bench oracle's default ran after a spent budget)
    for i in range(config.warmup_iterations):
        if i and stop.out_of_time():
            break
        try:
            ctx.warmup_run(plan)
        except Exception as exc:
            fail_candidate(
                c, f"failed warmup (iteration {i + 1}): {describe_failure(exc)}", failure_kind(exc)
            )
            return
    # 3. device synchronize: nothing queued before may leak into this candidate's samples
    try:
        ctx.synchronize()
    except Exception as exc:
        fail_candidate(
            c, f"device synchronize after warmup failed: {describe_failure(exc)}", failure_kind(exc)
        )
        return
    # 4. the timed loop
    r.benchmarked = True
    metric = config.ranking_metric
    clock = CLOCKS[metric]
    try:
        launches = clock.calibrate(ctx, plan)
    except Exception as exc:
        fail_candidate(
            c, f"Benchmark failed calibrating launches: {describe_failure(exc)}", failure_kind(exc)
        )
        return
    r.launches_per_sample = launches

    adapt = clock.adapt

    def time_once() -> float:
        nonlocal adapt
        ms = clock.sample(ctx, plan, r.launches_per_sample)
        if adapt is not None:  # the first sample sets the later ones' launches
            r.launches_per_sample, adapt = adapt(ms), None
        return ms

    def on_sample(t: int, ms: float, cov: float | None) -> None:
        stop.samples.append(ms)
        if cov is None:
            _log.debug("autotune: %s iteration %d: %.4f ms", c.name, t, ms)
        else:
            _log.debug("autotune: %s iteration %d: %.4f ms (CoV %.4f)", c.name, t, ms, cov)

    run = run_strategy(time_once, config, on_sample, stop)
    record_samples(r, run.samples_ms, metric, config.ranking_statistic)
    r.converged = run.converged
    if run.stopped_early:
        stop.report(len(run.samples_ms))
    if run.failed:
        fail_candidate(c, run.error or "Benchmark produced no samples", run.error_kind or "error")
        return
    if verifier is not None:
        # the timed runs read the caller's inputs too: a plan that writes into them fails here
        ctx.synchronize()
        clobbered = verifier.inputs_changed()
        if clobbered:
            fail_candidate(
                c, f"failed verification: during its timed runs it {clobbered}", VERIFICATION
            )
            return
    r.succeeded = True
    _secondary_clock(c, plan, ctx, clock, stop)
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


def _secondary_clock(
    c: Candidate, plan: Plan, ctx: ExecutionContext, clock: Clock, stop: SampleStop
) -> None:
    """Sample another clock than the ranking one (device time for "latency" and "throughput",
    latency for "device"), so results report it too (failures ignored). It is informational:
    none is taken once the time budget is spent, or when the timed loop was cut short."""
    r = c.result

    def spent() -> bool:
        return stop.budget is not None and stop.budget.search_spent()

    if stop.why or spent():
        return
    try:
        if clock.secondary_is_device:
            launches, first = ctx.calibrate_launches(plan)
            samples = [first] if launches == 1 else []
            while len(samples) < SECONDARY_SAMPLES and not (samples and spent()):
                samples.append(ctx.device_sample(plan, launches))
            r.device_time_ms = min(samples)
        else:
            latencies = [ctx.latency_sample(plan)]
            while len(latencies) < SECONDARY_SAMPLES and not spent():
                latencies.append(ctx.latency_sample(plan))
            r.latency_ms = min(latencies)
    except CandidateTimeout as exc:  # its thread is stuck: it cannot be re-timed or win
        fail_candidate(c, f"failed timing the secondary clock: {exc}", TIMEOUT)
    except Exception as exc:
        _log.debug("autotune: %s: secondary clock failed: %s", c.name, exc)
