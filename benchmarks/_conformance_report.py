"""Results of ``benchmarks/conformance.py``: the JSON file, the markdown matrix, shard merging.

Every check is one record (case tags + engine + knobs + condition + outcome). The matrix counts
per (op, dtype, shape class) cell and engine: checked (ran and was compared), refused, wrong
(wrong outputs and errors). A record's ``status`` is ok, refused, wrong, error or skipped.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CONDITIONS = (
    "first_call",
    "after_100_launches",
    "autotune_candidate",
    "autotune_winner",
    "after_tuning",
    "new_process",
)
BAD = frozenset({"wrong", "error"})


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[conformance {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    c: Counter[str] = Counter(r["status"] for r in records)
    return {
        "checked": c["ok"] + c["wrong"] + c["error"],
        "ok": c["ok"],
        "refused": c["refused"],
        "wrong": c["wrong"] + c["error"],
        "skipped": c["skipped"],
    }


def _cell(records: list[dict[str, Any]]) -> str:
    if not records:
        return ""
    n = counts(records)
    text = f"{n['checked']}/{n['refused']}/{n['wrong']}"
    return f"**{text}**" if n["wrong"] else text


def _table(
    records: list[dict[str, Any]],
    rows: Sequence[tuple[str, ...]],
    row_keys: tuple[str, ...],
    col: str,
) -> list[str]:
    cols = sorted({r[col] for r in records}, key=_order)
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        grouped[(*(r[k] for k in row_keys), r[col])].append(r)
    lines = [
        "| " + " | ".join([*row_keys, *cols, "all"]) + " |",
        "|" + "---|" * (len(row_keys) + len(cols) + 1),
    ]
    for row in rows:
        cells = [_cell(grouped.get((*row, c), [])) for c in cols]
        every = [r for c in cols for r in grouped.get((*row, c), [])]
        if every:
            lines.append("| " + " | ".join([*row, *cells, _cell(every)]) + " |")
    return lines


_ORDER = {
    name: i
    for i, name in enumerate(
        (
            "tiny",
            "tail",
            "wide_row",
            "many_rows",
            "large",
            "fp32",
            "fp16",
            "bf16",
            *CONDITIONS,
        )
    )
}


def _order(name: str) -> tuple[int, str]:
    return (_ORDER.get(name, 1000), name)


def _shown(value: Any) -> Any:
    """``value`` with its floats rounded for reading (``0.8500000000000001`` -> 0.85, a share
    of 0.5844155844155844 -> 0.584; a float under 0.001 keeps 3 significant digits). The
    markdown only: results.json keeps the values as computed."""
    if isinstance(value, float):
        return round(value, 3) if abs(value) >= 1e-3 else float(f"{value:.3g}")
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(v) for v in value]
    return value


def render_markdown(result: dict[str, Any]) -> str:
    """The matrix: per engine, op x dtype rows, shape-class columns; cells checked/refused/wrong."""
    run = result["run"]
    records = result["records"]
    total = counts(records)
    lines = [
        "# dnntune conformance sweep",
        "",
        f"- command: `{run.get('command', '')}`",
        f"- machine: {json.dumps(_shown(run.get('machine', {})))}",
        f"- versions: {json.dumps(_shown(run.get('versions', {})))}",
        f"- cases: {run.get('cases', {})}",
        f"- coverage: {json.dumps(_shown(run.get('coverage', {})))}",
        f"- caps: {json.dumps(_shown(run.get('caps', {})))}",
        f"- wall time: {run.get('wall_s', 0):.0f} s (budget {run.get('time_budget_s')} s)",
        "",
        f"**Totals: {total['checked']} checked, {total['refused']} refused, "
        f"{total['wrong']} wrong (incl. errors), {total['skipped']} skipped.** "
        "Cells read checked/refused/wrong; bold when something is wrong.",
        "",
        "## By condition",
        "",
    ]
    by_engine = sorted({r["engine"] for r in records})
    lines += _table(records, [(e,) for e in by_engine], ("engine",), "condition")
    lines += ["", "## By layout", ""]
    ops = sorted({r["op"] for r in records})
    lines += _table(records, [(op,) for op in ops], ("op",), "layout")
    for engine in by_engine:
        mine = [r for r in records if r["engine"] == engine]
        rows = sorted({(r["op"], r["dtype"]) for r in mine}, key=lambda t: (t[0], _order(t[1])))
        lines += ["", f"## {engine}", ""]
        lines += _table(mine, rows, ("op", "dtype"), "shape_class")
    bad = [r for r in records if r["status"] in BAD]
    lines += ["", f"## Wrong outputs and errors ({len(bad)})", ""]
    for r in bad[:200]:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(r["knobs"].items())) or "default"
        lines.append(
            f"- `{r['name']}` {r['engine']} [{knobs}] {r['condition']}: {r['status']}: "
            f"{r['reason'][:300]}"
            + (f" (replay: `{r['failure_file']}`)" if r.get("failure_file") else "")
        )
    refusals: Counter[tuple[str, str]] = Counter(
        (r["engine"], r["reason"].split(":", 2)[-1].strip()[:120])
        for r in records
        if r["status"] == "refused"
    )
    lines += ["", "## Most common refusals", ""]
    for (engine, reason), n in refusals.most_common(25):
        lines.append(f"- {n} x {engine}: {reason}")
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "matrix.md").write_text(render_markdown(result))


def merge(paths: list[Path]) -> dict[str, Any]:
    """One result from shard results (records concatenated, runs listed)."""
    shards = [json.loads(p.read_text()) for p in paths]
    if not shards:
        raise ValueError("merge: no results files given")
    run = dict(shards[0]["run"])
    run["shards"] = [s["run"] for s in shards]
    run["wall_s"] = max(s["run"].get("wall_s", 0) for s in shards)
    coverage: Counter[str] = Counter()
    for s in shards:
        coverage.update(s["run"].get("coverage", {}))
    run["coverage"] = dict(coverage)
    run["cases"] = {
        "total": sum(s["run"].get("cases", {}).get("total", 0) for s in shards),
        "shards": [s["run"].get("shard") for s in shards],
    }
    run["command"] = "merge of: " + "; ".join(s["run"].get("command", "") for s in shards)
    records = [r for s in shards for r in s["records"]]
    return {"run": run, "records": records}
