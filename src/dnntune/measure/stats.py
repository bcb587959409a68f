"""The one statistics type of every timing in the project: :class:`SampleStats`.

Every sample is kept and summarized, nothing removed: count, min, max, mean, median, population
stddev, coefficient of variation, quartiles (p95 from 20 samples on), and the mean after
dropping slow outliers (:func:`robust_mean`). Autotune fills ``AutotuneResult`` from it, bench
writes it into ``results.json`` (:meth:`SampleStats.to_dict`, whose keys are that file's), plan
timing returns it.

The helper functions accept an empty sequence and return 0.0 rather than raising: a candidate
that produced no samples is reported with zeros and ``succeeded=False``, never with a crash.
:func:`summarize` is the strict form for callers that must have samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_OUTLIER_Z",
    "SampleStats",
    "coefficient_of_variation",
    "mean",
    "median",
    "percentile",
    "population_stddev",
    "robust_mean",
    "summarize",
]

#: z threshold of the one-sided MAD outlier rule (MIOpen and hipDNN use 2.0)
DEFAULT_OUTLIER_Z = 2.0
#: 0.6745 is the 0.75 quantile of the standard normal: it scales MAD to a stddev estimate
_MAD_SCALE = 0.6745
#: fewer samples than this have no meaningful 95th percentile (``p95_ms`` is None)
_P95_MIN_SAMPLES = 20


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean, clamped to [min, max] so float rounding never leaves the sample range."""
    if not values:
        return 0.0
    m = math.fsum(values) / len(values)
    return min(max(m, min(values)), max(values))


def median(values: Sequence[float]) -> float:
    """The usual median (mean of the two middle values for an even count); 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default) of already sorted values (NaN when
    empty)."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    # on a sample point, or between equal ones, that value: interpolating would turn an
    # infinite neighbour into 0 * inf = NaN
    if frac == 0.0 or a == b:
        return a
    return a * (1 - frac) + b * frac


def population_stddev(values: Sequence[float]) -> float:
    """Standard deviation dividing by N (RFC 0013 section 6.4), 0.0 for fewer than 2 values
    and for identical values (whose mean ``fsum / n`` need not round back to the value)."""
    if len(values) < 2 or min(values) == max(values):
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


#: SampleStats field -> its key in a bench results file (``to_dict`` / ``from_dict``), in the
#: file's order; the file predates the merge of bench's and autotune's statistics types
_FILE_KEYS: dict[str, str] = {
    "count": "n",
    "mean_ms": "mean_ms",
    "median_ms": "median_ms",
    "stddev_ms": "std_ms",
    "cov": "cov",
    "min_ms": "min_ms",
    "p25_ms": "p25_ms",
    "p75_ms": "p75_ms",
    "p95_ms": "p95_ms",
    "max_ms": "max_ms",
    "iqr_ms": "iqr_ms",
}


@dataclass(frozen=True)
class SampleStats:
    """Summary of timing samples in milliseconds; ``stddev_ms`` is the population stddev."""

    count: int = 0
    min_ms: float = 0.0
    max_ms: float = 0.0
    mean_ms: float = 0.0
    median_ms: float = 0.0
    stddev_ms: float = 0.0
    cov: float = 0.0
    #: mean after dropping slow outliers (:func:`robust_mean`)
    robust_mean_ms: float = 0.0
    p25_ms: float = 0.0
    p75_ms: float = 0.0
    #: None below 20 samples
    p95_ms: float | None = None
    iqr_ms: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> SampleStats:
        """Statistics of ``samples`` (milliseconds); all zeros when there are none."""
        if not samples:
            return cls()
        values = sorted(float(s) for s in samples)
        p25, p75 = percentile(values, 25), percentile(values, 75)
        return cls(
            count=len(values),
            min_ms=values[0],
            max_ms=values[-1],
            mean_ms=mean(values),
            median_ms=median(values),
            stddev_ms=population_stddev(values),
            cov=coefficient_of_variation(values),
            robust_mean_ms=robust_mean(values),
            p25_ms=p25,
            p75_ms=p75,
            p95_ms=percentile(values, 95) if len(values) >= _P95_MIN_SAMPLES else None,
            iqr_ms=p75 - p25,
        )

    @property
    def n(self) -> int:
        """``count`` under its name in bench results files."""
        return self.count

    @property
    def std_ms(self) -> float:
        """``stddev_ms`` under its name in bench results files."""
        return self.stddev_ms

    @property
    def iqr_pct(self) -> float:
        """The interquartile range in percent of the median (NaN when the median is not > 0)."""
        return 100.0 * self.iqr_ms / self.median_ms if self.median_ms > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The bench results file's statistics object (keys ``n``, ``mean_ms``, ``median_ms``,
        ``std_ms``, ``cov``, ``min_ms``, ``p25_ms``, ``p75_ms``, ``p95_ms``, ``max_ms``,
        ``iqr_ms``)."""
        return {key: getattr(self, name) for name, key in _FILE_KEYS.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleStats:
        """Read :meth:`to_dict`'s object back (``robust_mean_ms`` is not in it: 0.0)."""
        return cls(**{name: data[key] for name, key in _FILE_KEYS.items()})


def summarize(samples_ms: Sequence[float]) -> SampleStats:
    """:meth:`SampleStats.of` for callers that must have samples.

    Raises:
        ValueError: for an empty sample list.
    """
    if not samples_ms:
        raise ValueError("no samples to summarize")
    return SampleStats.of(samples_ms)
