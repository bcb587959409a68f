"""Sample statistics for benchmark rows: every sample kept, nothing removed, spread reported."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SampleStats", "summarize", "percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default) of already sorted values."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


@dataclass(frozen=True)
class SampleStats:
    """Summary of timing samples in milliseconds. ``std_ms`` is the population stddev."""

    n: int
    mean_ms: float
    median_ms: float
    std_ms: float
    cov: float
    min_ms: float
    p25_ms: float
    p75_ms: float
    p95_ms: float | None
    max_ms: float
    iqr_ms: float

    @property
    def iqr_pct(self) -> float:
        return 100.0 * self.iqr_ms / self.median_ms if self.median_ms > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleStats:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def summarize(samples_ms: Sequence[float]) -> SampleStats:
    """Statistics of ``samples_ms``; the median is the usual (interpolated) median.

    Raises:
        ValueError: for an empty sample list.
    """
    if not samples_ms:
        raise ValueError("no samples to summarize")
    values = sorted(float(s) for s in samples_ms)
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    std = math.sqrt(var)
    p25, p75 = percentile(values, 25), percentile(values, 75)
    return SampleStats(
        n=n,
        mean_ms=mean,
        median_ms=percentile(values, 50),
        std_ms=std,
        cov=std / mean if mean > 0 else 0.0,
        min_ms=values[0],
        p25_ms=p25,
        p75_ms=p75,
        p95_ms=percentile(values, 95) if n >= 20 else None,
        max_ms=values[-1],
        iqr_ms=p75 - p25,
    )
