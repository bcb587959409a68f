"""benchmarks/run.py on the CPU: the whole protocol on two small example graphs, and its parts.

The end-to-end tests go through the real entry point (``python benchmarks/run.py``) and check
the files it leaves under ``--out``; the unit tests cover graph selection and order, the time
budget, the compile deadline and the summary arithmetic.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "run.py"
EXAMPLES = REPO / "examples" / "graphs"
sys.path.insert(0, str(REPO / "benchmarks"))

from _report import geomean, render_markdown, summarize_run  # noqa: E402
from _variants import CompileTimeout, deadline  # noqa: E402

TWO_GRAPHS = "llama_rmsnorm,resnet50_maxpool3x3_s2"
COLUMNS = (
    "eager",
    "max-autotune",
    "heuristic",
    "tuned",
    "tuned rate",
    "of ceiling",
    "vs eager",
    "vs max-autotune",
    "tune s",
    "compile s",
    "warm start",
)


def _run(
    out: Path, *extra: str, timeout: float = 120, tmp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tmp is not None:  # the temporary folder the run makes its own cache folder in
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
    args = [sys.executable, str(RUN), "--device", "cpu", "--quick", "--suite", str(EXAMPLES)]
    return subprocess.run(
        [*args, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def test_run_cpu_quick_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tmp = tmp_path / "tmp"
    proc = _run(out, "--graphs", TWO_GRAPHS, "--skip-compile", "--engines", "TORCH_ENGINE", tmp=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ceilings:" in proc.stdout and "[2/2]" in proc.stdout
    # the run's own cache folder (made in TMPDIR) is removed when it ends: every run left one
    assert list(tmp.iterdir()) == []

    md = (out / "results.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| # | graph"))
    for column in COLUMNS:
        assert f"| {column} |" in header, column
    for needle in ("## Targets (issue 11)", "## Summary", "- command: `python ", "- machine:"):
        assert needle in md, needle
    assert "`llama_rmsnorm`" in md and "`resnet50_maxpool3x3_s2`" in md

    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is True
    assert Path(doc["options"]["cache_dir"]).parent == tmp
    # the tuner ranks on the clock the table reports (equal conditions)
    assert doc["options"]["tune_ranking_metric"] == "device"
    assert "ranking metric device" in md and "device time: one call per sample" in md
    assert doc["ceilings"]["gemm"]["tflops"] > 0 and doc["ceilings"]["copy"]["gbps"] > 0
    assert {r["file"] for r in doc["graphs"]} == {
        "llama_rmsnorm.json",
        "resnet50_maxpool3x3_s2.json",
    }
    for row in doc["graphs"]:
        assert row["status"] == "ok", row
        assert row["category"] in ("norm", "pool")
        assert row["bound"] in ("compute", "memory")
        warm = row["timing"]["warm"]
        for variant in ("eager", "heuristic", "tuned"):
            assert warm[variant]["median_ms"] > 0, (variant, warm)
            assert row["variants"][variant]["verified"] is True, row["variants"][variant]
        assert "compile" not in warm
        assert row["variants"]["compile"]["error"].startswith("skipped")
        assert row["variants"]["tuned"]["plan"] == "TORCH_ENGINE"
        assert row["variants"]["tuned"]["tuning_s"] > 0
        start = row["warm_start"]
        assert start["ok"] and start["picked_tuned"], start
        assert start["timed_spans"] == 0
        assert start["policy"] == "SelectionHeuristic::Config"
    ratios = doc["summary"]["ratios"]["warm"]["tuned_vs_eager"]
    assert ratios["graphs"] == 2 and ratios["geomean"] > 0
    overrides = json.loads((out / "overrides.json").read_text())
    assert len(overrides["engine_overrides"]) == 2


def test_run_budget_spent_skips_every_graph_and_still_writes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(out, "--graphs", TWO_GRAPHS, "--skip-compile", "--budget-s", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in doc["graphs"]] == ["skipped", "skipped"]
    assert "## Skipped (time budget)" in (out / "results.md").read_text()


def test_shards_split_the_suite_and_merge_back(tmp_path: Path) -> None:
    fast = ("--graphs", TWO_GRAPHS, "--skip-compile", "--engines", "TORCH_ENGINE")
    one = _run(tmp_path / "one", *fast, "--shard", "1/2")
    two = _run(tmp_path / "two", *fast, "--shard", "2/2", "--budget-s", "0")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    first = json.loads((tmp_path / "one" / "results.json").read_text())["graphs"]
    second = json.loads((tmp_path / "two" / "results.json").read_text())["graphs"]
    assert len(first) == len(second) == 1 and first[0]["file"] != second[0]["file"]
    merged = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "--merge",
            str(tmp_path / "two"),
            str(tmp_path / "one"),
            "--out",
            str(tmp_path / "all"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert merged.returncode == 0, merged.stderr
    doc = json.loads((tmp_path / "all" / "results.json").read_text())
    assert sorted(r["status"] for r in doc["graphs"]) == ["ok", "skipped"]
    assert doc["summary"]["measured"] == 1 and len(doc["merged_from"]) == 2
    assert "## Per graph (warm)" in (tmp_path / "all" / "results.md").read_text()


def test_run_no_matching_graph_is_an_error(tmp_path: Path) -> None:
    proc = _run(tmp_path / "out", "--graphs", "no_such_graph", "--skip-compile")
    assert proc.returncode != 0
    assert "no graphs" in proc.stderr


@pytest.mark.slow
def test_run_cpu_with_max_autotune_compile(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(out, "--graphs", "llama_rmsnorm", "--engines", "TORCH_ENGINE", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "results.json").read_text())
    (row,) = doc["graphs"]
    compiled = row["variants"]["compile"]
    assert compiled["ok"] and compiled["verified"] is True, compiled
    assert compiled["compile_s"] > 0
    assert row["timing"]["warm"]["compile"]["median_ms"] > 0
    assert doc["summary"]["cost"]["graphs"] == 1


# ---- units ------------------------------------------------------------------------------------
def test_select_and_round_robin_sample_each_category_first() -> None:
    import run

    paths = run.select(EXAMPLES, "resnet50_*,llama")
    names = [p.stem for p in paths]
    assert "llama_rmsnorm" in names and "resnet50_maxpool3x3_s2" in names
    assert "bert_base_layernorm" not in names
    ordered = run.round_robin(paths)
    categories = [c for _, c in ordered]
    first = categories[: len(set(categories))]
    assert len(set(first)) == len(first), categories  # every category once before any repeats
    assert sorted(p for p, _ in ordered) == sorted(paths)


def test_deadline_interrupts_a_long_call() -> None:
    start = time.perf_counter()
    with pytest.raises(CompileTimeout), deadline(0.2):
        while time.perf_counter() - start < 5:
            pass
    assert time.perf_counter() - start < 2


def _row(name: str, eager: float, tuned: float, compiled: float | None = None) -> dict[str, Any]:
    timing = {
        "eager": {"median_ms": eager},
        "heuristic": {"median_ms": eager},
        "tuned": {"median_ms": tuned},
    }
    if compiled is not None:
        timing["compile"] = {"median_ms": compiled}
    return {
        "file": name,
        "status": "ok",
        "category": "norm",
        "bound": "memory",
        "flops": 1e6,
        "io_bytes": 1e9,
        "timing": {"warm": timing},
        "variants": {
            "eager": {"ok": True},
            "compile": {"ok": compiled is not None, "compile_s": 10.0},
            "heuristic": {"ok": True, "plan": "TORCH_ENGINE"},
            "tuned": {"ok": True, "plan": "TRITON_ENGINE", "tuning_s": 2.0},
        },
        "warm_start": {"ok": True, "build_ms": 3.0, "picked_tuned": True, "timed_spans": 0},
    }


def test_summary_geomeans_floor_and_costs() -> None:
    ceilings = {"gemm": {"tflops": 100.0}, "copy": {"gbps": 1000.0}}
    rows = [_row("a", 2.0, 1.0, 1.5), _row("b", 1.0, 1.0), _row("c", 0.9, 1.0, 1.0)]
    summary = summarize_run(rows, ceilings, ["warm"])
    te = summary["ratios"]["warm"]["tuned_vs_eager"]
    assert te["graphs"] == 3
    assert math.isclose(te["geomean"], (2.0 * 1.0 * 0.9) ** (1 / 3))
    assert te["min"] == pytest.approx(0.9) and te["min_graph"] == "c"
    assert te["below_0_98"] == ["c"]
    tc = summary["ratios"]["warm"]["tuned_vs_compile"]
    assert tc["graphs"] == 2 and math.isclose(tc["geomean"], math.sqrt(1.5))
    assert summary["cost"]["graphs"] == 2
    assert summary["cost"]["tuning_over_compile"] == pytest.approx(4.0 / 20.0)
    # 1 GB in 1 ms = 1000 GB/s = the whole copy bandwidth
    assert summary["norm_of_bandwidth"]["per_graph"]["a"] == pytest.approx(1.0)
    assert summary["warm_start"]["under_50_ms"] == 3
    assert geomean([]) is None


def test_markdown_renders_targets_and_skips() -> None:
    ceilings = {
        "gemm": {"tflops": 100.0, "what": "gemm"},
        "copy": {"gbps": 1000.0, "what": "copy"},
        "ridge_flop_per_byte": 100.0,
    }
    rows = [
        _row("a.json", 2.0, 1.0, 1.5),
        {"file": "b.json", "status": "skipped", "category": "pool", "error": "time budget"},
    ]
    doc = {
        "started_at": "now",
        "command": "python benchmarks/run.py",
        "environment": {"device_name": "test"},
        "options": {
            "modes": ["warm"],
            "iters": 10,
            "rounds": 2,
            "warmup": 3,
            "tune_warmup": 1,
            "tune_max_iters": 10,
        },
        "ceilings": ceilings,
        "graphs": rows,
        "summary": summarize_run(rows, ceilings, ["warm"]),
    }
    md = render_markdown(doc)
    assert "| tuned vs eager, geomean >= 1.3x | 2.00x over 1 graphs | met |" in md
    assert "`b.json`" in md and "## Skipped (time budget)" in md


def test_run_issue25_variants_through_the_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(
        out,
        *("--graphs", "llama_rmsnorm", "--skip-compile", "--engines", "TORCH_ENGINE"),
        *("--tune-defaults", "--exhaustive", "--heuristic-b"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "B vs A" in proc.stdout and "EXHAUSTIVE" in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["options"]["tune_defaults"] is True
    (row,) = doc["graphs"]
    v = row["variants"]
    assert v["tuned"]["mode"] == "standard" and v["exhaustive"]["mode"] == "exhaustive"
    assert v["exhaustive"]["ok"] and v["heuristic_b"]["ok"], v
    assert {"heuristic", "heuristic_b", "tuned", "exhaustive"} <= set(row["timing"]["warm"])
    # each tune wrote its own file: the warm start reads only the default tune's
    assert (out / "overrides.json").is_file() and (out / "overrides_exhaustive.json").is_file()
    md = (out / "results.md").read_text()
    assert "## Issue 25: default tuning against EXHAUSTIVE" in md
    assert "AutotuneConfig's defaults" in md
    assert "| `llama_rmsnorm` |" in md and "same plan" in md


def _tuning_row(name: str, a: float, b: float, t: float, e: float, same: bool) -> dict[str, Any]:
    medians = {"heuristic": a, "heuristic_b": b, "tuned": t, "exhaustive": e}
    return {
        "file": name,
        "status": "ok",
        "timing": {"warm": {k: {"median_ms": ms} for k, ms in medians.items()}},
        "variants": {
            "compile": {"ok": True, "compile_s": 20.0},
            "heuristic": {"plan": "CUDNN_ENGINE"},
            "heuristic_b": {"plan": "CUDNN_ENGINE" if same else "TRITON_ENGINE"},
            "tuned": {"tuning_s": 4.0},
            "exhaustive": {"tuning_s": 30.0},
        },
    }


def test_tuning_summary_cost_share_and_b_against_a() -> None:
    from _report_tuning import tuning_lines, tuning_summary

    rows = [
        _tuning_row("same.json", 1.0, 1.3, 0.8, 0.5, same=True),  # B's timing noise: a tie
        _tuning_row("worse.json", 1.0, 1.1, 1.0, 1.0, same=False),
        _tuning_row("better.json", 1.0, 0.5, 1.0, 0.8, same=False),
        _tuning_row("tied.json", 1.0, 1.01, 1.0, 1.0, same=False),
    ]
    s = tuning_summary(rows, "warm")
    assert s["cost"]["graphs"] == 4 and s["cost"]["ratio"] == pytest.approx(16.0 / 80.0)
    assert s["cost"]["exhaustive_s"] == pytest.approx(120.0)
    s_t = (1.25 * 1.0 * 1.0 * 1.0) ** 0.25
    s_e = (2.0 * 1.0 * 1.25 * 1.0) ** 0.25
    kept = s["kept"]
    assert kept["tuned_vs_heuristic"] == pytest.approx(s_t)
    assert kept["exhaustive_vs_heuristic"] == pytest.approx(s_e)
    assert kept["share"] == pytest.approx(math.log(s_t) / math.log(s_e))
    assert kept["most_behind"][0]["file"] == "same.json"
    ba = s["b_vs_a"]
    assert ba["same_plan"] == 1 and [e["file"] for e in ba["worse"]] == ["worse.json"]
    assert [e["file"] for e in ba["better"]] == ["better.json"]
    assert [e["file"] for e in ba["tied"]] == ["tied.json"]
    assert ba["geomean"] == pytest.approx((1.0 * (1 / 1.1) * 2.0 * (1 / 1.01)) ** 0.25)
    text = "\n".join(tuning_lines(s, "warm"))
    assert "(0.200x) over 4 graphs" in text and "| met |" in text  # the cost target
    assert "1 worse | **not met** |" in text  # B is worse than A on one graph
    # EXHAUSTIVE gaining nothing leaves no gain to keep: the share is not defined
    flat = tuning_summary([_tuning_row("x.json", 1.0, 1.0, 1.0, 1.0, same=True)], "warm")
    assert flat["kept"]["share"] is None


def test_b_against_a_on_call_latency_where_their_plans_differ() -> None:
    """``latency_b_vs_a`` (the clock B is trained on) is summarized beside the target's clock:
    its own geomean and the graphs B loses beyond the noise there."""
    from _report_tuning import tuning_lines, tuning_summary

    slower_on_device = _tuning_row("decode.json", 1.0, 1.04, 1.0, 1.0, same=False)
    slower_on_device["latency_b_vs_a"] = {
        "heuristic": {"median_ms": 0.055, "n": 60},
        "heuristic_b": {"median_ms": 0.0487, "n": 60},
    }
    lost = _tuning_row("lost.json", 1.0, 1.0, 1.0, 1.0, same=False)
    lost["latency_b_vs_a"] = {
        "heuristic": {"median_ms": 0.010, "n": 60},
        "heuristic_b": {"median_ms": 0.012, "n": 60},
    }
    failed = _tuning_row("failed.json", 1.0, 1.0, 1.0, 1.0, same=False)
    failed["latency_b_vs_a"] = {"heuristic": {"median_ms": 0.01}, "heuristic_b": {"error": "x"}}
    rows = [slower_on_device, lost, failed, _tuning_row("same.json", 1, 1, 1, 1, same=True)]
    s = tuning_summary(rows, "warm")
    lat = s["b_vs_a_latency"]
    assert lat["graphs"] == 2  # the failed pair and the same-plan graph are not compared
    assert lat["geomean"] == pytest.approx(((0.055 / 0.0487) * (0.010 / 0.012)) ** 0.5)
    assert [e["file"] for e in lat["worse"]] == ["lost.json"]
    assert [e["file"] for e in s["b_vs_a"]["worse"]] == ["decode.json"]  # the device clock
    text = "\n".join(tuning_lines(s, "warm"))
    assert "On call latency" in text and "over 2 graphs" in text and "`lost.json` 0.833x" in text
    # without latency pairs, no such line
    assert "On call latency" not in "\n".join(
        tuning_lines(
            tuning_summary([_tuning_row("x.json", 1, 1, 1, 1, same=False)], "warm"), "warm"
        )
    )


def test_latency_pair_times_both_plans_interleaved_and_keeps_a_failure_as_data() -> None:
    from types import SimpleNamespace

    from _measure import _latency_pair
    from _session import MeasureOptions

    import dnntune as dt

    calls: list[str] = []

    def failing() -> None:
        raise RuntimeError("plan B broke")

    runs = {"heuristic": lambda: calls.append("a"), "heuristic_b": lambda: calls.append("b")}
    session = SimpleNamespace(
        options=MeasureOptions(warmup=2, iters=6, rounds=3), handle=dt.create_handle("cpu")
    )
    out = _latency_pair(session, runs)  # type: ignore[arg-type]
    assert out["heuristic"]["n"] == out["heuristic_b"]["n"] == 6
    assert out["heuristic"]["median_ms"] > 0 and out["heuristic_b"]["median_ms"] > 0
    # the two plans alternate (rounds rotate who goes first)
    firsts = {calls[i] for i in range(1, len(calls)) if calls[i] != calls[i - 1]}
    assert firsts == {"a", "b"} and calls[0] == "a"
    out = _latency_pair(session, {"heuristic": runs["heuristic"], "heuristic_b": failing})  # type: ignore[arg-type]
    assert "plan B broke" in out["heuristic_b"]["error"] and out["heuristic"]["n"] == 6


def test_a_cache_dir_given_is_kept(tmp_path: Path) -> None:
    """--cache-dir names the user's folder: the run uses it and leaves it in place (only a
    folder the run made itself is removed at its end)."""
    cache = tmp_path / "cache"
    proc = _run(
        tmp_path / "out",
        "--graphs",
        "llama_rmsnorm",
        "--skip-compile",
        "--engines",
        "TORCH_ENGINE",
        "--cache-dir",
        str(cache),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (cache / "inductor").is_dir() or any(cache.iterdir())
