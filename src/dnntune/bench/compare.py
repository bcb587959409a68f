"""``dnntune bench compare A.json B.json``: per-row speedups with a noise-aware threshold.

speedup = A median / B median (> 1: B is faster). A change counts only when it exceeds
``max(threshold, 2 * sqrt(rA^2 + rB^2))`` where r = IQR / median of each side, so noisy rows
need a bigger change to be called a regression or an improvement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dnntune.errors import InvalidValueError

__all__ = ["CompareRow", "compare_results"]


@dataclass(frozen=True)
class CompareRow:
    graph: str
    engine: str
    a_median_ms: float
    b_median_ms: float
    speedup: float
    noise_pct: float
    verdict: str  # "faster" | "slower" | "within noise"


_Index = dict[tuple[str, str], tuple[str, dict[str, Any]]]


def _index(data: dict[str, Any], metric: str) -> _Index:
    out: _Index = {}
    for g in data.get("graphs", []):
        for r in g.get("results", []):
            stats = r.get(metric)
            if r.get("status") != "success" or not stats:
                continue
            key = (
                str(g.get("graph_id") or g.get("graph_name")),
                str((r.get("engine") or {}).get("id")),
            )
            out[key] = (g.get("graph_name"), r)
    return out


def compare_results(
    a: dict[str, Any], b: dict[str, Any], threshold_pct: float = 5.0, metric: str = "kernel"
) -> list[CompareRow]:
    """Compare two loaded results files row by row (rows present in both).

    Raises:
        InvalidValueError: when the cache modes differ (not comparable) or metric is unknown.
    """
    if metric not in ("kernel", "host"):
        raise InvalidValueError(f"--metric must be kernel or host, got {metric!r}")
    mode_a = a.get("run", {}).get("config", {}).get("cache_mode")
    mode_b = b.get("run", {}).get("config", {}).get("cache_mode")
    if mode_a != mode_b:
        raise InvalidValueError(
            f"results were measured with different cache modes ({mode_a} vs {mode_b}); "
            "re-run both with the same --cache-mode"
        )
    ia, ib = _index(a, metric), _index(b, metric)
    rows = []
    for key in sorted(set(ia) & set(ib), key=str):
        name, ra = ia[key]
        _, rb = ib[key]
        sa, sb = ra[metric], rb[metric]
        ma, mb = sa["median_ms"], sb["median_ms"]
        if not ma or not mb:
            continue
        r_a = sa["iqr_ms"] / ma if ma else 0.0
        r_b = sb["iqr_ms"] / mb if mb else 0.0
        noise = max(threshold_pct / 100.0, 2 * math.sqrt(r_a**2 + r_b**2))
        speedup = ma / mb
        change = speedup - 1.0
        verdict = "within noise" if abs(change) <= noise else ("faster" if change > 0 else "slower")
        rows.append(CompareRow(name, ra["engine"]["name"], ma, mb, speedup, 100 * noise, verdict))
    return rows
