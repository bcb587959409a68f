"""benchmarks/fault_repro.py: argument checks on the CPU; the stepped run on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import run_benchmark


def test_unknown_step_is_refused(tmp_path: Path) -> None:
    result = run_benchmark("fault_repro.py", "--skip", "compile,bogus", out=tmp_path)
    assert result.returncode == 2
    assert "unknown steps ['bogus']" in result.stderr


@pytest.mark.gpu
def test_stepped_run_names_every_step(tmp_path: Path) -> None:
    result = run_benchmark("fault_repro.py", "--quick", "--skip", "compile", out=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for step in ("eager", "latency", "throughput", "graph", "cached"):
        assert f"ok {step} (" in result.stdout
    assert "no fault" in result.stdout
