"""Console report of a bench run as rich renderables (the CLI prints them; the library never
does)."""

from __future__ import annotations

import math
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = [
    "LEGEND",
    "ORACLE_LEGEND",
    "format_ms",
    "graph_table",
    "summary_line",
    "oracle_summary_line",
]

# "*" marks any row warning (row_warnings): a capped sampling too, which "noisy or outlier"
# did not say; the oracle column is explained only where it is shown
LEGEND = (
    "kernel_med = median device time per launch; cov = stddev/mean of the samples; submit = host "
    "time of execute(); vs_best = best median of the rows not failed / row median; * = a row "
    "warning (noisy, outlier, capped sampling or a busy CPU; -v lists them)"
)
ORACLE_LEGEND = "; oracle = warm heuristic / tuned (same buffers, back to back)"


def format_ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if value < 1.0:
        return f"{value * 1e3:.2f} µs"
    if value < 1000.0:
        return f"{value:.3f} ms"
    return f"{value / 1e3:.2f} s"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def graph_table(graph: dict[str, Any], oracle: bool) -> Table:
    # escaped: Rich read an id such as [b4d170fc0a62] (or a name with "[") as a style tag
    title = escape(f"{graph.get('graph_name')}  [{graph.get('graph_id')}]")
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("engine", "verdict", "kernel_med", "cov", "submit", "TFLOP/s", "GB/s", "vs_best"):
        table.add_column(col, justify="left" if col in ("engine", "verdict") else "right")
    if oracle:
        table.add_column("oracle", justify="right")
    rows = graph.get("results", [])
    # a row that failed validation is never the best: a wrong answer made the correct rows
    # read 0.50x against it (it gets no vs_best of its own)
    medians = [r["kernel"]["median_ms"] for r in rows if r.get("kernel") and not _wrong(r)]
    best = min(medians) if medians else None
    for r in rows:
        k = r.get("kernel") or {}
        metrics = r.get("metrics") or {}
        med = k.get("median_ms")
        noisy = "*" if r.get("warnings") else ""
        cells = [
            escape(str((r.get("engine") or {}).get("name", "?"))),
            escape(str(r.get("verdict", "?"))),
            format_ms(med) + noisy,
            _num(k.get("cov"), ".3f"),
            format_ms((r.get("host") or {}).get("median_ms")),
            _num(metrics.get("tflops"), ".2f"),
            _num(metrics.get("gbps"), ".1f"),
            f"{best / med:.2f}x" if best and med and not _wrong(r) else "-",
        ]
        if oracle:
            cells.append(_oracle_cell(r))
        style = "red" if r.get("verdict") in ("error", "failed") else None
        table.add_row(*cells, style=style)
    return table


def _wrong(r: dict[str, Any]) -> bool:
    """The row's plan failed validation (its time is that of a wrong answer)."""
    return r.get("verdict") == "failed"


def _oracle_cell(r: dict[str, Any]) -> str:
    """The oracle column: the speedup, or why there is none. A row with nothing searched
    (one candidate: no knobs, or the budget skipped every variant) says so first: its delta
    compares the heuristic plan with itself."""
    delta, info = r.get("oracle_delta"), r.get("oracle")
    if isinstance(info, dict) and not info.get("tuning_available", True):
        return "not searched (budget)" if info.get("candidates_skipped_budget") else "no-search"
    if delta and delta.get("same_plan"):
        return "1.00x (kept)"
    if delta:
        return f"{delta['speedup']:.2f}x"
    if r.get("oracle_error"):
        return "failed"
    return "invalid" if info else "n/a"


def row_messages(graph: dict[str, Any]) -> list[Text]:
    out = []
    if graph.get("status") != "ok":
        out.append(Text(f"  {graph.get('status')}: {graph.get('message')}", style="yellow"))
    for r in graph.get("results", []):
        name = (r.get("engine") or {}).get("name")
        if r.get("message"):
            style = "yellow" if r.get("verdict") == "not_supported" else "red"
            out.append(Text(f"  {name}: {r['message']}", style=style))
        if r.get("oracle_error"):
            out.append(Text(f"  {name}: oracle failed: {r['oracle_error']}", style="yellow"))
    return out


def summary_line(summary: dict[str, Any]) -> str:
    return (
        f"Summary: {summary['graphs']} graph(s), {summary['rows']} row(s): {summary['passed']} "
        f"passed, {summary['unchecked']} unchecked, {summary['failed']} failed, "
        f"{summary['errors']} error(s), {summary.get('not_supported', 0)} not supported; "
        f"{summary['graph_errors']} graph error(s), "
        f"{summary['no_engine_graphs']} graph(s) without engines"
    )


def oracle_summary_line(summary: dict[str, Any]) -> str | None:
    oracle = summary.get("oracle")
    if not oracle:
        return None
    geo = oracle.get("geomean_speedup")
    geo_text = f"{geo:.3f}x" if geo else "n/a"
    line = (
        f"Oracle: {oracle['rows']} tuned row(s), geomean speedup {geo_text}; "
        f"{oracle['excluded']} row(s) excluded (no valid comparison)"
    )
    not_searched = oracle.get("not_searched") or 0
    if not_searched:
        budget = oracle.get("not_searched_budget") or 0
        line += f"; {not_searched} row(s) not searched (one candidate"
        line += f"; {budget} because the budget skipped the rest)" if budget else ")"
    return line
