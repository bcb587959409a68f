"""benchmarks/decision_stability.py on the CPU: the real entry point, and its arithmetic."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from bench_helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "decision_stability.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("decision_stability", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["decision_stability"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["compiled", "spec"])
def test_cpu_smoke_run_writes_json(tmp_path: Path, path: str) -> None:
    args = ["--device", "cpu", "--graph", "resnet50_conv3x3_bias_relu_nchw", "--repeats", "2"]
    result = run_benchmark(
        "decision_stability.py", *args, "--rounds", "5", "--path", path, out=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "chosen within 2% of the independent best" in result.stdout
    doc = json.loads((tmp_path / "decision_stability.json").read_text())
    assert doc["summary"]["tunes"] == 2 and doc["args"]["path"] == path
    (graph,) = doc["graphs"]
    assert graph["graph"] == "resnet50_conv3x3_bias_relu_nchw"
    assert len(graph["winners"]) == 2 and graph["best"] in graph["independent_median_ms"]
    assert set(graph["winners"]) <= set(graph["independent_median_ms"])


def test_summary_arithmetic() -> None:
    m = _module()
    clear = m.GraphRun("clear", winners=["a"] * 9 + ["b"], independent_ms={"a": 1.0, "b": 1.1})
    close = m.GraphRun("close", winners=["a", "b"] * 5, independent_ms={"a": 1.0, "b": 1.01})
    assert clear.gap == pytest.approx(0.1) and clear.same_winner == 9 and clear.within == 9
    assert close.within == 10 and close.same_winner == 5
    summary = m.summarize([clear, close], 10)
    assert summary["tunes"] == 20 and summary["within_2pct"] == 19
    assert summary["graphs_gap_ge_5pct"] == 1 and summary["graphs_gap_ge_5pct_stable"] == 1
    assert summary["same_winner_target_met"] and summary["within_target_met"]
