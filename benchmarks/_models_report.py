"""What ``benchmarks/models.py`` writes: the markdown table with its notes and the targets'
summary lines, the progress line of each model, ``models.json`` and its versions.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import torch
from _models_run import VARIANTS
from _models_zoo import Setting

import dnntune

#: the issue's targets for cuda_graph="auto"
TARGET_GEOMEAN_OVER_EAGER_GRAPH = 1.15
TARGET_COMPILE_TIME_SHARE = 0.1


def versions(s: Setting) -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "torchvision", "timm", "transformers", "dnntune"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["dnntune_commit"] = _git_commit()
    # the package that ran (benchmarks/ab_trees.sh checks it is the tree it meant)
    found["dnntune_path"] = str(Path(dnntune.__file__).resolve().parent)
    found["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    found["device"] = (
        torch.cuda.get_device_name(s.device)
        if s.device.type == "cuda"
        else (platform.processor() or platform.machine())
    )
    return found


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout.strip()
    return None


def _fmt_cell(cell: dict[str, Any] | None, variant: str) -> str:
    if not cell:
        return "-"
    status = cell.get("status")
    if status == "n/a":
        return "not capturable" if "not capturable" in cell["reason"] else "n/a"
    if status != "ok" or "median_ms" not in cell:
        return "not timed" if status == "ok" else str(status)
    if variant == "eager" or "speedup" not in cell:  # (no eager time: this one's own)
        text = f"{cell['median_ms']:.3f}" + ("" if variant == "eager" else " ms")
    else:
        text = f"{cell['speedup']:.2f}x"
    extra = []
    for key in ("compile_s", "tune_s"):
        if key in cell:
            extra.append(f"{cell[key]:.1f} s" if cell[key] < 10 else f"{cell[key]:.0f} s")
    if "tune_s" in cell:
        extra += ["reverted"] if cell.get("reverted") and variant != "dnntune_auto" else []
    if cell.get("choice"):
        extra.append(str(cell["choice"]))
    return f"{text} ({', '.join(extra)})" if extra else text


def _fmt_error(row: dict[str, Any]) -> str:
    cells = [(v, c) for v, c in row.get("variants", {}).items() if c and "pass" in c]
    if not cells:
        return "-"
    worst = max((c.get("max_abs_err", math.inf) for _, c in cells), default=0.0)
    failing = [v for v, c in cells if not c["pass"]]
    return f"{worst:.2g} " + (f"FAIL ({', '.join(failing)})" if failing else "ok")


def _ms(row: dict[str, Any], variant: str) -> float | None:
    cell = row.get("variants", {}).get(variant) or {}
    return cell.get("median_ms") if cell.get("status") == "ok" else None


def summary(rows: list[dict[str, Any]], variant: str = "dnntune_auto") -> dict[str, Any]:
    """The issue's targets for ``variant``: geomean over eager_graph, models where it is at
    least the best of eager and eager_graph, models where it is at least max-autotune's speed
    at <= 0.1x its compile time."""
    over_graph, best_misses, beat_compile, with_compile = [], [], [], 0
    measured = 0
    for row in rows:
        ms = _ms(row, variant)
        if ms is None:
            continue
        measured += 1
        graph, eager = _ms(row, "eager_graph"), _ms(row, "eager")
        if graph:
            over_graph.append(graph / ms)
        best = min(t for t in (eager, graph) if t) if eager or graph else None
        if best is not None and ms > best:
            best_misses.append(f"{row['model']} {best / ms:.2f}x")
        mat = _ms(row, "max_autotune")
        if mat:
            with_compile += 1
            tune_s = row["variants"][variant].get("tune_s", math.inf)
            compile_s = row["variants"]["max_autotune"].get("compile_s", 0.0)
            if ms <= mat and tune_s <= TARGET_COMPILE_TIME_SHARE * compile_s:
                beat_compile.append(row["model"])
    geomean = math.exp(statistics.fmean(map(math.log, over_graph))) if over_graph else None
    return {
        "variant": variant,
        "models": measured,
        "geomean_over_eager_graph": geomean,
        "models_with_eager_graph": len(over_graph),
        "at_least_best_of_eager_and_graph": measured - len(best_misses),
        "misses": best_misses,
        "beat_max_autotune_at_tenth_compile_time": beat_compile,
        "models_with_max_autotune": with_compile,
    }


def _summary_lines(found: dict[str, Any]) -> list[str]:
    v, n = found["variant"], found["models"]
    if not n:
        return [f"- {v}: measured on no model"]
    geo, best = found["geomean_over_eager_graph"], found["at_least_best_of_eager_and_graph"]
    beat = len(found["beat_max_autotune_at_tenth_compile_time"])
    with_c = found["models_with_max_autotune"]
    lines = []
    if geo is not None:
        met = "met" if geo >= TARGET_GEOMEAN_OVER_EAGER_GRAPH else "not met"
        lines.append(
            f"- {v}: geomean over eager_graph {geo:.3f}x on {found['models_with_eager_graph']} "
            f"model(s) (target >= {TARGET_GEOMEAN_OVER_EAGER_GRAPH}x: {met})"
        )
    lines.append(
        f"- {v}: >= max(eager, eager_graph) on {best}/{n} model(s) "
        f"(target all: {'met' if best == n else 'not met'})"
        + (f"; below on {', '.join(found['misses'])}" if found["misses"] else "")
    )
    if with_c:
        half = beat * 2 >= with_c
        lines.append(
            f"- {v}: >= max_autotune at <= {TARGET_COMPILE_TIME_SHARE}x its compile time on "
            f"{beat}/{with_c} model(s) (target half: {'met' if half else 'not met'})"
        )
    return lines


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table, the notes (reasons of cells that did not run) and the targets."""
    head = [
        "model",
        "eager ms",
        "eager_copy",
        "eager_graph",
        "eager_graph_clone",
        "compile",
        "max_autotune (compile s)",
        "dnntune (tune s, reverted?)",
        "dnntune_graph (tune s)",
        "dnntune_auto (tune s, choice)",
        "max err vs eager",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        if row.get("status") in ("skipped", "error", "timeout") and not row.get("variants"):
            lines.append(f"| {row['model']} | {row['status']} |" + " |" * (len(head) - 2))
            notes.append(f"- {row['model']}: {row['status']}: {row.get('reason', '')}")
            continue
        if row.get("status") not in (None, "ok"):
            notes.append(f"- {row['model']}: {row['status']}: {row.get('reason', '')}")
        cells = [_fmt_cell(row["variants"].get(v), v) for v in VARIANTS]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {_fmt_error(row)} |")
        for v, c in row["variants"].items():
            if c and c.get("status") != "ok" and not _plain_na(c):
                notes.append(f"- {row['model']} / {v}: {c['status']}: {c.get('reason', '')}")
    lines += [
        "",
        "Cells: speedup over eager (median ms per forward, interleaved rounds); n/a: CUDA only,"
        " or skipped by a flag.",
    ]
    if notes:
        lines += ["", *notes]
    lines += ["", "Targets (cuda_graph='auto'; dnntune_graph and dnntune for reference):"]
    for variant in ("dnntune_auto", "dnntune_graph", "dnntune"):
        lines += _summary_lines(summary(rows, variant))
    return "\n".join(lines)


def _plain_na(cell: dict[str, Any]) -> bool:
    """n/a for a reason the table's legend gives (no CUDA, a skip flag)."""
    reason = cell.get("reason", "")
    return cell.get("status") == "n/a" and (reason == "CUDA only" or reason.startswith("skipped"))


def progress(row: dict[str, Any], seconds: float) -> str:
    """The line printed as a model finishes (and the warnings its variants raised)."""
    if row.get("status") in ("skipped", "error", "timeout") and not row.get("variants"):
        return f"[models] {row['model']}: {row['status']}: {row.get('reason', '')}"
    parts = []
    for v, cell in row["variants"].items():
        if cell and not _plain_na(cell):
            unit = " ms" if v == "eager" and "median_ms" in cell else ""
            parts.append(f"{v} {_fmt_cell(cell, v)}{unit}")
    status = "" if row.get("status") == "ok" else f" [{row['status']}: {row.get('reason')}]"
    lines = [
        f"[models] {row['model']}: {', '.join(parts)}; max err {_fmt_error(row)}"
        f" ({seconds:.0f} s){status}"
    ]
    for v, cell in row["variants"].items():
        lines += [f"  warning ({v}): {w}" for w in (cell or {}).get("warnings", ())]
    return "\n".join(lines)


def write_json(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "models.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "models.json")
