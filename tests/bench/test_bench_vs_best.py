"""The table's ``vs_best`` column compares with the fastest row whose answer is right."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app


def test_a_row_that_failed_validation_is_not_the_best(tmp_path: Path) -> None:
    """A wrong answer twice as fast read 1.00x, and the only correct engine 0.50x."""
    graph = tmp_path / "mm.json"
    testing.small_matmul_graph().save(graph)
    timings = {"FAKE_ENGINE_WRONG": 1.0, "FAKE_ENGINE_C": 2.0}
    with testing.fake_engines(
        names=[testing.FAKE_ENGINE_WRONG, testing.FAKE_ENGINE_C], timings=timings
    ):
        result = CliRunner().invoke(
            app,
            ["bench", "-g", str(graph), "--warmup", "1", "--iters", "3", "--validate", "reference"],
            catch_exceptions=False,
        )
    assert result.exit_code == 3, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if "FAKE_ENGINE" in line}
    wrong, right = lines["FAKE_ENGINE_WRONG"], lines["FAKE_ENGINE_C"]
    assert "failed" in wrong and wrong.rstrip().endswith("-")
    assert "passed" in right and right.rstrip().endswith("1.00x")
