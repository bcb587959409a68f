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


def test_the_legend_explains_every_star_and_the_oracle_column_only_with_oracle(
    tmp_path: Path,
) -> None:
    """A row capped before --min-time-ms got "*" under a legend that said "noisy or outlier",
    and the legend explained an oracle column that a plain run does not show."""
    graph = tmp_path / "mm.json"
    testing.small_matmul_graph().save(graph)
    args = ["bench", "-g", str(graph), "--warmup", "0", "--iters", "1", "--min-time-ms", "20000"]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C], timings={"FAKE_ENGINE_C": 1.0}):
        result = CliRunner().invoke(app, [*args, "-v"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    output = result.output.replace("\n", "")
    assert "capped at max_iters" in output  # 10,000 samples of 1 ms: not 20,000 ms
    assert "1.000 ms*" in output
    assert "capped sampling" in output
    assert "oracle =" not in output
