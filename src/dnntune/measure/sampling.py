"""Steady sampling: warm up, settle, then take samples until there are enough.

Two shapes, both over callables that know nothing of engines or plans:

* :func:`steady_samples`: one thing timed on its own. Untimed warm-up calls (lazy compiles,
  allocator, clocks up), a synchronize so nothing queued before leaks into a sample, then
  samples until there are ``count`` of them and they add up to ``min_total_ms`` (at most
  ``max_count``), or until ``stop`` says enough.
* :func:`steady_sample`: one sample of a thing timed in turn with others (interleaved rounds,
  :mod:`~dnntune.measure.rounds`). Candidates timed in turn disturb each other (caches,
  allocator, library state), so each sample is preceded by :data:`RESAMPLE_WARM_RUNS` untimed
  runs of the same thing: the sample shows what a caller running only it gets, while the
  interleaving still spreads drift over every candidate alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RESAMPLE_WARM_RUNS", "Samples", "steady_sample", "steady_samples"]

#: untimed runs of a candidate before each of its interleaved samples
RESAMPLE_WARM_RUNS = 2


@dataclass
class Samples:
    """What :func:`steady_samples` took."""

    samples_ms: list[float] = field(default_factory=list)
    #: sampling stopped at ``max_count`` before the samples added up to ``min_total_ms``
    capped: bool = False


def steady_samples(
    sample: Callable[[], float],
    count: int,
    *,
    warm: Callable[[], object] | None = None,
    warm_runs: int = 0,
    synchronize: Callable[[], object] | None = None,
    min_total_ms: float = 0.0,
    max_count: int | None = None,
    stop: Callable[[list[float]], bool] | None = None,
) -> Samples:
    """Warm up, synchronize, then sample (raises what ``sample`` or ``warm`` raises).

    Args:
        sample: takes one sample, in milliseconds.
        count: samples to take at least (unless ``stop`` or ``max_count`` ends it sooner).
        warm: one untimed warm-up call (a run, or a sample whose value is dropped).
        warm_runs: how many warm-up calls.
        synchronize: called once between the warm-up and the first sample.
        min_total_ms: keep sampling until the samples add up to this much.
        max_count: never more samples than this (default: ``count``).
        stop: after each sample, True ends the sampling (an early abandonment).
    """
    if warm is not None:
        for _ in range(warm_runs):
            warm()
    if synchronize is not None:
        synchronize()
    cap = max(count, max_count if max_count is not None else count)
    out = Samples()
    total = 0.0
    while len(out.samples_ms) < count or total < min_total_ms:
        if len(out.samples_ms) >= cap:
            out.capped = total < min_total_ms
            break
        ms = sample()
        out.samples_ms.append(ms)
        total += ms
        if stop is not None and stop(out.samples_ms):
            break
    return out


def steady_sample(
    sample: Callable[[], float],
    warm: Callable[[], object],
    warm_runs: int = RESAMPLE_WARM_RUNS,
) -> float:
    """One sample taken in its own steady state: ``warm_runs`` untimed ``warm()`` calls of the
    same thing first, then ``sample()``."""
    for _ in range(warm_runs):
        warm()
    return sample()
