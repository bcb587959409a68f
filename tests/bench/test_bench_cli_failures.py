"""``dnntune bench`` through the real entry point when something outside the rows goes wrong:
an error or a Ctrl-C outside the suite loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dnntune import testing
from dnntune.bench import runner as bench_runner
from dnntune.cli.app import app

FAST = ["--warmup", "1", "--iters", "3"]


def _graph_file(tmp_path: Path, name: str = "mm") -> Path:
    g = testing.small_matmul_graph()
    g.name = name
    path = tmp_path / f"{name}.json"
    g.save(path)
    return path


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args, catch_exceptions=False)


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
