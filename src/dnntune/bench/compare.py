"""``dnntune bench compare A.json B.json``: per-row speedups with a noise-aware threshold.

speedup = A median / B median (> 1: B is faster). Rows are compared on a ratio scale: the
change is ``d = ln(B median / A median)``, so a 30x slowdown (``d = +3.4``) and a 30x speedup
(``d = -3.4``) are equally far from "no change", and swapping A and B only flips the verdict.
The noise is judged on the same scale: each side's spread is ``s = ln(1 + IQR / median)``, and
a change counts only when ``|d| > max(ln(1 + threshold), 2 * sqrt(sA^2 + sB^2))``. Noisy rows
need a bigger ratio to be called a regression or an improvement, but no noise level turns a
large ratio into "within noise" merely because a difference ``A/B - 1`` cannot go below -1.
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
    #: the ratio a change must exceed either way to count, as a percentage (25.0: x1.25)
    noise_pct: float
    verdict: str  # "faster" | "slower" | "within noise"
    #: ln(B median / A median): > 0 when B is slower
    log_ratio: float = 0.0


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
        log_ratio = math.log(mb / ma)
        noise = max(math.log1p(threshold_pct / 100.0), 2 * math.hypot(_spread(sa), _spread(sb)))
        if abs(log_ratio) <= noise:
            verdict = "within noise"
        else:
            verdict = "slower" if log_ratio > 0 else "faster"
        rows.append(
            CompareRow(
                name,
                ra["engine"]["name"],
                ma,
                mb,
                ma / mb,
                100 * math.expm1(noise),
                verdict,
                log_ratio,
            )
        )
    return rows


def _spread(stats: dict[str, Any]) -> float:
    """One side's noise on the log scale: ln(1 + IQR / median)."""
    return math.log1p(max(float(stats.get("iqr_ms") or 0.0), 0.0) / stats["median_ms"])
