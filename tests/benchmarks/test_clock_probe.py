"""benchmarks/clock_probe.py on the CPU: the real entry point, every clock of every plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "clock_probe.py"
GRAPH = REPO / "examples" / "graphs" / "llama_rmsnorm.json"


def test_cpu_probe_prints_and_writes_every_clock(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(GRAPH), "--samples", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "| graph | plan | latency us |" in result.stdout
    rows = json.loads((tmp_path / "clock_probe.json").read_text())
    assert rows and {r["plan"] for r in rows} >= {"TORCH_ENGINE"}
    for row in rows:
        for clock in ("latency_us", "latency_wd_us", "device_us", "throughput_us", "suite_us"):
            assert row[clock] > 0, (clock, row)
