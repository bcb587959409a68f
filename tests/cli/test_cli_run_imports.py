"""``dnntune run`` on the CPU imports ``torch._dynamo`` (1.5-2 s) only when a plan compiles.

Every ``run`` imported it: the applicability screen asked TORCH_COMPILE_ENGINE whether
torch.compile works here (``is_dynamo_supported``, an import of ``torch._dynamo``) for every
graph, and TORCH_ENGINE's lowering asked the meta device for result types. Both fail before
their fixes; a plan that does compile still gets torch._dynamo and runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import dnntune as dt
from dnntune.overrides.writer import write_autotune_winner
from dnntune.providers import torch_compile
from dnntune.rfc import AutotuneResult, AutotuneStorageConfig

REPO = Path(__file__).resolve().parents[2]
GRAPH = REPO / "examples" / "graphs" / "bert_base_ffn_matmul_bias_gelu.json"

#: ``dnntune run`` in this process, through the console script's own entry point
_DRIVER = textwrap.dedent(
    """
    import sys
    from _dnntune_cli import main

    sys.argv = ["dnntune", *sys.argv[1:]]
    try:
        main()
    except SystemExit as done:
        print("exit", done.code, "dynamo", "torch._dynamo" in sys.modules, file=sys.stderr)
    """
)


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    """The driver's last stderr line: ``exit CODE dynamo True|False``."""
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    return done.stderr.strip().splitlines()[-1]


def test_run_on_torch_engine_leaves_torch_dynamo_unimported(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    line = _run("run", "-g", str(GRAPH), "--device", "cpu", "--iters", "2", "--json", str(results))
    assert line == "exit 0 dynamo False"
    (rec,) = json.loads(results.read_text())
    assert rec["plan"] == "TORCH_ENGINE"


def _pick(graph: Path, engine: str, path: Path) -> None:
    """An override file whose entry for ``graph`` picks ``engine`` (default knobs)."""
    g = dt.Graph.load(graph)
    g.validate()
    winner = AutotuneResult(
        engine_id=dt.get_registry().get(engine).id,
        engine_name=engine,
        rank=0,
        succeeded=True,
        min_time_ms=0.1,
        avg_time_ms=0.1,
    )
    write_autotune_winner(g, [winner], AutotuneStorageConfig(str(path)), None)


@pytest.mark.slow
def test_run_on_a_torch_compile_plan_still_compiles(tmp_path: Path) -> None:
    """An override file that picks TORCH_COMPILE_ENGINE: its plan compiles and runs."""
    picks = tmp_path / "o.json"
    _pick(GRAPH, "TORCH_COMPILE_ENGINE", picks)
    results = tmp_path / "r.json"
    env = {**os.environ, "DNNTUNE_HEUR_CONFIG_PATH": str(picks)}
    args = ("run", "-g", str(GRAPH), "--device", "cpu", "--iters", "2", "--json", str(results))
    assert _run(*args, env=env) == "exit 0 dynamo True"
    (rec,) = json.loads(results.read_text())
    assert rec["plan"] == "TORCH_COMPILE_ENGINE"
    assert rec["policy"] == "SelectionHeuristic::Config"
    assert rec["passed"] is True


def test_the_screens_shortcut_agrees_with_torch_dynamo() -> None:
    """Where the screen says torch.compile works without asking torch._dynamo, torch._dynamo
    says so too; on torch 2.13 (what ./scripts installs) under a Python before 3.13 (no
    free-threaded build) the screen takes the shortcut."""
    if torch_compile._surely_supported():
        assert torch_compile._dynamo_problem() is None
    if torch.__version__.startswith("2.13.") and sys.version_info < (3, 13):
        assert torch_compile._surely_supported()
