"""Timing one plan for a benchmark row: first call, warmup, then samples of two clocks.

``kernel`` = device time per launch (CUDA events on the handle's stream behind the timer's stall
gate, so host launch latency stays outside the span; perf_counter on CPU around a synchronized
call); ``host`` = the host submit time of ``execute`` (what the
caller's thread spends; on CPU it includes the work). Warmup launches go through the same
path as timed ones and are discarded. Cold mode flushes the last-level cache before every
warmup and timed launch, outside the timed span. The clocks, the sampling loop and the
statistics are :mod:`dnntune.measure`'s; this module adds the bench row's timing record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.handle import Handle
from dnntune.measure import (
    SampleStats,
    contention,
    device_clock,
    host_ms,
    steady_samples,
    summarize,
)

__all__ = ["PlanTiming", "TimingOptions", "time_callable"]


@dataclass(frozen=True)
class TimingOptions:
    warmup: int = 10
    iters: int = 100
    min_time_ms: float = 0.0
    cache_mode: str = "warm"
    max_iters: int = 10000


@dataclass
class PlanTiming:
    kernel: SampleStats
    host: SampleStats
    first_call_ms: float
    warmup_iters: int
    cache_mode: str
    timer: str
    capped: bool
    kernel_samples_ms: list[float] = field(default_factory=list, repr=False)
    host_samples_ms: list[float] = field(default_factory=list, repr=False)
    #: the share of the sampling's wall time this process's threads waited for a CPU core
    #: (:mod:`dnntune.measure.contention`; None: unmeasured)
    cpu_wait_share: float | None = None

    @property
    def timed_while_busy(self) -> bool:
        """The samples were taken on an oversubscribed CPU: not to be trusted."""
        return contention.busy(self.cpu_wait_share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "timing": {
                "timer": self.timer,
                "cache_mode": self.cache_mode,
                "warmup_iters": self.warmup_iters,
                "first_call_ms": self.first_call_ms,
                "capped": self.capped,
                "cpu_wait_share": self.cpu_wait_share,
            },
            "kernel": self.kernel.to_dict(),
            "host": self.host.to_dict(),
        }


def time_callable(
    run: Callable[[], None],
    handle: Handle,
    options: TimingOptions,
    flush: Callable[[], None] | None = None,
) -> PlanTiming:
    """Time ``run`` (one execute of a plan) per the options; raises what ``run`` raises.

    ``flush``: the cold-cache flush (:func:`dnntune.measure.cold_flush` for
    ``options.cache_mode``), run before every warmup and timed launch; None when warm.
    """
    submit_ms: list[float] = []

    def submit() -> None:
        submit_ms.append(host_ms(run))

    # Device time of one launch: behind the CUDA timer's stall gate when it has one, so a
    # short kernel is not timed as "host launch latency + kernel"; otherwise the timer's span.
    clock = device_clock(handle.timer)

    def one_sample() -> float:
        if flush is not None:
            flush()
        return float(clock(submit, 1))

    def settle() -> None:  # after the warmup: idle device, warmup submits forgotten
        handle.synchronize()
        submit_ms.clear()

    def first_call() -> None:
        run()
        handle.synchronize()

    handle.synchronize()
    first_call_ms = host_ms(first_call)
    busy = contention.wait_share(lambda: contention.timer_wait_s(handle.timer), _wall(handle))
    taken = steady_samples(
        one_sample,
        options.iters,
        warm=one_sample,
        warm_runs=options.warmup,
        synchronize=settle,
        min_total_ms=options.min_time_ms,
        max_count=options.max_iters,
    )
    return PlanTiming(
        kernel=summarize(taken.samples_ms),
        host=summarize(submit_ms),
        first_call_ms=first_call_ms,
        warmup_iters=options.warmup,
        cache_mode=options.cache_mode,
        timer=handle.timer.kind,
        capped=taken.capped,
        kernel_samples_ms=taken.samples_ms,
        host_samples_ms=list(submit_ms),
        cpu_wait_share=busy(),
    )


def _wall(handle: Handle) -> Callable[[], float]:
    """Seconds on the handle timer's wall clock where it has one (the fake clock), else
    ``perf_counter``: what the CPU wait is a share of."""
    wall: Callable[[], float] | None = getattr(handle.timer, "wall_s", None)
    return wall if wall is not None else time.perf_counter
