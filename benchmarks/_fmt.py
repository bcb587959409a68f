"""Number formats the suite's reports share (``_report.py``, ``_report_tuning.py``)."""

from __future__ import annotations

__all__ = ["ms"]


def ms(value: float | None) -> str:
    """A time in milliseconds as a reader wants it: µs below 1 ms, "-" when missing."""
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} us" if value < 1 else f"{value:.3f} ms"
