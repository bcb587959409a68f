"""RFC use case 15 across processes: tune once, then reuse the winner with zero benchmarking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dnntune.autotune.session")
pytest.importorskip("dnntune.testing")

PRELUDE = """
import json, sys
import torch
import dnntune as dt
from dnntune import testing

NAMES = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
# C is fastest, but A comes first in every static order: only a stored decision picks C.
TIMINGS = {testing.FAKE_ENGINE_A: 1.0, testing.FAKE_ENGINE_B: 0.5, testing.FAKE_ENGINE_C: 0.1}
"""

TUNE = PRELUDE + textwrap.dedent(
    """
    with testing.fake_engines(timings=TIMINGS, names=NAMES) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_conv_graph()
        g.build_operation_graph(handle)
        pack = testing.make_pack(g)
        if sys.argv[1] == "file":
            g.add_all_engines()
            ws = g.get_estimated_max_workspace_size()
            results = g.autotune(handle, pack, torch.empty(ws, dtype=torch.uint8), ws,
                                 storage_config=dt.AutotuneStorageConfig(sys.argv[2]))
            outcome = None
        else:
            results, outcome = g.autotune_exhaustive_sweep(handle, pack)
        print(json.dumps({"winner": results[0].engine_name,
                          "outcome": outcome.value if outcome else None}))
    """
)

REUSE = PRELUDE + textwrap.dedent(
    """
    with testing.fake_engines(timings=TIMINGS, names=NAMES) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_conv_graph()
        g.build(handle, [dt.HeuristicMode.FALLBACK], dt.BuildPlanPolicy.HEURISTICS_CHOICE)
        decision = g.plan_set.plans.decision
        print(json.dumps({
            "plan": g.get_plan_name(),
            "policy": decision.policy,
            "source": decision.matched.get("source"),
            "executes": sum(fakes.counters.executes.values()),
            "priming": sum(fakes.counters.priming_executes.values()),
            "compiles": dict(fakes.counters.compiles),
        }))
    """
)


def _run(script: Path, *args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    tune, reuse = tmp_path / "tune.py", tmp_path / "reuse.py"
    tune.write_text(TUNE)
    reuse.write_text(REUSE)
    return tune, reuse


@pytest.mark.slow
def test_second_process_reuses_the_override_file(
    scripts: tuple[Path, Path], tmp_path: Path
) -> None:
    tune, reuse = scripts
    overrides = tmp_path / "autotune_results.json"
    env = dict(os.environ)
    first = _run(tune, "file", str(overrides), env=env)
    assert first["winner"] == "FAKE_ENGINE_C"
    assert json.loads(overrides.read_text())["engine_overrides"][0]["engine_name"] == (
        "FAKE_ENGINE_C"
    )

    baseline = _run(reuse, env=env)  # no file: the static order picks another engine
    assert not baseline["plan"].startswith("FAKE_ENGINE_C")

    env["DNNTUNE_HEUR_CONFIG_PATH"] = str(overrides)
    second = _run(reuse, env=env)
    assert second["plan"].startswith("FAKE_ENGINE_C")
    assert second["policy"] == "SelectionHeuristic::Config"
    assert second["source"] == "override_file"
    assert second["executes"] == 0 and second["priming"] == 0  # zero benchmarking
    assert second["compiles"] == {"FAKE_ENGINE_C": 1}


@pytest.mark.slow
def test_second_process_reuses_the_exact_ranking(
    scripts: tuple[Path, Path], tmp_path: Path
) -> None:
    tune, reuse = scripts
    env = dict(os.environ)
    env["DNNTUNE_CACHE_DIR"] = str(tmp_path / "cache")
    first = _run(tune, "sweep", env=env)
    assert first == {"winner": "FAKE_ENGINE_C", "outcome": "written"}
    second = _run(reuse, env=env)
    assert second["plan"].startswith("FAKE_ENGINE_C")
    assert second["source"] == "exact_cache"
    assert second["executes"] == 0
    env["DNNTUNE_DISABLE_EXACT_ENGINE_CACHE"] = "1"
    assert _run(reuse, env=env)["source"] is None
