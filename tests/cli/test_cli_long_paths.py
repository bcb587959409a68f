"""A path longer than the file system allows (ENAMETOOLONG) is a usage error naming it, checked
before any work; it was "internal error: OSError: [Errno 36] File name too long" (exit 1), as
pathlib answers "no such file" by itself only for a missing file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

LONG = "o" * 300 + ".json"  # one name: 255 bytes is the usual limit


def _said(result: Result) -> str:
    return " ".join(result.output.replace("\u2502", " ").split())


def _check(result: Result, what: str) -> None:
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert f"{what}: File name too long" in _said(result)


@pytest.mark.parametrize(
    "command",
    [
        ["tune", "-o", "{out}", "-g", "{graph}"],
        ["tune", "-o", "{ok}", "--report", "{out}", "-g", "{graph}"],
        ["run", "--json", "{out}", "-g", "{graph}"],
        ["bench", "-o", "{out}", "-g", "{graph}"],
        ["heuristics", "train", "{overrides}", "-o", "{out}"],
        ["overrides", "merge", "{overrides}", "-o", "{out}"],
    ],
)
def test_an_output_name_too_long(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, command: list[str]
) -> None:
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({"version": 2, "engine_overrides": []}))
    names = {
        "out": str(tmp_path / LONG),
        "ok": str(tmp_path / "o.json"),
        "graph": str(graph_dir / "b_pw_mul.json"),
        "overrides": str(overrides),
    }
    result = cli(*(arg.format(**names) for arg in command))
    _check(result, "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graphs", "overrides.json"]


@pytest.mark.parametrize(
    "command",
    [
        ["run", "-g", "{long}"],
        ["validate", "-g", "{long}"],
        ["validate", "-g", "{long}*"],  # a glob: the literal name is looked up first
        ["tune", "-g", "{long}"],
        ["heuristics", "train", "{long}", "-o", "{model}"],
    ],
)
def test_an_input_name_too_long(
    cli: Callable[..., Result], tmp_path: Path, command: list[str]
) -> None:
    names = {"long": str(tmp_path / LONG), "model": str(tmp_path / "m.json")}
    result = cli(*(arg.format(**names) for arg in command))
    _check(result, "cannot look it up")
