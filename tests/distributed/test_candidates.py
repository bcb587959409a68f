"""Candidate mode in one process: the merged ranking is autotune's own (rank_results), and each
rank tunes its share in a plan set of its own beside the graph (no JSON clone of the graph)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune import testing
from dnntune.autotune.ranking import by_min_time, rank_results
from dnntune.distributed import candidates, library
from dnntune.distributed.env import DistContext
from dnntune.distributed.payload import result_to_dict
from dnntune.workflows.tuning import TuneOptions


def _result(name: str, decision_ms: float, min_ms: float, ok: bool = True) -> dt.AutotuneResult:
    return dt.AutotuneResult(
        engine_name=name,
        decision_time_ms=decision_ms,
        min_time_ms=min_ms,
        succeeded=ok,
        error_message="" if ok else "failed",
    )


def _payloads(*ranks: list[dt.AutotuneResult]) -> list[dict[str, Any]]:
    return [{"results": [result_to_dict(r) for r in rs], "error": ""} for rs in ranks]


def _shape(results: list[dt.AutotuneResult]) -> list[tuple[str, int]]:
    return [(r.engine_name, r.rank) for r in results]


def test_merged_ranking_is_rank_results_over_the_ranks_in_order() -> None:
    """Ties go to the lower rank's result (stable), failures last with rank -1."""
    rank0 = [_result("r0_fast", 1.0, 0.9), _result("r0_fail", 0.0, 0.0, ok=False)]
    rank1 = [_result("r1_tie", 1.0, 0.8), _result("r1_slow", 3.0, 0.5)]
    rank2 = [_result("r2_fail", 0.0, 0.0, ok=False), _result("r2_mid", 2.0, 2.0)]
    merged = candidates._rank_merged(_payloads(rank0, rank1, rank2), dt.AutotuneConfig())
    expected = rank_results([*rank0, *rank1, *rank2])
    assert _shape(merged) == _shape(expected)
    assert _shape(merged) == [
        ("r0_fast", 0),
        ("r1_tie", 1),
        ("r2_mid", 2),
        ("r1_slow", 3),
        ("r0_fail", -1),
        ("r2_fail", -1),
    ]


def test_merged_ranking_follows_the_config_statistic() -> None:
    rank0 = [_result("a", 1.0, 0.9)]
    rank1 = [_result("b", 2.0, 0.5), _result("c", 0.5, 0.0, ok=False)]
    config = dt.AutotuneConfig(ranking_statistic="min")
    merged = candidates._rank_merged(_payloads(rank0, rank1), config)
    assert _shape(merged) == _shape(rank_results([*rank0, *rank1], key=by_min_time))
    assert _shape(merged) == [("b", 0), ("a", 1), ("c", -1)]


def test_no_rank_shares_nothing() -> None:
    assert candidates._rank_merged(_payloads([], []), dt.AutotuneConfig()) == []


def _no_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    def clone(cls: type, text: object) -> dt.Graph:
        raise AssertionError("a graph was cloned through JSON")

    monkeypatch.setattr(dt.Graph, "from_json", classmethod(clone))


def test_candidate_mode_in_one_process_builds_no_second_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graphs = [testing.small_matmul_graph(), testing.small_pointwise_graph()]
    _no_clones(monkeypatch)
    out = tmp_path / "o.json"
    options = TuneOptions(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3)
    timings = {testing.FAKE_ENGINE_A: 1.0, testing.FAKE_ENGINE_B: 3.0, testing.FAKE_ENGINE_C: 0.7}
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings=timings):
        report = library.tune_library(
            [(f"g{i}.json", g) for i, g in enumerate(graphs)],
            out,
            options,
            overwrite=True,
            shard="candidates",
            ctx=DistContext(0, 1, 0, "cpu", "gloo", 5.0),
        )
    assert [r.error for r in report.reports] == ["", ""]
    assert [r.winner_plan for r in report.reports] == [testing.FAKE_ENGINE_C] * 2
    assert report.decisions == [[testing.FAKE_ENGINE_C]] * 2 and report.ranks_agree
    for r in report.reports:
        assert r.confirmation is not None and r.confirmation.speedup is not None
        assert r.results[0].rank == 0 and {x.engine_name for x in r.results} == set(names)
    # the graph's own plan set holds the whole candidate list, as after tune_graph
    assert {s.engine_id for s in graphs[0].plan_specs} == {dt.engine_id(n) for n in names}
    written = json.loads(out.read_text())["engine_overrides"]
    assert [e["engine_name"] for e in written] == [testing.FAKE_ENGINE_C] * 2


def test_a_kept_heuristic_plan_reports_its_own_time() -> None:
    """Candidate mode reports the written plan's time: the heuristic plan's where rank 0's
    confirmation kept it, not the losing challenger's (audit, session 17)."""
    from dnntune.autotune.confirm import Confirmation
    from dnntune.autotune.verdicts import KEPT_SLOWER
    from dnntune.distributed.candidates import _apply_decision, _Decision
    from dnntune.workflows.tune_report import GraphTuneReport

    kept = Confirmation(KEPT_SLOWER, "C", "A", 10, speedup=0.55, winner_ms=1.8, default_ms=1.0)
    a, c = (dt.AutotuneResult(engine_name=n, plan_name=n, succeeded=True) for n in "AC")
    a.rank, c.rank = 0, 1  # _heuristic_first put the kept plan first
    report = GraphTuneReport(graph_name="g", source="g.json", results=[a, c])
    _apply_decision(report, _Decision(confirmation=kept.to_dict(), heuristic_plan="A"))
    report.take_confirmed_times()
    assert report.winner_retimed_ms == 1.0 == report.heuristic_time_ms
    assert report.chosen_plan == "A" and report.chosen_time_ms == 1.0
    # the heuristic plan was no candidate (an engine filter): the winner keeps its own time
    c.rank = 0
    report = GraphTuneReport(graph_name="g", source="g.json", results=[c])
    _apply_decision(report, _Decision(confirmation=kept.to_dict(), heuristic_plan="A"))
    report.take_confirmed_times()
    assert report.winner_plan == "C" and report.winner_retimed_ms == 1.8
    assert report.chosen_plan == "A" and report.chosen_time_ms == 1.0


def test_candidate_mode_confirms_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's confirmation keeps to the budget the ranks left (at least its share), as
    tune_graph's does; it ran the full confirm_budget_ms (audit, session 18)."""
    seen: list[float] = []
    real = candidates._confirm_merged

    def spy(item: Any, handle: Any, options: Any, config: dt.AutotuneConfig, plan: Any) -> Any:
        seen.append(config.confirm_budget_ms)
        return real(item, handle, options, config, plan)

    monkeypatch.setattr(candidates, "_confirm_merged", spy)
    options = TuneOptions(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3, time_budget_s=0.05
    )
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.5}):
        report = library.tune_library(
            [("g.json", testing.small_pointwise_graph())],
            tmp_path / "o.json",
            options,
            overwrite=True,
            shard="candidates",
            ctx=DistContext(0, 1, 0, "cpu", "gloo", 5.0),
        )
    assert [r.error for r in report.reports] == [""]
    assert len(seen) == 1 and seen[0] <= 50.0  # not the 2000 ms of confirm_budget_ms
