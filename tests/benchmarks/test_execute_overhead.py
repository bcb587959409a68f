"""benchmarks/execute_overhead.py on the CPU at a tiny size: every path of every op is timed."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import run_benchmark

PATHS = {"pytorch_op", "dnntune_op", "graph_execute", "plan_execute", "raw"}


def test_cpu_overhead_table_has_every_op_and_path(tmp_path: Path) -> None:
    args = ("--calls", "3", "--rounds", "2", "--devices", "cpu", "--stat", "both")
    result = run_benchmark("execute_overhead.py", *args, out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "host µs per call, median of interleaved rounds" in result.stdout
    payload = json.loads((tmp_path / "execute_overhead.json").read_text())
    rows = payload["results"]["cpu"]
    ops = {r["op"] for r in rows}
    assert ops == {"conv", "linear", "layernorm", "rmsnorm", "sdpa", "pool"}
    assert {r["engine"] for r in rows} == {"TORCH_ENGINE", "TORCH_ENGINE*"}
    for row in rows:
        assert set(row["paths"]) >= PATHS, row
        for stats in row["paths"].values():
            assert stats["median_us"] > 0 and stats["min_us"] > 0
    with_module = {r["op"] for r in rows if "dnntune_module" in r["paths"]}
    assert with_module == ops  # SDPA and pooling through an optimized module's routing
