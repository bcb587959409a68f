"""An empty override file (``touch overrides.json``) is named as empty by its readers, not as
"invalid JSON: Expecting value: line 1 column 1 (char 0)"; the writer still starts it afresh
(audit, session 27)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, write_winner
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app
from dnntune.overrides.format import load_file

EMPTY = "the file is empty: an override file is JSON"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


@pytest.mark.parametrize("text", ["", "\n", "\ufeff  \n"], ids=["nothing", "newline", "bom"])
def test_show_says_the_file_is_empty(runner: CliRunner, tmp_path: Path, text: str) -> None:
    path = tmp_path / "overrides.json"
    path.write_text(text, encoding="utf-8")
    res = runner.invoke(app, ["overrides", "show", str(path)])
    assert res.exit_code == 1, res.output
    message = " ".join(res.output.split())
    assert f"{path}: {EMPTY}" in message
    assert "Expecting value" not in message


def test_run_warns_the_variable_names_an_empty_file(
    runner: CliRunner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "overrides.json"
    path.write_text("")
    graph = tmp_path / "conv.json"
    conv_graph().save(graph)
    args = ["run", "-g", str(graph), "--iters", "1", "--warmup", "0", "--no-verify"]
    env = {"DNNTUNE_HEUR_CONFIG_PATH": str(path)}
    with (
        testing.fake_engines(names=[testing.FAKE_ENGINE_A]),
        caplog.at_level(logging.WARNING, logger="dnntune"),
    ):
        res = runner.invoke(app, args, env=env)
    assert res.exit_code == 0, res.output
    warned = [
        r.getMessage() for r in caplog.records if "DNNTUNE_HEUR_CONFIG_PATH" in r.getMessage()
    ]
    assert len(warned) == 1 and EMPTY in warned[0] and "Expecting value" not in warned[0]


def test_the_writer_still_starts_an_empty_file_afresh(tmp_path: Path) -> None:
    path = tmp_path / "overrides.json"
    path.write_text("\n")
    write_winner(conv_graph(), path, "FAKE_A")
    assert [e.engine_name for e in load_file(path).entries] == ["FAKE_A"]
    assert json.loads(path.read_text())["version"] == 2
