"""benchmarks/profile_optimize.py through its real entry point, on the CPU."""

from __future__ import annotations

from pathlib import Path

from bench_helpers import run_benchmark


def test_optimize_is_profiled_beside_its_tuning_time(tmp_path: Path) -> None:
    args = ("--models", "tiny_cnn", "--device", "cpu", "--quick", "--cuda-graph", "false")
    result = run_benchmark("profile_optimize.py", *args, "--rows", "10", out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# tiny_cnn: optimize ")
    assert "tuning" in result.stdout and "module(s) swapped" in result.stdout
    text = (tmp_path / "profile_optimize_tiny_cnn.txt").read_text()
    tables = ("## first sights", "## autotune calls", "## cumulative, dnntune", "## own")
    for table in (*tables, "## cumulative, all"):
        assert table in text
    # its own override file: every layer tuned, each call listed with its candidates
    assert "autotune calls)" in result.stdout and "(0 autotune calls)" not in result.stdout
    assert "TORCH_ENGINE" in text.split("## cumulative")[0]
    assert (tmp_path / "overrides_tiny_cnn.json").is_file()
    assert "dnntune/torch/optimize.py" in text


def test_thread_samples_stand_in_for_cprofile(tmp_path: Path) -> None:
    """``--sample-threads``: no cProfile tables; the main thread's stacks, sampled."""
    args = ("--models", "tiny_cnn", "--device", "cpu", "--quick", "--cuda-graph", "false")
    result = run_benchmark(
        "profile_optimize.py", *args, "--sample-threads", "--rows", "20", out=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.startswith("# tiny_cnn: optimize ") and "with thread samples" in result.stdout
    )
    text = (tmp_path / "profile_optimize_tiny_cnn.txt").read_text()
    assert "## autotune calls" in text and "## thread samples" in text
    assert "## cumulative" not in text and "## own time" not in text
    main = text.split("## thread samples")[1]
    assert "thread MainThread:" in main and "samples" in main
