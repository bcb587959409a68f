"""``run --json`` and ``tune --report``: never replace the override file read or a file of
another kind, and a results file that cannot be written fails the command (audit, session 18;
each test fails before its fix)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import testing
from dnntune.errors import ConfigFileError

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def said(result: Result) -> str:
    return " ".join(result.stderr.replace("\u2502", " ").split())


def _tuned(cli: Callable[..., Result], graph: str, out: Path) -> str:
    first = cli("tune", "-g", graph, "-o", str(out), *FAST)
    assert first.exit_code == 0, first.output
    return out.read_text()


def test_json_on_the_override_file_read_is_a_usage_error(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    out = tmp_path / "ov.json"
    before = _tuned(cli, graph, out)
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(out))
    run = cli("run", "-g", graph, "--json", str(out))
    assert run.exit_code == 2, run.output
    assert "override file this run reads" in said(run)
    assert out.read_text() == before


def test_json_refuses_to_replace_a_file_that_is_not_run_results(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    out = tmp_path / "ov.json"
    before = _tuned(cli, graph, out)
    run = cli("run", "-g", graph, "--json", str(out))  # DNNTUNE_HEUR_CONFIG_PATH unset
    assert run.exit_code == 2, run.output
    assert "not a dnntune run results file" in said(run)
    assert out.read_text() == before
    results = tmp_path / "r.json"
    assert cli("run", "-g", graph, "--json", str(results)).exit_code == 0
    again = cli("run", "-g", graph, "--json", str(results))  # its own kind: replaced
    assert again.exit_code == 0, again.output
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert cli("run", "-g", graph, "--json", str(empty)).exit_code == 0
    assert len(json.loads(empty.read_text())) == 1


def _refuse_write(path: object, text: str) -> None:
    raise ConfigFileError(f"{path}: cannot write: File exists")


def test_a_json_that_cannot_be_written_fails_run(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("dnntune.cli.run_cmd.atomic_write_text", _refuse_write)
    run = cli("run", "-g", str(graph_dir / "b_pw_mul.json"), "--json", str(tmp_path / "r.json"))
    assert run.exit_code == 1, run.output
    assert "--json:" in said(run) and "cannot write" in said(run)


def test_a_report_that_cannot_be_written_fails_tune(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("dnntune.cli.tune_view.atomic_write_text", _refuse_write)
    graph = str(graph_dir / "b_pw_mul.json")
    report = str(tmp_path / "rep.json")
    tune = cli("tune", "-g", graph, "-o", str(tmp_path / "o.json"), "--report", report, *FAST)
    assert tune.exit_code == 1, tune.output
    assert "--report:" in said(tune)


def test_a_directory_given_to_json_suggests_a_results_file_name(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "somedir"
    folder.mkdir()
    graph = str(graph_dir / "b_pw_mul.json")
    run = cli("run", "-g", graph, "--json", str(folder))
    assert run.exit_code == 2, run.output
    assert "run_results.json" in said(run) and "overrides.json" not in said(run)
    tune = cli("tune", "-g", graph, "-o", str(tmp_path / "o.json"), "--report", str(folder))
    assert tune.exit_code == 2, tune.output
    assert "tune_report.json" in said(tune) and "overrides.json" not in said(tune)
