"""``dnntune tune --distributed`` in one process: the checks a one-process run makes, errors of
ranks other than 0, a failed collective said by the rank it failed on, and rank 0's closing
line in candidate mode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from dnntune.cli import tune_cmd
from dnntune.distributed import DistributedTuneError
from dnntune.distributed.env import DistContext
from dnntune.errors import InvalidValueError

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def test_cuda_only_engine_on_cpu_is_a_usage_error_with_distributed_too(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    args = ("tune", "-g", str(graph_dir), "-o", str(out), "--device", "cpu", *FAST)
    result = cli(*args, "--engine", "CUDNN_ENGINE", "--distributed")
    assert result.exit_code == 2, result.output
    assert "CUDNN_ENGINE needs cuda, and this run is on cpu" in result.output
    assert not out.exists()


@pytest.mark.parametrize(("rank", "said"), [("0", True), ("1", False)])
def test_usage_errors_are_said_by_rank_0_alone(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, rank: str, said: bool
) -> None:
    env: dict[str, str | None] = {"RANK": rank, "WORLD_SIZE": "2"}
    result = cli("tune", "-g", str(graph_dir), "-o", str(tmp_path), "--distributed", env=env)
    assert result.exit_code == 2
    assert ("is a directory" in result.output) is said
    if not said:
        assert result.output == ""


def test_a_rank_whose_collective_failed_says_so(
    cli: Callable[..., Result],
    fakes: Any,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 is gone, so rank 1 prints why it stops: its rank and the round."""
    monkeypatch.setattr(
        tune_cmd, "init_distributed", lambda device, timeout: DistContext(1, 2, 1, "cpu", "", 9)
    )

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise DistributedTuneError("rank 1: collective after graphs 0..1 failed (gone)")

    monkeypatch.setattr(tune_cmd, "tune_library", failing)
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), "--distributed", *FAST)
    assert result.exit_code == 1
    assert "error: rank 1: collective after graphs 0..1 failed (gone)" in result.output
    assert "tuned" not in result.output  # the results are rank 0's to print


@pytest.mark.parametrize(
    "failure",
    [
        DistributedTuneError("rank 0: collective after graphs 0..1 failed (gone)"),
        InvalidValueError("distributed tune: the ranks were given different graphs: ..."),
    ],
)
def test_a_job_that_stops_before_any_graph_keeps_the_report(
    cli: Callable[..., Result],
    fakes: Any,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: Exception,
) -> None:
    """Rank 0's job stopped before any graph finished (a peer gone, or ranks given other
    graphs): an existing --report was replaced by "[]" and "tuned 0 of N graphs" preceded
    the error (audit, session 57). The report is kept, as after Ctrl-C, and only the error
    is said."""
    monkeypatch.setattr(
        tune_cmd, "init_distributed", lambda device, timeout: DistContext(0, 2, 0, "cpu", "", 9)
    )

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr(tune_cmd, "tune_library", failing)
    report, kept = tmp_path / "r.json", '[{"graph": "earlier", "winner": "E"}]\n'
    report.write_text(kept)
    out = tmp_path / "o.json"
    args = ("tune", "-g", str(graph_dir), "-o", str(out), "--report", str(report), *FAST)
    result = cli(*args, "--distributed")
    assert result.exit_code == 1, result.output
    assert report.read_text() == kept
    assert f"--report {report} was not written: no graph finished" in result.output
    assert "tuned 0 of" not in result.output
    assert str(failure) in result.output


def test_candidate_agreement_counts_only_graphs_with_a_winner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A graph without a winner, or one a rank could not build (reported as failed), is
    neither an agreement nor a disagreement."""
    assert tune_cmd._report_agreement([["A", "A"], ["", ""], ["B", ""]], 2) == 0
    said = capsys.readouterr().out
    assert "for all 3 graphs" not in said
    assert "2 ranks built the same winner for every graph tuned (1 of 3;" in said
    assert tune_cmd._report_agreement([["", ""]], 2) == 0
    assert capsys.readouterr().out == ""
    assert tune_cmd._report_agreement([["A", "A"], ["B", "B"]], 2) == 0
    assert "2 ranks built the same winner for all 2 graphs" in capsys.readouterr().out
    assert tune_cmd._report_agreement([["A", "A"]], 2) == 0
    assert capsys.readouterr().out == "2 ranks built the same winner for the graph\n"  # not "all 1"


def test_candidate_agreement_counts_are_singular_for_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The agreement line said "1 of 1 graphs", and "the others failed" for one other graph."""
    assert tune_cmd._report_agreement([["A", "A"], ["", ""]], 2) == 0
    said = capsys.readouterr().out
    assert "(1 of 2; the other failed or had no winner, see above)" in said
    assert tune_cmd._report_agreement([["A", "A"], ["", ""], ["", ""]], 2) == 0
    assert "(1 of 3; the others failed or had no winner, see above)" in capsys.readouterr().out
    assert tune_cmd._report_agreement([["A", "B"]], 2) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "ranks built different winners for 1 of 1 graph (graph indices [0])" in said
