"""Output paths of ``tune --report`` and ``run --json`` are checked before any work, never
overwrite the override file or a graph, and infinite option values are usage errors (an
audit's reproducers, each failing before its fix)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def said(result: Result) -> str:
    return " ".join(result.stderr.replace("\u2502", " ").split())


def test_report_on_the_override_file_is_refused_before_tuning(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    first = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST)
    assert first.exit_code == 0, first.output
    before = out.read_text()
    again = cli("tune", "-g", str(graph_dir), "-o", str(out), "--report", str(out), *FAST)
    assert again.exit_code == 2
    assert "also the override file" in said(again)
    assert out.read_text() == before  # the override file is not replaced by the report
    graph = graph_dir / "b_pw_mul.json"
    on_graph = cli("tune", "-g", str(graph), "-o", str(out), "--report", str(graph), *FAST)
    assert on_graph.exit_code == 2 and "one of the graphs" in said(on_graph)


def test_an_unwritable_report_or_json_is_a_usage_error_before_any_work(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    graph = str(graph_dir / "b_pw_mul.json")
    tune = cli("tune", "-g", graph, "-o", str(tmp_path / "o.json"), "--report", str(folder), *FAST)
    assert tune.exit_code == 2, tune.output  # was "internal error: IsADirectoryError", exit 1
    assert "--report" in said(tune) and not (tmp_path / "o.json").exists()
    run = cli("run", "-g", graph, "--json", str(tmp_path / "nodir" / "sub" / "r.json"))
    assert run.exit_code == 2 or (tmp_path / "nodir" / "sub" / "r.json").exists(), run.output
    run = cli("run", "-g", graph, "--json", str(folder))
    assert run.exit_code == 2, run.output
    assert "--json" in said(run)


def test_report_and_json_are_written_whole(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    tune = cli("tune", "-g", graph, "-o", str(tmp_path / "o.json"), "--report", str(report), *FAST)
    assert tune.exit_code == 0, tune.output
    assert json.loads(report.read_text())[0]["graph"] == "pw_mul"
    results = tmp_path / "run.json"
    run = cli("run", "-g", graph, "--json", str(results))
    assert run.exit_code == 0, run.output
    assert len(json.loads(results.read_text())) == 1


def test_report_never_replaces_a_file_of_another_kind(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    """As run --json and bench -o: --report naming another run's override file or bench
    results replaced it, exit 0; its own earlier report and an empty file are still replaced."""
    graph = str(graph_dir / "b_pw_mul.json")
    other = tmp_path / "other_overrides.json"
    first = cli("tune", "-g", graph, "-o", str(other), *FAST)
    assert first.exit_code == 0, first.output
    before = other.read_text()
    out = str(tmp_path / "o.json")
    refused = cli("tune", "-g", graph, "-o", out, "--report", str(other), *FAST)
    assert refused.exit_code == 2, refused.output
    assert "not a dnntune tune report" in said(refused) and other.read_text() == before
    report = tmp_path / "r.json"
    for _ in range(2):  # its own report again
        again = cli("tune", "-g", graph, "-o", out, "--report", str(report), *FAST)
        assert again.exit_code == 0, again.output
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert cli("tune", "-g", graph, "-o", out, "--report", str(empty), *FAST).exit_code == 0


def test_a_negative_max_input_gb_is_a_usage_error(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    result = cli("run", "-g", graph, "--max-input-gb", "-1")
    assert result.exit_code == 2 and "must be 0 or more" in said(result)


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_max_input_gb_is_a_usage_error(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, value: str
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    for args in (
        ("tune", "-g", graph, "-o", str(tmp_path / "o.json"), *FAST),
        ("run", "-g", graph),
    ):
        result = cli(*args, "--max-input-gb", value)
        assert result.exit_code == 2, result.output  # inf was an OverflowError deep inside
        assert "--max-input-gb" in said(result)
    dist = cli("tune", "-g", graph, "-o", str(tmp_path / "o.json"), "--dist-timeout-s", value)
    assert dist.exit_code == 2 and "--dist-timeout-s" in said(dist)
    assert "finite number" in said(result)  # NaN "should be >= 0" before (session 15)
    if value == "inf":
        assert "finite number" in said(dist)


def test_quiet_tune_prints_no_progress_lines(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    result = cli("-q", "tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), *FAST)
    assert result.exit_code == 0, result.output
    assert "[1/2]" not in result.stderr and "[2/2]" not in result.stderr
    loud = cli("tune", "-g", str(graph_dir), "-o", str(tmp_path / "p.json"), *FAST)
    assert "[1/2]" in loud.stderr


def test_a_path_that_is_there_but_not_a_file_says_so(cli: Callable[..., Result]) -> None:
    result = cli("validate", "-g", "/dev/null")
    assert result.exit_code == 2
    assert "not a regular file" in said(result)
