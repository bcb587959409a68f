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
import sys
from dataclasses import dataclass
from typing import Any

from dnntune.errors import InvalidValueError

__all__ = ["REGRESSIONS", "CompareRow", "compare_results"]


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
    #: ln(B median / A median): > 0 when B is slower; NaN where a side has no time (a row
    #: new, failed or missing in B), not 0, which would read "no change"
    log_ratio: float = math.nan


_Index = dict[tuple[str, str], tuple[str, dict[str, Any]]]
#: verdicts that fail the comparison (exit 1)
REGRESSIONS = frozenset({"slower", "failed in B", "missing in B"})


def _index(data: dict[str, Any], metric: str) -> tuple[_Index, dict[tuple[str, str], str]]:
    """(rows with a usable ``metric`` median, keyed by (graph id, engine id); every row's key
    with its graph name, including failed ones and graph-level errors' engines when named)."""
    timed: _Index = {}
    seen: dict[tuple[str, str], str] = {}
    try:
        for g in data.get("graphs", []):
            graph_key = str(g.get("graph_id") or g.get("graph_name"))
            for r in g.get("results", []):
                key = (graph_key, str((r.get("engine") or {}).get("id")))
                name = str(g.get("graph_name"))
                seen[key] = name
                stats = r.get(metric) or {}
                median = stats.get("median_ms")
                # a row that failed validation timed a wrong answer: no time to compare (it
                # was judged on its median, so a B that broke correctness passed the gate)
                failed = r.get("status") != "success" or r.get("verdict") == "failed"
                if failed or not _usable_ms(median):
                    continue
                timed[key] = (name, r)
    except (AttributeError, TypeError) as exc:
        raise InvalidValueError(f"not a dnntune bench results file ({exc})") from None
    return timed, seen


def compare_results(
    a: dict[str, Any], b: dict[str, Any], threshold_pct: float = 5.0, metric: str = "kernel"
) -> list[CompareRow]:
    """Compare two loaded results files row by row.

    Every row timed in A is judged: against B's row of the same graph and engine, or as
    "failed in B" (B's row is an error or has no usable median) or "missing in B" (B has no
    such row); both count as regressions. Rows only B timed are "new in B".

    Raises:
        InvalidValueError: when the cache modes differ (not comparable), the metric is
            unknown, the threshold is not a finite number >= 0, or a file is malformed.
    """
    if metric not in ("kernel", "host"):
        raise InvalidValueError(f"--metric must be kernel or host, got {metric!r}")
    if not (math.isfinite(threshold_pct) and threshold_pct >= 0):
        raise InvalidValueError(
            f"--threshold must be a finite percentage >= 0 (5 means x1.05), got {threshold_pct}"
        )
    mode_a, mode_b = _cache_mode(a), _cache_mode(b)
    if mode_a != mode_b:
        raise InvalidValueError(
            f"results were measured with different cache modes ({mode_a} vs {mode_b}); "
            "re-run both with the same --cache-mode"
        )
    (ia, _), (ib, seen_b) = _index(a, metric), _index(b, metric)
    rows = []
    nan = math.nan
    for key in sorted(set(ia) | set(ib), key=str):
        if key not in ia:
            name, rb = ib[key]
            mb = rb[metric]["median_ms"]
            rows.append(CompareRow(name, _engine(rb, key), nan, mb, nan, nan, "new in B"))
            continue
        name, ra = ia[key]
        ma = ra[metric]["median_ms"]
        if key not in ib:
            lost = "failed in B" if key in seen_b else "missing in B"
            rows.append(CompareRow(name, _engine(ra, key), ma, nan, nan, nan, lost))
            continue
        rb = ib[key][1]
        sa, sb = ra[metric], rb[metric]
        mb = sb["median_ms"]
        log_ratio = math.log(mb / ma)
        noise = max(math.log1p(threshold_pct / 100.0), 2 * math.hypot(_spread(sa), _spread(sb)))
        if abs(log_ratio) <= noise:
            verdict = "within noise"
        else:
            verdict = "slower" if log_ratio > 0 else "faster"
        rows.append(
            CompareRow(
                name,
                _engine(ra, key),
                ma,
                mb,
                ma / mb,
                100 * math.expm1(noise) if noise < _LOG_FLOAT_MAX else math.inf,
                verdict,
                log_ratio,
            )
        )
    return rows


#: the largest noise (on the log scale) whose factor a float holds; wider is infinite noise
_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def _usable_ms(value: Any) -> bool:
    """A time to compare: a JSON number a float holds, finite and > 0 (an integer too large
    for a float raised OverflowError out of ``bench compare``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:
        return False


def _cache_mode(data: dict[str, Any]) -> Any:
    """``run.config.cache_mode`` (None where absent); InvalidValueError where ``run`` or its
    ``config`` is not an object (it raised AttributeError, an internal error)."""
    run = data.get("run", {})
    config = run.get("config", {}) if isinstance(run, dict) else None
    if not isinstance(config, dict):
        raise InvalidValueError(
            "not a dnntune bench results file (run.config is not an object); compare the "
            "files `dnntune bench -o results.json` writes"
        )
    return config.get("cache_mode")


def _engine(row: dict[str, Any], key: tuple[str, str]) -> str:
    return str((row.get("engine") or {}).get("name") or key[1])


def _spread(stats: dict[str, Any]) -> float:
    """One side's noise on the log scale: ln(1 + IQR / median)."""
    iqr: Any = stats.get("iqr_ms")
    return math.log1p(float(iqr) / stats["median_ms"]) if _usable_ms(iqr) else 0.0
