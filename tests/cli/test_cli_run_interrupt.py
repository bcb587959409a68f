"""Ctrl-C during ``dnntune run`` keeps the graphs finished so far, as ``tune`` and ``bench`` do:
their rows are shown and written to ``--json``, and the exit code is 130 (it printed only
"interrupted", dropping every finished graph and the ``--json`` file: audit, session 27)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dnntune import testing
from dnntune.cli import run_cmd
from dnntune.workflows.heuristic_run import GraphRunReport


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    """``run_graph`` raises KeyboardInterrupt on its ``call``-th call (Ctrl-C mid-graph)."""
    real = run_cmd.run_graph
    calls: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> GraphRunReport:
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_cmd, "run_graph", interrupted)


def test_ctrl_c_shows_and_writes_the_graphs_finished(
    cli, fakes, graph_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupt_at(monkeypatch, 2)
    out = tmp_path / "run.json"
    result = cli("run", "-g", str(graph_dir), "--json", str(out))
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert "mm_bias_relu" in result.stdout and testing.FAKE_ENGINE_A in result.stdout
    assert "interrupted after 1 graph of 2: the graphs finished so far are shown above" in text
    assert f"(and in {out})" in text
    (row,) = json.loads(out.read_text())
    assert row["graph"] == "mm_bias_relu" and row["plan"] == testing.FAKE_ENGINE_A


def test_ctrl_c_before_any_graph_finished_writes_nothing(
    cli, fakes, graph_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupt_at(monkeypatch, 1)
    out = tmp_path / "run.json"
    result = cli("run", "-g", str(graph_dir), "--json", str(out))
    assert result.exit_code == 130, result.output
    assert "interrupted before any graph finished" in " ".join(result.output.split())
    assert not out.exists()
