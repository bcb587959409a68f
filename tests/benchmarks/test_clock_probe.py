"""benchmarks/clock_probe.py on the CPU: the real entry point, every clock of every plan."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import REPO, run_benchmark

GRAPH = REPO / "examples" / "graphs" / "llama_rmsnorm.json"


def test_cpu_probe_prints_and_writes_every_clock(tmp_path: Path) -> None:
    result = run_benchmark("clock_probe.py", str(GRAPH), "--samples", "2", out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| graph | plan | latency us |" in result.stdout
    rows = json.loads((tmp_path / "clock_probe.json").read_text())
    assert rows and {r["plan"] for r in rows} >= {"TORCH_ENGINE"}
    for row in rows:
        clocks = ("latency_us", "latency_wd_us", "device_us", "throughput_us", "suite_us")
        for clock in (*clocks, "host_same_us", "host_fresh_us"):
            assert row[clock] > 0, (clock, row)
