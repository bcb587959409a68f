"""benchmarks/torch_e2e.py on the CPU (tiny shapes): the real entry point end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "torch_e2e.py"


def test_cpu_smoke_run_writes_json(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    args = ["--device", "cpu", "--quick", "--skip-compile", "--iters", "3", "--warmup", "1"]
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *args,
            "--models",
            "resnet_stack,decoder_decode",
            "--also-throughput",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "| resnet_stack |" in result.stdout and "| decoder_decode |" in result.stdout
    assert "throughput-ranked" in result.stdout
    rows = {r["model"]: r for r in json.loads((tmp_path / "torch_e2e.json").read_text())}
    assert set(rows) == {"resnet_stack", "decoder_decode"}
    for row in rows.values():
        assert row["cached_autotune_calls"] == 0  # the second process-local copy tuned nothing
        assert row["dnntune_ms"] > 0 and row["eager_ms"] > 0
        assert row["max_abs_diff_vs_eager"] < 0.1
        assert row["dnntune_throughput_ms"] > 0 and row["check_speedup"] > 0
    assert rows["resnet_stack"]["fusions"] == 3  # the three bottleneck blocks
