"""``run``: when the override file's plan cannot be built here, the plan that ran is not
labelled ``config`` (audit, session 18; fails before its fix); when only its knobs cannot,
its engine runs with its default knobs, not the next engine (session 22)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1", "--device", "cpu")


def test_a_file_plan_that_cannot_build_here_is_not_labelled_config(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("dnntune.providers.torch_eager")
    graph = str(graph_dir / "b_pw_mul.json")
    tuned = tmp_path / "a.json"
    first = cli("tune", "-g", graph, "-o", str(tuned), "--engine", "TORCH_ENGINE", *FAST)
    assert first.exit_code == 0, first.output
    doc = json.loads(tuned.read_text())
    doc["engine_overrides"][0]["autotune_metadata"]["knobs"] = [
        {"knob_id": "torch.cuda_graph", "type": "int", "value": 1}
    ]
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(doc))
    results = tmp_path / "r.json"
    env = {"DNNTUNE_HEUR_CONFIG_PATH": str(gpu)}
    run = cli("run", "-g", graph, "--device", "cpu", "--json", str(results), env=env)
    assert run.exit_code == 0, run.output
    (rec,) = json.loads(results.read_text())
    # the file chose TORCH_ENGINE: its default knobs run, not the next engine (before the
    # fix: TORCH_COMPILE_ENGINE, which this graph would not get without the file)
    assert rec["plan"] == "TORCH_ENGINE"
    assert rec["policy"] == "SelectionHeuristic::ConfigFallback"
    assert "could not be built here" in rec["policy_reason"]
    assert "torch.cuda_graph" in rec["policy_reason"]
    assert "default knobs" in rec["policy_reason"]
    assert "fallback" in run.stdout and "config " not in run.stdout
    assert run.stderr.count("WARNING") == 1
    assert "cannot be built here" in " ".join(run.stderr.split())
    assert "TORCH_ENGINE runs with its default knobs" in " ".join(run.stderr.split())
    ok = cli(
        "run",
        "-g",
        graph,
        "--device",
        "cpu",
        "--json",
        str(results),
        env={"DNNTUNE_HEUR_CONFIG_PATH": str(tuned)},
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(results.read_text())[0]["policy"] == "SelectionHeuristic::Config"
