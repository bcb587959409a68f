"""An option given another option's name as its value (``run --json -g g.json``: ``--json`` is a
flag of ``engines``) is a usage error naming both; click took the next word as the value, so the
results went to a file named ``-g``, the graph ran as a positional path, exit 0."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result


@pytest.mark.parametrize(
    ("command", "option", "taken"),
    [
        (["run", "--json", "-g", "{graph}"], "--json", "-g"),
        (["tune", "-o", "-g", "{graph}"], "--output", "-g"),
        (["tune", "-g", "{graph}", "--report", "--details"], "--report", "--details"),
        (["bench", "-o", "--graph", "{graph}"], "--output", "--graph"),
        (["heuristics", "train", "-o", "--json", "{graph}"], "--output", "--json"),
        (["overrides", "merge", "{graph}", "-o", "--wildcard"], "--output", "--wildcard"),
    ],
)
def test_an_option_name_is_no_value(
    cli: Callable[..., Result],
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    option: str,
    taken: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    graph = str(graph_dir / "b_pw_mul.json")
    result = cli(*(arg.format(graph=graph) for arg in command))
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("\u2502", " ").split())
    assert f"got the option {taken} as its value; give {option} a value before it" in said
    assert sorted(os.listdir(tmp_path)) == ["graphs"]  # nothing written, to `-g` or elsewhere


def test_values_that_only_look_like_options_pass(
    cli: Callable[..., Result], graph_dir: Path
) -> None:
    result = cli("run", "-g", str(graph_dir / "b_pw_mul.json"), "--iters", "1", "--seed", "-1")
    assert result.exit_code == 0, result.output
