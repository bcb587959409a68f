"""benchmarks/cudnn_configs.py (the GPU study of cuDNN's heuristic plans against its search):
its entry point and its per-graph line, on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

from bench_helpers import REPO, run_benchmark

sys.path.insert(0, str(REPO / "benchmarks"))

import cudnn_configs


def test_help_runs_through_the_entry_point(tmp_path: Path) -> None:
    result = run_benchmark("cudnn_configs.py", "--help", out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--graphs" in result.stdout


def _cfg(index: int, ms: float) -> dict[str, object]:
    knobs = {} if index < 0 else {"cudnn.engine_config": index}
    return {"knobs": knobs, "ok": True, "median_ms": ms}


def test_the_line_reports_best_of_first_k_and_the_search_over_the_default() -> None:
    row = {
        "graph": "g.json",
        "configs": [_cfg(-1, 0.02), _cfg(0, 0.02), _cfg(1, 0.025), _cfg(2, 0.016)],
        "configs_s": 0.1,
        "search": [{"ok": True, "rank": 0, "median_ms": 0.0125, "plan": "CUDNN_ENGINE[x=1]"}],
        "search_s": 2.0,
    }
    line = cudnn_configs._line(row, 3)
    # best of plan 0, of plans 0-1, of plans 0-2: 1.0x, 1.0x, 1.25x; the search 1.6x
    assert "best of first k: 1.000 1.000 1.250" in line
    assert "search 1.600 CUDNN_ENGINE[x=1]" in line


def test_a_graph_without_a_default_plan_says_so() -> None:
    row = {"graph": "g.json", "configs": [_cfg(0, 0.02)], "configs_s": 0.1, "search": []}
    assert cudnn_configs._line(row, 2) == "g.json: no default plan"
