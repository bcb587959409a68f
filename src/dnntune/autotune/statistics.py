"""Timing statistics over one candidate's samples: min, mean, median, spread, robust mean.

Every function accepts an empty sequence and returns 0.0 rather than raising: a candidate that
produced no samples is reported with zeros and ``succeeded=False``, never with a crash.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_OUTLIER_Z",
    "TimingStats",
    "coefficient_of_variation",
    "mean",
    "median",
    "population_stddev",
    "robust_mean",
]

#: z threshold of the one-sided MAD outlier rule (MIOpen and hipDNN use 2.0)
DEFAULT_OUTLIER_Z = 2.0
#: 0.6745 is the 0.75 quantile of the standard normal: it scales MAD to a stddev estimate
_MAD_SCALE = 0.6745


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean, clamped to [min, max] so float rounding never leaves the sample range."""
    if not values:
        return 0.0
    m = math.fsum(values) / len(values)
    return min(max(m, min(values)), max(values))


def median(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def population_stddev(values: Sequence[float]) -> float:
    """Standard deviation dividing by N (RFC 0013 section 6.4), 0.0 for fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population stddev / mean; 0.0 when the mean is exactly zero (no division by zero)."""
    if not values:
        return 0.0
    m = math.fsum(values) / len(values)
    if m == 0.0:
        return 0.0
    return population_stddev(values) / abs(m)


def robust_mean(values: Sequence[float], z: float = DEFAULT_OUTLIER_Z) -> float:
    """Mean after dropping slow outliers: keep v with 0.6745 * (v - median) / MAD <= z.

    One-sided on purpose: a sample can be slowed by a preemption or a clock change but never
    made faster than the kernel, so only the slow tail is noise. With MAD == 0 (half or more
    of the samples identical) it is the plain mean.
    """
    if not values:
        return 0.0
    med = median(values)
    mad = median([abs(v - med) for v in values])
    if mad == 0.0:
        return mean(values)
    kept = [v for v in values if _MAD_SCALE * (v - med) / mad <= z]
    return mean(kept)


@dataclass(frozen=True)
class TimingStats:
    """Summary of one candidate's timed samples (milliseconds)."""

    count: int = 0
    min_ms: float = 0.0
    max_ms: float = 0.0
    mean_ms: float = 0.0
    median_ms: float = 0.0
    stddev_ms: float = 0.0
    cov: float = 0.0
    robust_mean_ms: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> TimingStats:
        if not samples:
            return cls()
        return cls(
            count=len(samples),
            min_ms=min(samples),
            max_ms=max(samples),
            mean_ms=mean(samples),
            median_ms=median(samples),
            stddev_ms=population_stddev(samples),
            cov=coefficient_of_variation(samples),
            robust_mean_ms=robust_mean(samples),
        )
