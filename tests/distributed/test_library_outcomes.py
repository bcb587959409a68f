"""What rank 0 decides and writes, in one process: candidate mode reports the heuristic pick as
``tune_graph`` does, one graph's failed confirmation fails that graph alone, the payload
carries the cost, the writer records the device of the rank that tuned the graph, and a rank
that could not build the decided plan is that graph's failure, not a disagreement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune import testing
from dnntune.distributed import candidates, library
from dnntune.distributed.env import DistContext
from dnntune.distributed.payload import report_from_payload, report_to_payload
from dnntune.distributed.report import LibraryReport
from dnntune.distributed.writer import Writer
from dnntune.workflows.tuning import GraphTuneReport, TuneOptions, tune_graph

NAMES = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
TIMINGS = {testing.FAKE_ENGINE_C: 0.2}
OPTIONS = TuneOptions(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3)


def _one_rank() -> DistContext:
    return DistContext(0, 1, 0, "cpu", "gloo", 5.0)


def _graphs() -> list[tuple[str, dt.Graph | Exception]]:
    return [(f"g{i}.json", testing.small_matmul_graph(4 + 4 * i, 8, 8)) for i in range(2)]


def test_candidate_mode_reports_the_heuristic_pick_as_tune_graph_does(tmp_path: Path) -> None:
    with testing.fake_engines(names=NAMES, timings=TIMINGS):
        single = tune_graph(testing.small_matmul_graph(4, 8, 8), dt.create_handle("cpu"), OPTIONS)
        (report,) = library.tune_library(
            _graphs()[:1], tmp_path / "o.json", OPTIONS, shard="candidates", ctx=_one_rank()
        ).reports
    assert report.heuristic_plan == single.heuristic_plan == testing.FAKE_ENGINE_A
    assert not report.same_as_heuristic and report.decision == "confirmed"
    assert report.heuristic_time_ms == pytest.approx(single.heuristic_time_ms)
    assert report.winner_retimed_ms == pytest.approx(single.winner_retimed_ms)
    assert report.speedup == pytest.approx(single.speedup)
    assert report.break_even_calls is not None
    assert report.cost["confirm_ms"] > 0.0 and report.cost["compile_ms"] >= 0.0


def test_an_exception_in_one_graphs_confirmation_fails_that_graph_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    confirm = candidates._confirm_merged

    def flaky(item: dt.Graph, *args: Any, **kwargs: Any) -> Any:
        if item.name == "g0":
            raise RuntimeError("device error in confirmation")
        return confirm(item, *args, **kwargs)

    monkeypatch.setattr(candidates, "_confirm_merged", flaky)
    graphs = _graphs()
    for i, (_, g) in enumerate(graphs):
        assert isinstance(g, dt.Graph)
        g.name = f"g{i}"
    out = tmp_path / "o.json"
    with testing.fake_engines(names=NAMES, timings=TIMINGS):
        result = library.tune_library(graphs, out, OPTIONS, shard="candidates", ctx=_one_rank())
    first, second = result.reports
    assert first.error == (
        "rank 0: confirming the winner against the heuristic plan failed: "
        "RuntimeError: device error in confirmation"
    )
    assert second.ok and second.written_to == str(out)
    assert result.decisions == [[""], [testing.FAKE_ENGINE_C]]
    assert len(json.loads(out.read_text())["engine_overrides"]) == 1


def test_the_payload_carries_the_cost() -> None:
    report = GraphTuneReport(graph_name="g", cost={"compile_ms": 1.5, "time_budget_s": 2.0})
    back = report_from_payload(report_to_payload(0, report))
    assert back.cost == report.cost


def test_rank_0_writes_the_device_of_the_rank_that_tuned_the_graph(tmp_path: Path) -> None:
    """Rank 0's own copy of a graph tuned on rank 1 was never built: the entry names rank 1's
    device from the payload, as a one-process run names its own."""
    with testing.fake_engines(names=NAMES, timings=TIMINGS):
        tuned = tune_graph(testing.small_matmul_graph(4, 8, 8), dt.create_handle("cpu"), OPTIONS)
        data = report_to_payload(0, tuned, "Peer CPU")
        out = tmp_path / "o.json"
        exchange = library._Exchange(
            [("g0.json", testing.small_matmul_graph(4, 8, 8))],  # not built on this rank
            _one_rank(),
            OPTIONS,
            Writer(out, True),
            lambda r: None,
            LibraryReport(),
        )
        report = exchange._take(data)
    assert report.written_to == str(out)
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["autotune_metadata"]["device"] == "Peer CPU"


def test_a_rank_that_could_not_build_the_decided_plan_fails_the_graph() -> None:
    winner = dt.AutotuneResult(engine_name="X", succeeded=True)
    built = [{"name": "X", "error": ""}, {"name": "", "error": "engine X is broken here"}]
    decision = candidates._Decision(plan=[1, []])
    message = candidates._candidate_error(winner, [], decision, built)
    assert message.startswith("could not build the decided plan X on rank 1: engine X is broken")
    assert "different" not in message
    assert LibraryReport(decisions=[["X", ""], ["", ""]]).ranks_agree
    assert not LibraryReport(decisions=[["X", "Y"]]).ranks_agree
    split = [{"name": "X", "error": ""}, {"name": "Y", "error": ""}]
    assert "ranks built different plans" in candidates._candidate_error(winner, [], decision, split)
