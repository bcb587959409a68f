"""``dnntune bench`` through the real entry point when something outside the rows goes wrong:
an error or a Ctrl-C outside the suite loop, a results file that cannot be written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import BENCH_FAST, bench_graph_file, invoke

from dnntune import testing
from dnntune.bench import runner as bench_runner
from dnntune.bench.results import SuiteResult
from dnntune.errors import ConfigFileError

FAST = BENCH_FAST
_graph_file = bench_graph_file
_invoke = invoke


def test_an_internal_error_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench runs in its sub-app's callback, which had no error guard: a bug outside the
    per-graph loop escaped as a raw traceback."""

    def broken(handle: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(bench_runner, "environment", broken)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(_graph_file(tmp_path)), *FAST])
    assert result.exit_code == 1, result.output
    assert "internal error: RuntimeError: boom" in result.output


def test_ctrl_c_before_the_first_graph_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(handle: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_runner, "environment", interrupted)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(_graph_file(tmp_path)), *FAST])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output


def test_a_results_file_that_cannot_be_written_fails_the_run_after_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails mid-run (a full disk, the folder removed) ended the run with a
    traceback: no table, the later graphs never ran. Now every graph runs, the table shows,
    the failed write is named and the exit code is 1, not "Results: <path>" and 0."""
    first, second = _graph_file(tmp_path, "a"), _graph_file(tmp_path, "b")
    out = tmp_path / "r.json"

    def full_disk(self: SuiteResult, path: Any) -> None:
        raise ConfigFileError(f"{path}: cannot write: No space left on device")

    monkeypatch.setattr(SuiteResult, "write", full_disk)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(first), str(second), *FAST, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "No space left on device" in result.output
    assert "were not saved" in result.output
    assert "Results:" not in result.output
    assert "Summary: 2 graph(s), 2 row(s)" in result.output  # both graphs ran and showed


def test_a_write_that_fails_once_and_then_succeeds_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = _graph_file(tmp_path, "a"), _graph_file(tmp_path, "b")
    out = tmp_path / "r.json"
    real_write = SuiteResult.write
    calls = []

    def flaky(self: SuiteResult, path: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise ConfigFileError(f"{path}: cannot write: Input/output error")
        real_write(self, path)

    monkeypatch.setattr(SuiteResult, "write", flaky)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(first), str(second), *FAST, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert len(calls) >= 2 and f"Results: {out}" in result.output.replace("\n", "")
    assert json.loads(out.read_text())["run"]["complete"] is True


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_engine_flag_that_names_no_engine_is_a_usage_error(tmp_path: Path, value: str) -> None:
    """``--engine "$ENGINES"`` with an empty variable benchmarked every engine, exit 0."""
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(_graph_file(tmp_path)), *FAST, "--engine", value])
    assert result.exit_code == 2, result.output
    assert "--engine names no engine" in result.output
    assert "FAKE_ENGINE_C" not in result.output


@pytest.mark.parametrize(
    ("line", "listed"),
    [("engines = []", "[]"), ('engine = [""]', '[""]'), ('engines = [" , "]', '[" , "]')],
)
def test_a_recipe_whose_engine_list_is_empty_is_a_usage_error(
    tmp_path: Path, line: str, listed: str
) -> None:
    """``engines = []`` read as no list at all, so every engine ran (exit 0): a recipe's writer
    meant none, or forgot to fill it in."""
    recipe = tmp_path / "bench.toml"
    recipe.write_text(f'version = 1\ngraphs = ["{_graph_file(tmp_path).name}"]\n{line}\n')
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "--config", str(recipe), *FAST])
    assert result.exit_code == 2, result.output
    key = line.split()[0]
    said = " ".join(result.output.split())
    assert f"--config {recipe}: {key} = {listed} names no engine" in said
    assert f"or delete the {key} line to run every applicable engine" in said
    assert "FAKE_ENGINE_C" not in result.output


def test_an_engine_that_cannot_run_on_this_device_is_a_usage_error(tmp_path: Path) -> None:
    """As tune: ``--engine`` naming only engines that cannot run here exits 2 and says why
    (it printed a "no engines" line per graph and exited 0); naming some of them warns and
    runs the rest."""
    graph = str(_graph_file(tmp_path))
    result = _invoke(["bench", "-g", graph, "--engine", "CUDNN_ENGINE", "--device", "cpu", *FAST])
    assert result.exit_code == 2, result.output
    assert "CUDNN_ENGINE needs cuda, and this run is on cpu" in result.output
    mixed = ["bench", "-g", graph, "--engine", "CUDNN_ENGINE,TORCH_ENGINE", "--device", "cpu"]
    result = _invoke([*mixed, *FAST])
    assert result.exit_code == 0, result.output
    assert "CUDNN_ENGINE needs cuda" in result.output and "left out" in result.output
    assert "TORCH_ENGINE" in result.output
