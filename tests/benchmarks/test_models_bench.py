"""benchmarks/models.py on the CPU: the tiny models in process, the real entry point, failures."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "models.py"
QUICK = ["--quick", "--device", "cpu", "--skip-compile", "--skip-max-autotune", "--rounds", "3"]
QUICK += ["--warmup-s", "0.05"]
CUDA_ONLY = ("eager_graph", "eager_graph_clone", "dnntune_graph", "dnntune_auto")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """These test the plumbing, not speed: one intra-op thread, so that a busy 2-core machine
    does not multiply their time (OpenMP threads spinning against other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the subprocesses'
    yield
    torch.set_num_threads(threads)


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_models", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = module
    spec.loader.exec_module(module)
    return module


def _rows(out: Path) -> dict[str, dict[str, Any]]:
    doc = json.loads((out / "models.json").read_text())
    return {row["model"]: row for row in doc["models"]}


def test_tiny_models_in_process(tmp_path: Path) -> None:
    models = _module()
    argv = [*QUICK, "--in-process", "--models", "tiny_cnn,tiny_mlp", "--out", str(tmp_path)]
    assert models.main(argv) == 0
    rows = _rows(tmp_path)
    assert set(rows) == {"tiny_cnn", "tiny_mlp"}
    for row in rows.values():
        assert row["status"] == "ok", row
        cells = row["variants"]
        for variant in ("eager", "dnntune"):
            assert cells[variant]["status"] == "ok", cells[variant]
            assert cells[variant]["median_ms"] > 0
            assert len(cells[variant]["rounds_ms"]) == 3
            assert cells[variant]["pass"] and cells[variant]["max_abs_err"] < 1e-3
        assert cells["dnntune"]["tune_s"] > 0 and isinstance(cells["dnntune"]["reverted"], bool)
        assert cells["dnntune"]["swapped"] > 0
        for variant in CUDA_ONLY:
            assert cells[variant] == {"status": "n/a", "reason": "CUDA only"}
        assert cells["compile"]["reason"] == "skipped (--skip-compile)"
        assert cells["max_autotune"]["reason"] == "skipped (--skip-max-autotune)"
    table = (tmp_path / "models.md").read_text()
    assert "| tiny_cnn |" in table and "| tiny_mlp |" in table
    assert "dnntune_auto (tune s, choice)" in table


def test_list_through_the_entry_point(tmp_path: Path) -> None:
    result = run_benchmark("models.py", "--list", out=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "tiny_cnn" in lines and "llama_decode" in lines and "whisper_encoder" in lines
    assert "available" in lines["tiny_mlp"]
    for name in ("resnet50", "bert_base", "vit_b16"):  # installed or not: it says which
        assert "available" in lines[name] or "needs " in lines[name]


def test_each_model_in_its_own_subprocess(tmp_path: Path) -> None:
    args = [*QUICK, "--policy", "heuristic", "--models", "tiny_cnn", "--rounds", "2"]
    args += ["--tune-budget-s", "30"]
    result = run_benchmark("models.py", *args, out=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "[models] tiny_cnn: eager " in result.stdout
    row = _rows(tmp_path)["tiny_cnn"]
    assert row["status"] == "ok" and row["variants"]["dnntune"]["median_ms"] > 0
    log = tmp_path / "logs" / "tiny_cnn.log"
    assert "stage" not in row and log.exists()
    assert "--tune-budget-s 30.0" in log.read_text()  # passed on to the model's subprocess


def test_one_override_file_for_every_run(tmp_path: Path) -> None:
    """``--overrides``: the dnntune variants of every model and every run tune into one file,
    so a later run (another tree, another process) reads the plans an earlier one chose."""
    shared = tmp_path / "shared.json"
    args = [*QUICK, "--models", "tiny_mlp", "--rounds", "2", "--variants", "eager,dnntune"]
    args += ["--overrides", str(shared)]  # no budget: the first run tunes every layer
    first = run_benchmark("models.py", *args, out=tmp_path / "a", timeout=240)
    assert first.returncode == 0, first.stderr
    assert f"--overrides {shared}" in (tmp_path / "a" / "logs" / "tiny_mlp.log").read_text()
    entries = json.loads(shared.read_text())
    assert entries, "the first run wrote no plan into the shared file"
    models = _module()
    assert models.main([*args, "--in-process", "--out", str(tmp_path / "b")]) == 0
    row = _rows(tmp_path / "b")["tiny_mlp"]
    assert row["variants"]["dnntune"]["status"] == "ok"
    assert row["variants"]["dnntune"]["autotune_calls"] == 0  # every plan read from the file
    assert json.loads(shared.read_text()) == entries


def test_a_model_that_fails_to_build_is_an_error_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = _module()

    def broken(setting: Any) -> Any:
        raise RuntimeError("no such layer")

    spec = models.ModelSpec("broken", "tiny", "raises", broken)
    monkeypatch.setitem(models.SPECS, "broken", spec)  # SPECS is shared: put back after
    argv = [*QUICK, "--in-process", "--policy", "heuristic", "--rounds", "2"]
    assert models.main([*argv, "--models", "broken,tiny_mlp", "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path)
    assert rows["broken"]["status"] == "error"
    assert rows["broken"]["reason"] == "build: RuntimeError: no such layer"
    assert rows["tiny_mlp"]["status"] == "ok"
    assert rows["tiny_mlp"]["variants"]["dnntune"]["median_ms"] > 0
    assert "| broken | error |" in (tmp_path / "models.md").read_text()


def test_summary_counts_the_targets() -> None:
    models = _module()

    def row(name: str, **ms: float) -> dict[str, Any]:
        cells = {v: {"status": "ok", "median_ms": t} for v, t in ms.items()}
        cells["dnntune_auto"]["tune_s"] = 5.0
        if "max_autotune" in cells:
            cells["max_autotune"]["compile_s"] = 100.0
        return {"model": name, "variants": cells}

    rows = [
        row("a", eager=2.0, eager_graph=1.0, dnntune_auto=0.5, max_autotune=0.6),
        row("b", eager=2.0, eager_graph=1.0, dnntune_auto=1.25, max_autotune=0.5),
    ]
    found = models.summary(rows)
    assert found["geomean_over_eager_graph"] == pytest.approx((2.0 * 0.8) ** 0.5)
    assert found["at_least_best_of_eager_and_graph"] == 1 and found["misses"] == ["b 0.80x"]
    assert found["beat_max_autotune_at_tenth_compile_time"] == ["a"]


def test_a_real_model_when_transformers_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    models = _module()
    argv = [*QUICK, "--in-process", "--policy", "heuristic", "--models", "bert_base"]
    assert models.main([*argv, "--out", str(tmp_path)]) == 0
    row = _rows(tmp_path)["bert_base"]
    assert row["status"] == "ok", row
    assert row["variants"]["dnntune"]["pass"] and row["variants"]["eager"]["median_ms"] > 0


def test_a_dnntune_given_on_pythonpath_is_the_one_that_runs(tmp_path: Path) -> None:
    """benchmarks/ab_trees.sh gives each tree on ``PYTHONPATH``; before session 47 models.py
    put its own checkout's ``src/`` first, so both halves of an A/B ran one tree. The package
    that ran is in ``models.json`` (``dnntune_path``)."""
    import os
    import shutil
    import subprocess

    tree = tmp_path / "tree"
    shutil.copytree(
        REPO / "src" / "dnntune", tree / "dnntune", ignore=shutil.ignore_patterns("__pycache__")
    )
    args = [*QUICK, "--models", "tiny_mlp", "--rounds", "2", "--variants", "eager,dnntune"]
    ran = {}
    for name, pythonpath in (("given", str(tree)), ("own", "")):
        out = tmp_path / name
        env = {**os.environ, "PYTHONPATH": pythonpath, "OUT": str(out)}
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args, "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        doc = json.loads((out / "models.json").read_text())
        assert doc["models"][0]["variants"]["dnntune"]["status"] == "ok"
        ran[name] = Path(doc["versions"]["dnntune_path"])
    assert ran["given"] == (tree / "dnntune").resolve()
    assert ran["own"] == (REPO / "src" / "dnntune").resolve()
