"""Timing one plan for a benchmark row: first call, warmup, then samples of two clocks.

``kernel`` = device time per launch (CUDA events on the handle's stream behind the timer's stall
gate, so host launch latency stays outside the span; perf_counter on CPU around a synchronized
call); ``host`` = the host submit time of ``execute`` (what the
caller's thread spends; on CPU it includes the work). Warmup launches go through the same
path as timed ones and are discarded. Cold mode flushes the last-level cache before every
warmup and timed launch, outside the timed span.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.cache_flush import CacheFlusher
from dnntune.backend.handle import Handle
from dnntune.bench.stats import SampleStats, summarize

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "timing": {
                "timer": self.timer,
                "cache_mode": self.cache_mode,
                "warmup_iters": self.warmup_iters,
                "first_call_ms": self.first_call_ms,
                "capped": self.capped,
            },
            "kernel": self.kernel.to_dict(),
            "host": self.host.to_dict(),
        }


def time_callable(
    run: Callable[[], None],
    handle: Handle,
    options: TimingOptions,
    flusher: CacheFlusher | None = None,
) -> PlanTiming:
    """Time ``run`` (one execute of a plan) per the options; raises what ``run`` raises."""
    host_ms: list[float] = []

    def submit() -> None:
        start = time.perf_counter_ns()
        run()
        host_ms.append((time.perf_counter_ns() - start) / 1e6)

    # Device time of one launch: behind the CUDA timer's stall gate when it has one, so a
    # short kernel is not timed as "host launch latency + kernel"; otherwise the timer's span.
    measure = getattr(handle.timer, "device_time_ms", None) or handle.timer.time_ms

    def one_sample() -> float:
        if flusher is not None:
            flusher.flush()
        return float(measure(submit))

    handle.synchronize()
    start = time.perf_counter_ns()
    run()
    handle.synchronize()
    first_call_ms = (time.perf_counter_ns() - start) / 1e6
    for _ in range(options.warmup):
        one_sample()
    handle.synchronize()
    host_ms.clear()
    kernel_ms: list[float] = []
    total = 0.0
    cap = max(options.max_iters, options.iters)
    while len(kernel_ms) < options.iters or total < options.min_time_ms:
        if len(kernel_ms) >= cap:
            break
        sample = one_sample()
        kernel_ms.append(sample)
        total += sample
    return PlanTiming(
        kernel=summarize(kernel_ms),
        host=summarize(host_ms),
        first_call_ms=first_call_ms,
        warmup_iters=options.warmup,
        cache_mode=options.cache_mode,
        timer=handle.timer.kind,
        capped=len(kernel_ms) >= cap and total < options.min_time_ms,
        kernel_samples_ms=kernel_ms,
        host_samples_ms=list(host_ms),
    )
