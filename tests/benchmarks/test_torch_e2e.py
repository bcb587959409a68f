"""benchmarks/torch_e2e.py on the CPU (tiny shapes): the real entry point end to end."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import run_benchmark


def test_cpu_smoke_run_writes_json(tmp_path: Path) -> None:
    """One model through every column (the decoder runs in the profile test below, which
    checks its row too: each model's run is about 15 s of CI)."""
    args = ["--device", "cpu", "--quick", "--skip-compile", "--iters", "3", "--warmup", "1"]
    models = ["--models", "resnet_stack", "--also-throughput", "--also-refine"]
    result = run_benchmark("torch_e2e.py", *args, *models, out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| resnet_stack |" in result.stdout
    assert "throughput-ranked" in result.stdout and "dnntune refined ms" in result.stdout
    rows = {r["model"]: r for r in json.loads((tmp_path / "torch_e2e.json").read_text())}
    assert set(rows) == {"resnet_stack"}
    for row in rows.values():
        assert row["cached_autotune_calls"] == 0  # the second process-local copy tuned nothing
        assert row["dnntune_ms"] > 0 and row["eager_ms"] > 0
        assert row["max_abs_diff_vs_eager"] < 0.1
        assert row["dnntune_throughput_ms"] > 0 and row["check_speedup"] > 0
        assert row["dnntune_refined_ms"] > 0 and isinstance(row["refined_modules"], list)
    # the three bottleneck blocks' residual adds, and the conv + batch norm (+ ReLU) runs of
    # their Sequential bodies and the stem; none runs when optimize reverted the model to
    # PyTorch's forward (its own timing decides that, and a loaded CPU can)
    resnet = rows["resnet_stack"]
    assert resnet["fusions"] == (0 if resnet["reverted"] else 13)


def test_profile_writes_inference_and_training_tables(tmp_path: Path) -> None:
    args = ["--device", "cpu", "--quick", "--skip-compile", "--iters", "2", "--warmup", "1"]
    result = run_benchmark(
        "torch_e2e.py", *args, "--models", "decoder_decode", "--profile", out=tmp_path
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads((tmp_path / "torch_e2e.json").read_text())
    assert row["model"] == "decoder_decode" and row["cached_autotune_calls"] == 0
    assert row["dnntune_ms"] > 0 and row["max_abs_diff_vs_eager"] < 0.1
    inference = (tmp_path / "profile_decoder_decode.txt").read_text()
    train = (tmp_path / "profile_decoder_decode_train.txt").read_text()
    assert "/ eager (5 calls)" in inference and "/ dnntune (5 calls)" in inference
    assert "/ train_eager (5 calls)" in train and "/ train_dnntune (5 calls)" in train
    # the training table shows the backward's work (autograd's engine ran under the profiler)
    assert "backward" in train.lower()
