"""Arguments that name nothing, or do nothing, are usage errors (exit 2), not silent
defaults: an unset shell variable must never widen what a command reads or tunes (a new-user
audit of the CLI, session 15; each case below ran before its fix)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

Cli = Callable[..., Result]
EXAMPLE = Path(__file__).parents[2] / "examples" / "graphs" / "resnet50_maxpool3x3_s2.json"


@pytest.mark.parametrize("command", ["validate", "run", "tune"])
def test_an_empty_graph_path_is_no_working_folder(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """``-g ""`` read every *.json of the working folder, override files included."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "overrides.json").write_text('{"version": 2, "engine_overrides": []}')
    extra = ["-o", str(tmp_path / "o.json")] if command == "tune" else []
    res = cli(command, "-g", "", *extra)
    assert res.exit_code == 2, res.output
    assert "empty graph path" in res.output


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_engine_filter_that_names_no_engine_is_refused(
    cli: Cli, tmp_path: Path, value: str
) -> None:
    """``--engine ''`` tuned every engine, as if no filter were given."""
    res = cli("tune", "-g", str(EXAMPLE), "--engine", value, "-o", str(tmp_path / "o.json"))
    assert res.exit_code == 2, res.output
    assert "no engine named" in res.output
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    "option", [["--shard", "candidates"], ["--dist-timeout-s", "5"]], ids=lambda o: o[0]
)
def test_distributed_options_without_distributed_are_refused(
    cli: Cli, tmp_path: Path, option: list[str]
) -> None:
    res = cli("tune", "-g", str(EXAMPLE), *option, "-o", str(tmp_path / "o.json"))
    assert res.exit_code == 2, res.output
    assert "applies to a distributed run only" in res.output
