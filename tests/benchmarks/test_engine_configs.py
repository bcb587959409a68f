"""benchmarks/engine_configs.py (the GPU study of cuDNN's heuristic plans against its search):
its entry point and its per-graph line, on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

from bench_helpers import REPO, run_benchmark

sys.path.insert(0, str(REPO / "benchmarks"))

import engine_configs


def test_help_runs_through_the_entry_point(tmp_path: Path) -> None:
    result = run_benchmark("engine_configs.py", "--help", out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--graphs" in result.stdout


def _cfg(index: int, ms: float) -> dict[str, object]:
    knobs = {"global.workspace_size_limit": 0}
    if index >= 0:
        knobs["cudnn.engine_config"] = index
    return {"knobs": knobs, "ok": True, "median_ms": ms, "plan": f"P{index}"}


def test_the_line_reports_best_of_first_k_and_the_search_over_the_default() -> None:
    row = {
        "graph": "g.json",
        "fixed": [{"cudnn.engine_config": i} for i in range(3)],
        "configs": [_cfg(-1, 0.02), _cfg(0, 0.02), _cfg(1, 0.025), _cfg(2, 0.016)],
        "configs_s": 0.1,
        "search": [{"ok": True, "rank": 0, "median_ms": 0.0125, "plan": "CUDNN_ENGINE[x=1]"}],
        "search_s": 2.0,
    }
    line = engine_configs._line(row, 3)
    # best of plan 0, of plans 0-1, of plans 0-2: 1.0x, 1.0x, 1.25x; the search 1.6x
    assert "best of first k: 1.000 1.000 1.250" in line
    assert "search 1.600 CUDNN_ENGINE[x=1]" in line


def test_a_graph_without_a_default_plan_says_so() -> None:
    row = {
        "graph": "g.json",
        "fixed": [{"cudnn.engine_config": 0}],
        "configs": [_cfg(0, 0.02)],
        "configs_s": 0.1,
        "search": [],
    }
    assert engine_configs._line(row, 2) == "g.json: no default plan"


def test_triton_fixed_plans_are_the_solver_space_in_order() -> None:
    import dnntune as dt

    path = REPO / "benchmarks" / "suite" / "pool_avg_resnet50_global_7x7_n32_c2048_nhwc_fp16.json"
    plans = engine_configs.fixed_plans("TRITON_ENGINE", dt.Graph.load(path), 27)
    assert 4 <= len(plans) <= 27
    assert all(set(p) == {"triton.block_m", "triton.block_n", "triton.num_warps"} for p in plans)
    # only configs that fit: 32 pixels x 256 channels over 4 warps would spill registers (the
    # H200 study's first run refused the whole row on it)
    assert not any(
        p["triton.block_m"] * p["triton.block_n"] / (32 * p["triton.num_warps"]) > 32 for p in plans
    )
