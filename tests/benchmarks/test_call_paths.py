"""benchmarks/call_paths.py through its real entry point, on the CPU."""

from __future__ import annotations

from pathlib import Path

from bench_helpers import run_benchmark


def test_the_winner_and_the_heuristic_plan_are_timed_on_every_path(tmp_path: Path) -> None:
    args = ("bert_base_ffn", "--tunes", "1", "--rounds", "2", "--device", "cpu")
    result = run_benchmark("call_paths.py", *args, out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tune 0:" in result.stdout
    for path in ("raw", "bound", "graph"):
        assert f"'winner_{path}'" in result.stdout and f"'heuristic_{path}'" in result.stdout
    assert "heuristic / winner:" in result.stdout
