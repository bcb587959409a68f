"""Results of a suite run: the summary (geomean ratios, ceilings, costs) and the two files.

``results.json`` holds everything measured (rows as ``_measure.measure_graph`` returns them);
``results.md`` is the table a reader wants: one row per graph with the four variants' medians,
the tuned plan's achieved rate against the measured ceiling, the speedups, what tuning and
compiling cost, and the warm start; then the targets of issue 11 with the measured values.

Ratios are speedups: ``vs eager = eager median / tuned median`` (above 1: tuned is faster).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _fmt import geomean
from _fmt import median_ms as _median
from _fmt import ms as _ms
from _report_tuning import tuning_lines, tuning_summary, tuning_table

__all__ = ["geomean", "render_markdown", "summarize_run", "summary_lines", "write_results"]

#: issue 11's targets
TARGET_VS_EAGER = 1.3
TARGET_FLOOR_VS_EAGER = 0.98
TARGET_VS_COMPILE = 1.1
TARGET_TUNING_COST = 0.5
TARGET_GEMM_CEILING = 0.85
TARGET_NORM_BANDWIDTH = 0.85
TARGET_WARM_START_MS = 50.0
#: GEMMs with at least this many FLOPs count as "large" for the ceiling target
LARGE_GEMM_FLOPS = 5e10


def ratio(row: dict[str, Any], mode: str, baseline: str, variant: str) -> float | None:
    """baseline median / variant median (above 1: ``variant`` is faster)."""
    b, v = _median(row, mode, baseline), _median(row, mode, variant)
    return b / v if b is not None and v is not None else None


def achieved(
    row: dict[str, Any], ceilings: dict[str, Any], mode: str, variant: str = "tuned"
) -> dict[str, float | None]:
    """TFLOP/s, GB/s and the fraction of the ceiling that bounds this graph."""
    ms = _median(row, mode, variant)
    if ms is None:
        return {"tflops": None, "gbps": None, "of_ceiling": None}
    tflops = row["flops"] / (ms * 1e-3) / 1e12
    gbps = row["io_bytes"] / (ms * 1e-3) / 1e9
    if row.get("bound") == "compute":
        frac = tflops / ceilings["gemm"]["tflops"]
    else:
        frac = gbps / ceilings["copy"]["gbps"]
    return {"tflops": tflops, "gbps": gbps, "of_ceiling": frac}


def _ok_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def _ratio_block(
    rows: list[dict[str, Any]], mode: str, baseline: str, variant: str
) -> dict[str, Any]:
    pairs = [(r["file"], ratio(r, mode, baseline, variant)) for r in rows]
    valid = [(f, x) for f, x in pairs if x is not None]
    worst = min(valid, key=lambda p: p[1]) if valid else None
    return {
        "geomean": geomean(x for _, x in valid),
        "graphs": len(valid),
        "min": None if worst is None else worst[1],
        "min_graph": None if worst is None else worst[0],
        "below_0_98": [f for f, x in valid if x < TARGET_FLOOR_VS_EAGER],
    }


def summarize_run(
    rows: list[dict[str, Any]], ceilings: dict[str, Any], modes: Iterable[str]
) -> dict[str, Any]:
    ok = _ok_rows(rows)
    modes = list(modes)
    summary: dict[str, Any] = {
        "graphs": len(rows),
        "measured": len(ok),
        "skipped": sum(1 for r in rows if r.get("status") == "skipped"),
        "errors": sum(1 for r in rows if r.get("status") == "error"),
        "ratios": {},
    }
    for mode in modes:
        summary["ratios"][mode] = {
            "tuned_vs_eager": _ratio_block(ok, mode, "eager", "tuned"),
            "tuned_vs_compile": _ratio_block(ok, mode, "compile", "tuned"),
            "heuristic_vs_eager": _ratio_block(ok, mode, "eager", "heuristic"),
            "tuned_vs_heuristic": _ratio_block(ok, mode, "heuristic", "tuned"),
            "compile_vs_eager": _ratio_block(ok, mode, "eager", "compile"),
        }
    # Tuning cost against max-autotune's compile cost, over graphs that have both.
    both = [
        r
        for r in ok
        if r["variants"]["tuned"].get("tuning_s") is not None and r["variants"]["compile"].get("ok")
    ]
    tuning = sum(r["variants"]["tuned"]["tuning_s"] for r in both)
    compiling = sum(r["variants"]["compile"]["compile_s"] for r in both)
    summary["cost"] = {
        "graphs": len(both),
        "tuning_s": tuning,
        "compile_s": compiling,
        "tuning_over_compile": tuning / compiling if compiling > 0 else None,
        "tuning_s_all_graphs": sum(r["variants"]["tuned"].get("tuning_s") or 0.0 for r in ok),
        "compile_s_all_graphs": sum(r["variants"]["compile"].get("compile_s") or 0.0 for r in ok),
    }
    warm = "warm" if "warm" in summary["ratios"] else next(iter(summary["ratios"]), "warm")
    gemms = [
        r
        for r in ok
        if r.get("category") == "gemm"
        and r.get("bound") == "compute"
        and r["flops"] >= LARGE_GEMM_FLOPS
    ]
    norms = [r for r in ok if r.get("category") == "norm"]
    summary["large_gemm_of_ceiling"] = _fractions(gemms, ceilings, warm)
    summary["norm_of_bandwidth"] = _fractions(norms, ceilings, warm)
    starts = [r["warm_start"] for r in ok if r.get("warm_start", {}).get("ok")]
    builds = sorted(s["build_ms"] for s in starts)
    if any(v in r.get("variants", {}) for r in ok for v in ("exhaustive", "heuristic_b")):
        summary["tuning"] = {mode: tuning_summary(rows, mode) for mode in modes}
    summary["warm_start"] = {
        "graphs": len(starts),
        "median_build_ms": builds[len(builds) // 2] if builds else None,
        "max_build_ms": builds[-1] if builds else None,
        "under_50_ms": sum(1 for b in builds if b < TARGET_WARM_START_MS),
        "picked_tuned": sum(1 for s in starts if s.get("picked_tuned")),
        "timed_spans": sum(int(s.get("timed_spans") or 0) for s in starts),
    }
    return summary


def _fractions(rows: list[dict[str, Any]], ceilings: dict[str, Any], mode: str) -> dict[str, Any]:
    values = {r["file"]: achieved(r, ceilings, mode)["of_ceiling"] for r in rows}
    valid = {f: v for f, v in values.items() if v is not None}
    return {
        "graphs": len(valid),
        "mean": sum(valid.values()) / len(valid) if valid else None,
        "min": min(valid.values()) if valid else None,
        "per_graph": valid,
    }


# ---- markdown -----------------------------------------------------------------------------------
def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _short(plan: str | None) -> str:
    if not plan:
        return "-"
    engine, _, knobs = plan.partition("[")
    engine = engine.removesuffix("_ENGINE")
    return f"{engine}*" if knobs else engine


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def _targets(summary: dict[str, Any], mode: str) -> list[str]:
    r = summary["ratios"].get(mode, {})
    te, tc = r.get("tuned_vs_eager", {}), r.get("tuned_vs_compile", {})
    cost, ws = summary["cost"], summary["warm_start"]
    gemm, norm = summary["large_gemm_of_ceiling"], summary["norm_of_bandwidth"]

    def ge(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target

    floor = te.get("min")
    share = cost["tuning_over_compile"]
    cheap = None if share is None else share <= TARGET_TUNING_COST
    warm_ok = None
    if ws["graphs"]:
        warm_ok = ws["under_50_ms"] == ws["graphs"] and ws["timed_spans"] == 0
    lines = [
        f"| target ({mode}) | measured | status |",
        "|---|---|---|",
        f"| tuned vs eager, geomean >= {TARGET_VS_EAGER}x | {_x(te.get('geomean'))} over "
        f"{te.get('graphs', 0)} graphs | {_met(ge(te.get('geomean'), TARGET_VS_EAGER))} |",
        f"| no graph below {TARGET_FLOOR_VS_EAGER}x vs eager | min {_x(floor)} "
        f"(`{te.get('min_graph') or '-'}`); {len(te.get('below_0_98', []))} below | "
        f"{_met(ge(floor, TARGET_FLOOR_VS_EAGER))} |",
        f"| tuned vs max-autotune, geomean >= {TARGET_VS_COMPILE}x | {_x(tc.get('geomean'))} over "
        f"{tc.get('graphs', 0)} graphs | {_met(ge(tc.get('geomean'), TARGET_VS_COMPILE))} |",
        f"| tuning wall time <= {TARGET_TUNING_COST}x max-autotune compile time | "
        f"{cost['tuning_s']:.1f} s vs {cost['compile_s']:.1f} s "
        f"({_x(cost['tuning_over_compile'])}) over {cost['graphs']} graphs | "
        f"{_met(cheap)} |",
        f"| large GEMMs (>= {LARGE_GEMM_FLOPS / 1e9:g} GFLOP) >= {_pct(TARGET_GEMM_CEILING)} of "
        f"the bf16 ceiling | mean "
        f"{_pct(gemm['mean'])}, min {_pct(gemm['min'])} over {gemm['graphs']} graphs | "
        f"{_met(ge(gemm['min'], TARGET_GEMM_CEILING))} |",
        f"| norms >= {_pct(TARGET_NORM_BANDWIDTH)} of copy bandwidth | mean {_pct(norm['mean'])}, "
        f"min {_pct(norm['min'])} over {norm['graphs']} graphs | "
        f"{_met(ge(norm['min'], TARGET_NORM_BANDWIDTH))} |",
        f"| warm start < {TARGET_WARM_START_MS:g} ms, no benchmarking | median "
        f"{_ms(ws['median_build_ms'])}, max {_ms(ws['max_build_ms'])}; {ws['under_50_ms']}/"
        f"{ws['graphs']} under; picked the tuned plan {ws['picked_tuned']}/{ws['graphs']}; "
        f"{ws['timed_spans']} timed spans | "
        f"{_met(warm_ok)} |",
    ]
    return lines


def _graph_table(rows: list[dict[str, Any]], ceilings: dict[str, Any], mode: str) -> list[str]:
    lines = [
        "| # | graph | category | bound | eager | max-autotune | heuristic | tuned | "
        "tuned rate | of ceiling | vs eager | vs max-autotune | vs heuristic | tune s | "
        "compile s | warm start | checked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        name = r["file"].removesuffix(".json")
        if r.get("status") != "ok":
            why = (r.get("error") or r.get("status", "")).replace("|", "/")
            lines.append(
                f"| {i} | `{name}` | {r.get('category', '-')} | - | "
                f"{r.get('status')}: {why[:80]} |" + " |" * 12
            )
            continue
        v = r["variants"]
        rate = achieved(r, ceilings, mode)
        if rate["tflops"] is None:
            shown = "-"
        elif r["bound"] == "compute":
            shown = f"{rate['tflops']:.3g} TFLOP/s"
        else:
            shown = f"{rate['gbps']:.3g} GB/s"
        ws = r.get("warm_start", {})
        if ws.get("ok"):
            warm = f"{ws['build_ms']:.1f} ms, {'= tuned' if ws.get('picked_tuned') else '!= tuned'}"
        else:
            warm = "failed"
        compile_s = v["compile"].get("compile_s")
        cells = [
            str(i),
            f"`{name}`",
            r["category"],
            r["bound"],
            _ms(_median(r, mode, "eager")),
            _ms(_median(r, mode, "compile")),
            f"{_ms(_median(r, mode, 'heuristic'))} {_short(v['heuristic'].get('plan'))}",
            f"{_ms(_median(r, mode, 'tuned'))} {_short(v['tuned'].get('plan'))}",
            shown,
            _pct(rate["of_ceiling"]),
            _x(ratio(r, mode, "eager", "tuned")),
            _x(ratio(r, mode, "compile", "tuned")),
            _x(ratio(r, mode, "heuristic", "tuned")),
            _s(v["tuned"].get("tuning_s")),
            _s(compile_s),
            warm,
            _checked(v),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _checked(variants: dict[str, dict[str, Any]]) -> str:
    """ "ok" when every variant that ran matched the reference; else which did not."""
    wrong = [name for name, info in variants.items() if info.get("verified") is False]
    unchecked = [
        name for name, info in variants.items() if info.get("ok") and info.get("verified") is None
    ]
    if wrong:
        return "WRONG: " + ", ".join(wrong)
    return "ok" if not unchecked else "unchecked: " + ", ".join(unchecked)


def _problems(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if r.get("status") == "skipped":
            continue
        if r.get("status") != "ok":
            lines.append(f"- `{r['file']}`: {r.get('error')}")
            continue
        for name, info in r["variants"].items():
            if info.get("error") and not str(info["error"]).startswith("skipped"):
                lines.append(f"- `{r['file']}` {name}: {info['error']}")
            elif info.get("verified") is False:
                lines.append(f"- `{r['file']}` {name}: wrong answer: {info.get('check')}")
        for mode, stats in r.get("timing", {}).items():
            for name, s in stats.items():
                if "error" in s:
                    lines.append(f"- `{r['file']}` {name} ({mode} timing): {s['error']}")
        ws = r.get("warm_start", {})
        if ws.get("error"):
            lines.append(f"- `{r['file']}` warm start: {ws['error']}")
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    env, ceilings, summary = doc["environment"], doc["ceilings"], doc["summary"]
    modes = doc["options"]["modes"]
    rows = doc["graphs"]
    lines = [
        "# dnntune performance suite",
        "",
        f"- date: {doc['started_at']} (finished {doc.get('finished_at') or 'not finished'})",
        f"- machine: {env.get('device_name')}; {env.get('hostname')}",
        f"- versions: torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, "
        f"triton {env.get('triton')}, cudnn-frontend {env.get('cudnn_frontend')}, "
        f"python {env.get('python')}, dnntune {env.get('dnntune')}",
        f"- command: `{doc['command']}`",
        f"- timing: median of {doc['options']['iters']} samples per variant "
        f"({doc['options'].get('timer', 'cuda_event')} timer; device time: one call per "
        "sample, its launches held behind a stall gate so host submit time stays outside; "
        "the host submit time is in results.json as host_median_ms) in "
        f"{doc['options']['rounds']} interleaved rounds, {doc['options']['warmup']} warmup "
        f"calls per round; cache modes {', '.join(modes)} (cold: L2 flushed before each sample)",
        "- tuning: `add_all_engines` + `add_suggested_variants`"
        + (
            " + knob variants (`tune --sweep-knobs`)"
            if doc["options"].get("tune_sweep_knobs")
            else ""
        )
        + f" + `autotune` ({_tune_settings(doc['options'])}); max-autotune = "
        '`torch.compile(eager, mode="max-autotune-no-cudagraphs")`',
        f"- ceilings: {ceilings['gemm']['what']}: **{ceilings['gemm']['tflops']:.4g} TFLOP/s**; "
        f"{ceilings['copy']['what']}: **{ceilings['copy']['gbps']:.4g} GB/s**; ridge "
        f"{ceilings['ridge_flop_per_byte']:.0f} FLOP/B (graphs below it are memory-bound and "
        "rated in GB/s against the copy bandwidth, the rest in TFLOP/s against the GEMM rate)",
        f"- graphs: {summary['graphs']} ({summary['measured']} measured, {summary['skipped']} "
        f"skipped, {summary['errors']} errors); wall time {doc.get('wall_s', 0):.0f} s",
        "",
        "Speedups are baseline median / tuned median: above 1.00x the tuned plan is faster.",
        "",
        "## Targets (issue 11)",
        "",
    ]
    for mode in modes:
        lines += [*_targets(summary, mode), ""]
    lines += [
        "## Summary",
        "",
        "| ratio (geomean) | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for key, label in [
        ("tuned_vs_eager", "tuned vs eager"),
        ("tuned_vs_compile", "tuned vs max-autotune"),
        ("heuristic_vs_eager", "heuristic vs eager"),
        ("tuned_vs_heuristic", "tuned vs heuristic"),
        ("compile_vs_eager", "max-autotune vs eager"),
    ]:
        cells = []
        for mode in modes:
            block = summary["ratios"][mode][key]
            cells.append(f"{_x(block['geomean'])} (n={block['graphs']}, min {_x(block['min'])})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cost = summary["cost"]
    lines += [
        "",
        f"Cost: tuning {cost['tuning_s_all_graphs']:.1f} s over all measured graphs; "
        f"max-autotune compile {cost['compile_s_all_graphs']:.1f} s over the graphs it compiled.",
        "",
    ]
    for mode, block in summary.get("tuning", {}).items():
        lines += [*tuning_lines(block, mode), *tuning_table(rows, mode), ""]
    for mode in modes:
        lines += [f"## Per graph ({mode})", "", *_graph_table(rows, ceilings, mode), ""]
    problems = _problems(rows)
    skipped = [r["file"] for r in rows if r.get("status") == "skipped"]
    if skipped:
        lines += ["## Skipped (time budget)", "", ", ".join(f"`{f}`" for f in skipped), ""]
    if problems:
        lines += ["## Errors and mismatches", "", *problems, ""]
    lines += _sources(rows)
    return "\n".join(lines)


def _tune_settings(options: dict[str, Any]) -> str:
    metric = options.get("tune_ranking_metric", "latency")
    if options.get("tune_defaults"):
        text = f"STANDARD, AutotuneConfig's defaults, ranking metric {metric}, verify on"
    else:
        text = (
            f"STANDARD, RUN_UNTIL_STABLE, ranking metric {metric}, warmup "
            f"{options['tune_warmup']}, max {options['tune_max_iters']} iterations, verify on"
        )
    if options.get("exhaustive"):
        text += "; EXHAUSTIVE the same in TuneMode.EXHAUSTIVE, after it"
    return text


def _sources(rows: list[dict[str, Any]]) -> list[str]:
    """The eager baseline of every graph, so a reader can see what "eager" means."""
    blocks = []
    for r in rows:
        source = r.get("variants", {}).get("eager", {}).get("source")
        if source:
            blocks += [f"`{r['file']}`:", "```python", source.rstrip(), "```", ""]
    if not blocks:
        return []
    return [
        "## Eager baselines",
        "",
        "<details><summary>the PyTorch code timed as eager (and compiled as max-autotune)"
        "</summary>",
        "",
        *blocks,
        "</details>",
        "",
    ]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_results(out: Path, doc: dict[str, Any]) -> None:
    """Write results.json and results.md under ``out`` (atomically, each)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("results.json", json.dumps(_jsonable(doc), indent=1) + "\n"),
        ("results.md", render_markdown(doc) + "\n"),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The run's summary for the console, a line per cache mode: the ratios, then issue 25's
    comparison where it was measured."""
    lines = []
    for mode, ratios in summary["ratios"].items():
        te, tc = ratios["tuned_vs_eager"], ratios["tuned_vs_compile"]
        he = ratios["heuristic_vs_eager"]
        lines.append(
            f"{mode}: tuned vs eager {_x(te['geomean'])} (n={te['graphs']}, min "
            f"{_x(te['min'])}); tuned vs max-autotune {_x(tc['geomean'])} "
            f"(n={tc['graphs']}); heuristic vs eager {_x(he['geomean'])}"
        )
    for mode, block in summary.get("tuning", {}).items():
        cost, kept, ba = block["cost"], block["kept"], block["b_vs_a"]
        lat = block.get("b_vs_a_latency") or {"graphs": 0}
        on_latency = (
            f"; where they differ, on call latency {_x(lat['geomean'])} "
            f"(n={lat['graphs']}), {len(lat['worse'])} worse"
            if lat["graphs"]
            else ""
        )
        lines.append(
            f"{mode}: default tuning {cost['tuning_s']:.1f} s vs max-autotune compile "
            f"{cost['compile_s']:.1f} s ({_x(cost['ratio'])}); default vs heuristic "
            f"{_x(kept['tuned_vs_heuristic'])}, EXHAUSTIVE "
            f"{_x(kept['exhaustive_vs_heuristic'])} (n={kept['graphs']}); B vs A "
            f"{_x(ba['geomean'])}, {len(ba['worse'])} worse{on_latency}"
        )
    return lines
