"""Issue 25's comparison in a suite run: the default tune against EXHAUSTIVE and max-autotune,
and HeuristicMode.B against A, from the rows ``_measure.measure_graph`` returns when
``run.py`` ran with ``--exhaustive`` and ``--heuristic-b``.

- **Tuning cost**: the default tune's wall time over max-autotune's compile time, summed over
  the graphs that have both (target: at most 0.25x).
- **Speedup kept**: per graph the heuristic plan's median over the default tune's (``s_t``) and
  over the EXHAUSTIVE tune's (``s_e``), timed side by side in the same interleaved rounds.
  ``kept`` is the share of EXHAUSTIVE's geomean gain that the default tune has,
  ``log(geomean s_t) / log(geomean s_e)`` (target: at least 95 %); where EXHAUSTIVE gains
  nothing there is no gain to keep and the share is not defined. The plain ratio of the two
  geomeans is given too.
- **B against A**: per graph A's median over B's; a graph where both picked the same plan is
  "same plan" whatever the timing noise says; otherwise worse or better beyond
  :data:`NOISE` (target: none worse, geomean above 1). Where the two plans differ, they are also
  timed side by side on call latency (``latency_b_vs_a``: the clock B's labels are timed on and
  ``dnntune tune`` ranks on by default), reported beside the target's clock.
"""

from __future__ import annotations

import math
from typing import Any

from _fmt import geomean as _geomean
from _fmt import median_ms as _median
from _fmt import ms as _ms

__all__ = ["NOISE", "TARGET_KEPT", "TARGET_TUNING_COST", "tuning_lines", "tuning_summary"]

TARGET_TUNING_COST = 0.25
TARGET_KEPT = 0.95
#: a B/A ratio within this of 1.00 is a tie (the interleaved medians' run-to-run spread)
NOISE = 0.02


def tuning_summary(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The three comparisons over the measured rows (``None`` where nothing to compare)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    return {
        "cost": _cost(ok),
        "kept": _kept(ok, mode),
        "b_vs_a": _b_vs_a(ok, mode),
        "b_vs_a_latency": _b_vs_a_latency(ok),
    }


def _cost(rows: list[dict[str, Any]]) -> dict[str, Any]:
    both = [
        r
        for r in rows
        if r["variants"]["tuned"].get("tuning_s") is not None and r["variants"]["compile"].get("ok")
    ]
    tuning = sum(r["variants"]["tuned"]["tuning_s"] for r in both)
    compiling = sum(r["variants"]["compile"]["compile_s"] for r in both)
    exhaustive = [r["variants"].get("exhaustive", {}).get("tuning_s") for r in both]
    return {
        "graphs": len(both),
        "tuning_s": tuning,
        "compile_s": compiling,
        "exhaustive_s": sum(e for e in exhaustive if e is not None),
        "ratio": tuning / compiling if compiling > 0 else None,
        "per_graph_max": max((r["variants"]["tuned"]["tuning_s"] for r in both), default=None),
    }


def _kept(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    pairs: list[tuple[str, float, float]] = []
    for r in rows:
        h, t, e = (_median(r, mode, v) for v in ("heuristic", "tuned", "exhaustive"))
        if h is not None and t is not None and e is not None:
            pairs.append((r["file"], h / t, h / e))
    s_t = _geomean([p[1] for p in pairs])
    s_e = _geomean([p[2] for p in pairs])
    share = None
    if s_t is not None and s_e is not None and s_e > 1.0:
        share = math.log(s_t) / math.log(s_e)
    behind = sorted(pairs, key=lambda p: p[1] / p[2])[:5]
    return {
        "graphs": len(pairs),
        "tuned_vs_heuristic": s_t,
        "exhaustive_vs_heuristic": s_e,
        "ratio": s_t / s_e if s_t is not None and s_e is not None else None,
        "share": share,
        "most_behind": [{"file": f, "tuned": a, "exhaustive": b} for f, a, b in behind],
    }


def _b_vs_a(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    same, better, worse, tied, ratios = [], [], [], [], []
    for r in rows:
        a_info, b_info = r["variants"]["heuristic"], r["variants"].get("heuristic_b", {})
        a, b = _median(r, mode, "heuristic"), _median(r, mode, "heuristic_b")
        if a is None or b is None:
            continue
        if a_info.get("plan") == b_info.get("plan"):
            same.append(r["file"])
            ratios.append(1.0)  # one plan: any difference is the timing's noise
            continue
        x = a / b
        ratios.append(x)
        entry = {"file": r["file"], "ratio": x, "a": a_info.get("plan"), "b": b_info.get("plan")}
        if x < 1.0 - NOISE:
            worse.append(entry)
        elif x > 1.0 + NOISE:
            better.append(entry)
        else:
            tied.append(entry)
    return {
        "graphs": len(ratios),
        "geomean": _geomean(ratios),
        "same_plan": len(same),
        "better": better,
        "worse": worse,
        "tied": tied,
    }


def _b_vs_a_latency(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A's over B's call latency on the graphs where their plans differ (``latency_b_vs_a``)."""
    worse, ratios = [], []
    for r in rows:
        pair = r.get("latency_b_vs_a") or {}
        a = pair.get("heuristic", {}).get("median_ms")
        b = pair.get("heuristic_b", {}).get("median_ms")
        if not a or not b:
            continue
        x = a / b
        ratios.append(x)
        if x < 1.0 - NOISE:
            worse.append({"file": r["file"], "ratio": x})
    return {"graphs": len(ratios), "geomean": _geomean(ratios), "worse": worse}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def tuning_lines(summary: dict[str, Any], mode: str) -> list[str]:
    """The markdown section: the three targets, then what is behind each."""
    cost, kept, ba = summary["cost"], summary["kept"], summary["b_vs_a"]
    cheap = None if cost["ratio"] is None else cost["ratio"] <= TARGET_TUNING_COST
    share = kept["share"]
    kept_ok = None if share is None else share >= TARGET_KEPT
    b_ok = None
    if ba["graphs"]:
        b_ok = not ba["worse"] and (ba["geomean"] or 0.0) > 1.0
    share_text = "-" if share is None else f"{100 * share:.0f} %"
    lines = [
        f"## Issue 25: default tuning against EXHAUSTIVE and max-autotune; B against A ({mode})",
        "",
        "| target | measured | status |",
        "|---|---|---|",
        f"| default tuning <= {TARGET_TUNING_COST}x max-autotune compile | "
        f"{cost['tuning_s']:.1f} s vs {cost['compile_s']:.1f} s ({_x(cost['ratio'])}) over "
        f"{cost['graphs']} graphs; EXHAUSTIVE {cost['exhaustive_s']:.1f} s | {_met(cheap)} |",
        f"| default keeps >= {TARGET_KEPT:.0%} of EXHAUSTIVE's speedup over the heuristic | "
        f"{share_text} (default {_x(kept['tuned_vs_heuristic'])}, EXHAUSTIVE "
        f"{_x(kept['exhaustive_vs_heuristic'])}, ratio {_x(kept['ratio'])}) over "
        f"{kept['graphs']} graphs | {_met(kept_ok)} |",
        f"| B without tuning >= A on every graph, better on geomean | geomean "
        f"{_x(ba['geomean'])} over {ba['graphs']} graphs: {ba['same_plan']} same plan, "
        f"{len(ba['better'])} better, {len(ba['tied'])} within {NOISE:.0%}, "
        f"{len(ba['worse'])} worse | {_met(b_ok)} |",
        "",
    ]
    if kept["most_behind"]:
        lines.append("Default tune furthest behind EXHAUSTIVE (speedups over the heuristic):")
        lines.append("")
        for e in kept["most_behind"]:
            lines.append(
                f"- `{e['file']}`: default {_x(e['tuned'])}, EXHAUSTIVE {_x(e['exhaustive'])}"
            )
        lines.append("")
    lat = summary.get("b_vs_a_latency")
    if lat and lat["graphs"]:
        worse = ", ".join(f"`{e['file']}` {_x(e['ratio'])}" for e in lat["worse"]) or "none"
        lines += [
            f"On call latency (the clock B's labels are timed on, `dnntune tune`'s default), "
            f"where B's plan is not A's: A / B geomean {_x(lat['geomean'])} over "
            f"{lat['graphs']} graphs; worse beyond {NOISE:.0%}: {worse}.",
            "",
        ]
    for label, entries in (("B worse than A", ba["worse"]), ("B better than A", ba["better"])):
        if entries:
            lines += [f"{label} (A median / B median):", ""]
            lines += [f"- `{e['file']}`: {_x(e['ratio'])} ({e['a']} -> {e['b']})" for e in entries]
            lines.append("")
    return lines


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _plan(info: dict[str, Any]) -> str:
    plan = info.get("plan")
    if not plan:
        return "-"
    engine, _, knobs = str(plan).partition("[")
    return engine.removesuffix("_ENGINE") + ("*" if knobs else "")


def tuning_table(rows: list[dict[str, Any]], mode: str) -> list[str]:
    """Per graph: the four dnntune plans' medians and engines, and the three costs."""
    lines = [
        "EXHAUSTIVE s is the EXHAUSTIVE tune's wall time after the default tune in the same "
        "process (what that compiled is reused), not a first-run cost.",
        "",
        "| graph | heuristic A | heuristic B | default tune | EXHAUSTIVE | default vs A | "
        "EXHAUSTIVE vs A | B vs A | tune s | EXHAUSTIVE s | max-autotune compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") == "ok":
            lines.append(_table_row(r, mode))
    return lines


def _table_row(r: dict[str, Any], mode: str) -> str:
    v = r["variants"]

    def cell(name: str) -> str:
        return f"{_ms(_median(r, mode, name))} {_plan(v.get(name, {}))}"

    def speedup(name: str) -> str:
        if name == "heuristic_b" and v.get(name, {}).get("plan") == v["heuristic"].get("plan"):
            return "same plan"
        a, x = _median(r, mode, "heuristic"), _median(r, mode, name)
        return "-" if a is None or x is None else _x(a / x)

    compile_s = v["compile"].get("compile_s") if v["compile"].get("ok") else None
    cells = [
        f"`{r['file'].removesuffix('.json')}`",
        cell("heuristic"),
        cell("heuristic_b"),
        cell("tuned"),
        cell("exhaustive"),
        speedup("tuned"),
        speedup("exhaustive"),
        speedup("heuristic_b"),
        _s(v["tuned"].get("tuning_s")),
        _s(v.get("exhaustive", {}).get("tuning_s")),
        _s(compile_s),
    ]
    return "| " + " | ".join(cells) + " |"
