"""benchmarks/generate.py through its real entry point on the CPU: the tiny LLaMA-style model's
greedy generation, eager and optimized side by side (transformers is not installed in CI: the
run is skipped there, the refusal without CUDA is not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "generate.py"


def _run(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_device_is_refused_with_what_to_try(tmp_path: Path) -> None:
    done = _run("--device", "cuda", out=tmp_path)
    assert done.returncode == 2
    assert "no CUDA device here (try --device cpu --quick)" in done.stderr
    assert not (tmp_path / "generate.json").exists()


def test_the_tiny_model_generates_the_same_tokens_eager_and_optimized(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    args = ["--quick", "--device", "cpu", "--dtype", "fp32", "--policy", "heuristic"]
    args += ["--new-tokens", "3", "--prompt", "8", "--rounds", "1", "--tune-budget-s", "5"]
    done = _run(*args, out=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[generate] eager " in done.stdout and "same tokens" in done.stdout
    result = json.loads((tmp_path / "generate.json").read_text())
    assert result["same_tokens"] and result["first_different_token"] is None
    assert set(result["ms_per_token"]) == {"eager", "dnntune"}
    assert all(len(v) == 1 and v[0] > 0 for v in result["rounds_ms_per_token"].values())
    assert result["versions"]["dnntune_path"] == str((REPO / "src" / "dnntune").resolve())
    assert result["report"].startswith("dnntune.torch.optimize")
