"""What the suite's reports share (``_report.py``, ``_report_tuning.py``): a row's median, the
geometric mean and the time format."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["geomean", "median_ms", "ms"]


def geomean(values: Iterable[float | None]) -> float | None:
    """The geometric mean of the positive finite ``values`` (None when there are none)."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def median_ms(row: dict[str, Any], mode: str, variant: str) -> float | None:
    """A variant's timed median in ``mode`` from a suite row (None: not timed)."""
    value = row.get("timing", {}).get(mode, {}).get(variant, {}).get("median_ms")
    return float(value) if value is not None and value > 0 else None


def ms(value: float | None) -> str:
    """A time in milliseconds as a reader wants it: µs below 1 ms, "-" when missing."""
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} us" if value < 1 else f"{value:.3f} ms"
