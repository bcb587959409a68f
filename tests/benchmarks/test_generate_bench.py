"""benchmarks/generate.py through its real entry point on the CPU: the tiny LLaMA-style model's
greedy generation, eager and optimized side by side (transformers is not installed in CI: the
run is skipped there, the refusal without CUDA is not)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "generate.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_generate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # registered as an import would be: its dataclasses read their module's annotations there
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, spec.name, module)
        spec.loader.exec_module(module)
    return module


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
    logits = result["logits"]  # fp32 on the CPU: the same logits
    assert logits["first_different_step"] is None and logits["max_logit_diff"] < 1e-4
    assert logits["logit_scale"] > 0


def test_the_optimized_model_timed_with_and_without_the_race_and_an_eager_copy(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    args = ["--quick", "--device", "cpu", "--dtype", "fp32", "--policy", "heuristic"]
    args += ["--new-tokens", "12", "--prompt", "8", "--rounds", "1"]
    done = _run(*args, "--keep-optimized", "--without-race", "--eager-copy", out=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "routes raced: " in done.stdout and ", without the race " in done.stdout
    assert ", an eager copy " in done.stdout and "the copies' spread" in done.stdout
    result = json.loads((tmp_path / "generate.json").read_text())
    assert result["reverted"] is False
    forms = {"eager", "dnntune", "dnntune_without_race", "eager_copy"}
    assert set(result["ms_per_token"]) == forms
    assert set(result["speedups"]) == set(result["ms_per_token"])
    # one round: each round's own ratio is the ratio of the medians
    assert result["paired_speedups"] == pytest.approx(result["speedups"])
    assert len(result["routes_per_round"]) == 1 and result["same_tokens"]
    # the warm-up calls let every race choose: the timed round runs the chosen routes
    assert "racing" not in result["routes_per_round"][0]


def test_a_static_cache_generates_eager_tokens_after_optimize(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    args = ["--quick", "--device", "cpu", "--dtype", "fp32", "--policy", "heuristic"]
    args += ["--new-tokens", "6", "--prompt", "8", "--rounds", "1", "--cache", "static"]
    done = _run(*args, "--keep-optimized", out=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "generate.json").read_text())
    assert result["args"]["cache"] == "static" and result["same_tokens"]
    assert result["logits"]["max_logit_diff"] < 1e-4  # fp32 on the CPU: the same logits
    assert result["graphs"] == {"records": 0, "replays": 0}  # the CPU has no CUDA graphs
    assert "graphs recorded 0, replayed 0" in done.stdout


def test_the_agreement_report_tells_a_near_tie_from_a_wrong_logit() -> None:
    import torch

    module = _module()
    eager = torch.tensor([[0.0, 5.0, 1.0], [2.0, 1.99, float("-inf")], [0.0, 1.0, 3.0]])
    near = eager.clone()
    near[1, 1] = 2.01  # step 1 flips on a 0.02 change: a tie
    got = module.agreement(eager, near)
    assert got["first_different_step"] == 1
    assert got["eager_margin_at_flip"] == pytest.approx(0.01)
    assert got["max_logit_diff"] == pytest.approx(0.02)
    assert got["logit_scale"] == 5.0
    wrong = eager.clone()
    wrong[0, 2] = 9.0  # step 0 flips on a change of 8: not rounding
    got = module.agreement(eager, wrong)
    assert got["first_different_step"] == 0 and got["max_logit_diff"] == pytest.approx(8.0)
    assert got["eager_margin_at_flip"] == pytest.approx(4.0)
    same = module.agreement(eager, eager.clone())
    assert same["first_different_step"] is None and same["max_logit_diff"] == 0.0
    assert "eager_margin_at_flip" not in same
