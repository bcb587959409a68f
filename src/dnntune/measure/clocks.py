"""The clocks a sample is read from, and how many launches one sample takes.

A :class:`~dnntune.backend.timer.Timer` (the handle's: CUDA events on its stream, or
``perf_counter_ns`` around a synchronized CPU call; a fake in tests) times calls. On top of it:

* **call latency** (:func:`latency_sample`): a call on an idle device, host submit included;
  a short call is timed several times per sample (:func:`latency_sampler`);
* **device time** (:func:`device_sample`, :func:`device_clock`): what the kernels take, behind
  the timer's stall gate where it has one (``device_time_ms``), its call span otherwise;
* **back-to-back calls** (:func:`throughput_sample`): N calls with no gate, host submit and
  kernels overlapping as in a model's forward;
* **the host clock** (:func:`host_ms`): ``perf_counter_ns`` around a call, what the caller's
  thread spends (and, around a synchronize, the wall time a serving loop sees).

A cold-cache flush (``flush``) always runs before the synchronize, outside the timed span.
Short kernels are launched several times per sample so that one sample spans long enough to be
read (:func:`repeats_for`, :func:`launches_for`, :func:`throughput_launches_for`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dnntune.backend.timer import Timer

__all__ = [
    "DEVICE_SAMPLE_MIN_MS",
    "LATENCY_SAMPLE_MIN_MS",
    "MAX_LATENCY_CALLS",
    "MAX_LAUNCHES_PER_SAMPLE",
    "SHORT_KERNEL_MS",
    "THROUGHPUT_MIN_LAUNCHES",
    "THROUGHPUT_SAMPLE_MIN_MS",
    "ClockFn",
    "device_clock",
    "device_sample",
    "host_ms",
    "latency_calls_for",
    "latency_sample",
    "latency_sampler",
    "launches_for",
    "repeats_for",
    "throughput_launches_for",
    "throughput_sample",
]

#: a device-time sample below this is host-overhead territory: launch back to back instead
SHORT_KERNEL_MS = 0.02
#: ... enough launches that one sample spans at least this long
DEVICE_SAMPLE_MIN_MS = 0.1
MAX_LAUNCHES_PER_SAMPLE = 1000
#: back-to-back ("throughput") samples: at least this many calls, and enough that one sample
#: spans THROUGHPUT_SAMPLE_MIN_MS, so the first call's launch latency is spread thin
THROUGHPUT_MIN_LAUNCHES = 8
THROUGHPUT_SAMPLE_MIN_MS = 0.5
#: call-latency samples: the mean latency of enough calls (each on an idle device) that one
#: sample spans LATENCY_SAMPLE_MIN_MS, at most MAX_LATENCY_CALLS. One ~30 us call varies by
#: 10-20 % on the H200 (decision_quality.py, session 8): too noisy to tell two GEMVs apart.
LATENCY_SAMPLE_MIN_MS = 0.25
MAX_LATENCY_CALLS = 8

#: (fn, repeats) -> mean milliseconds per call of ``repeats`` back-to-back calls of ``fn``
ClockFn = Callable[[Callable[[], object], int], float]


def device_clock(timer: Timer) -> ClockFn:
    """The timer's device clock (``device_time_ms``, host gaps kept out of the span) when it
    has one, else its call clock (``time_ms``)."""
    device = getattr(timer, "device_time_ms", None)
    return device if callable(device) else timer.time_ms


def host_ms(fn: Callable[[], object], repeats: int = 1) -> float:
    """Mean host milliseconds per call of ``repeats`` back-to-back calls of ``fn``
    (``perf_counter_ns``; nothing is synchronized unless ``fn`` does it)."""
    start = time.perf_counter_ns()
    for _ in range(repeats):
        fn()
    return (time.perf_counter_ns() - start) / 1e6 / repeats


def latency_sample(
    timer: Timer,
    fn: Callable[[], object],
    flush: Callable[[], None] | None = None,
    calls: int = 1,
) -> float:
    """The mean latency of ``calls`` calls of ``fn``, each on an idle device, host submit
    included (ms); the cache flushed before each in cold mode."""
    total = 0.0
    for _ in range(calls):
        if flush is not None:
            flush()
        timer.synchronize()
        total += timer.time_ms(fn, 1)
    return total / calls


def latency_calls_for(probe_ms: float) -> int:
    """Calls per latency sample, from one call's latency (:data:`LATENCY_SAMPLE_MIN_MS`)."""
    return repeats_for(probe_ms, LATENCY_SAMPLE_MIN_MS, hi=MAX_LATENCY_CALLS)


def latency_sampler(
    timer: Timer, fn: Callable[[], object], flush: Callable[[], None] | None = None
) -> Callable[[], float]:
    """Call-latency samples of ``fn``: the first is one call, and its latency sets the calls
    per sample of every later one (:func:`latency_calls_for`)."""
    calls = 0

    def sample() -> float:
        nonlocal calls
        if calls:
            return latency_sample(timer, fn, flush, calls)
        first = latency_sample(timer, fn, flush)
        calls = latency_calls_for(first)
        return first

    return sample


def device_sample(
    timer: Timer,
    fn: Callable[[], object],
    launches: int = 1,
    flush: Callable[[], None] | None = None,
) -> float:
    """Per-launch device time of ``launches`` back-to-back calls of ``fn`` on an idle device
    (:func:`device_clock`); the cache flushed first in cold mode."""
    if flush is not None:
        flush()
    timer.synchronize()
    return float(device_clock(timer)(fn, launches))


def throughput_sample(timer: Timer, fn: Callable[[], object], launches: int) -> float:
    """Per-call time of ``launches`` calls of ``fn`` issued back to back with no gate (warm
    cache only: nothing can be flushed between back-to-back calls)."""
    timer.synchronize()
    return timer.time_ms(fn, launches)


def repeats_for(probe_ms: float, span_ms: float, *, lo: int = 1, hi: int) -> int:
    """Calls per sample so that one sample spans at least ``span_ms``, within [lo, hi].

    ``probe_ms`` is the per-call time of a probe; a probe too short to read (0, negative or not
    finite) gets ``hi``.
    """
    if not math.isfinite(probe_ms) or probe_ms <= 0.0:
        return hi
    ratio = span_ms / probe_ms  # inf for a subnormal probe: math.ceil(inf) would raise
    if ratio >= hi:
        return max(lo, hi)
    return max(lo, min(hi, math.ceil(ratio)))


def launches_for(first_ms: float) -> int:
    """Back-to-back launches per device-time sample, from one single-launch sample.

    1 unless the kernel is shorter than SHORT_KERNEL_MS; then enough launches for one sample to
    span DEVICE_SAMPLE_MIN_MS (at most MAX_LAUNCHES_PER_SAMPLE).
    """
    if math.isfinite(first_ms) and first_ms >= SHORT_KERNEL_MS:
        return 1
    return repeats_for(first_ms, DEVICE_SAMPLE_MIN_MS, hi=MAX_LAUNCHES_PER_SAMPLE)


def throughput_launches_for(latency_ms: float) -> int:
    """Calls per throughput sample: THROUGHPUT_MIN_LAUNCHES, or enough for one sample to span
    THROUGHPUT_SAMPLE_MIN_MS at one call's latency (at most MAX_LAUNCHES_PER_SAMPLE)."""
    return repeats_for(
        latency_ms, THROUGHPUT_SAMPLE_MIN_MS, lo=THROUGHPUT_MIN_LAUNCHES, hi=MAX_LAUNCHES_PER_SAMPLE
    )
