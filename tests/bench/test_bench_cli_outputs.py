"""``dnntune bench -o``: what the results file may replace, checked before any graph runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dnntune import testing
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


def test_a_folder_given_to_output_suggests_a_results_file_name(tmp_path: Path) -> None:
    """The suggestion was overrides.json, the name of tune's file, not of bench results."""
    folder = tmp_path / "out.json"
    folder.mkdir()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(_graph_file(tmp_path)), *FAST, "-o", str(folder)])
    assert result.exit_code == 2, result.output
    output = result.output.replace("\n", "")
    assert "is a directory" in output and str(folder / "results.json") in output
    assert "overrides.json" not in output
