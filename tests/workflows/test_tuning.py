"""workflows.tuning: the report's arithmetic, and tune_graph / tune_graphs on fake engines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import dnntune as dt
from dnntune import testing
from dnntune.workflows.tuning import GraphTuneReport, TuneOptions, tune_graph, tune_graphs

FAST = TuneOptions(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3)


def result(name: str, ms: float, rank: int, succeeded: bool = True) -> dt.AutotuneResult:
    return dt.AutotuneResult(engine_name=name, min_time_ms=ms, rank=rank, succeeded=succeeded)


def report(**kwargs: object) -> GraphTuneReport:
    base: dict[str, object] = {
        "graph_name": "g",
        "results": [result("SLOW", 2.0, 1), result("FAST", 1.0, 0), result("BAD", 0, -1, False)],
        "heuristic_plan": "SLOW",
        "heuristic_time_ms": 2.0,
        "winner_retimed_ms": 1.0,
        "tuning_time_ms": 100.0,
    }
    base.update(kwargs)
    return GraphTuneReport(**base)  # type: ignore[arg-type]


def test_winner_runner_up_margin_speedup_break_even() -> None:
    r = report()
    assert r.ok
    assert r.winner is not None and r.winner.engine_name == "FAST"
    assert r.runner_up is not None and r.runner_up.engine_name == "SLOW"
    assert r.margin == pytest.approx(1.0)
    assert r.speedup == pytest.approx(2.0)
    assert r.saved_per_call_ms == pytest.approx(1.0)
    assert r.break_even_calls == 100  # 100 ms of tuning / 1 ms saved per call


def test_break_even_rounds_up_and_is_at_least_one() -> None:
    assert report(tuning_time_ms=100.5).break_even_calls == 101
    assert report(tuning_time_ms=0.0).break_even_calls == 1


def test_never_breaks_even_when_not_faster() -> None:
    slower = report(heuristic_time_ms=0.9, winner_retimed_ms=1.0)
    assert slower.speedup == pytest.approx(0.9)
    assert slower.break_even_calls is None


def test_same_plan_as_heuristic_is_exactly_one() -> None:
    same = report(heuristic_plan="FAST", heuristic_time_ms=1.3, winner_retimed_ms=1.0)
    assert same.same_as_heuristic
    assert same.speedup == 1.0
    assert same.break_even_calls is None


def test_no_heuristic_and_single_candidate() -> None:
    r = report(results=[result("ONLY", 1.0, 0)], heuristic_plan="", heuristic_time_ms=None)
    assert r.runner_up is None and r.margin is None
    assert r.speedup is None and r.break_even_calls is None


def test_failed_report() -> None:
    r = GraphTuneReport(graph_name="g", error="no engine supports graph 'g'")
    assert not r.ok
    d = r.to_dict()
    assert d["ok"] is False and d["winner"] is None and d["error"].startswith("no engine")
    json.dumps(d)


def test_options_to_config() -> None:
    cfg = TuneOptions(
        mode=dt.TuneMode.EXHAUSTIVE,
        engines=["FAKE_ENGINE_A", "0x10", "42"],
        max_iterations=2,
        cache_mode="cold",
        verify=False,
    ).autotune_config()
    assert cfg.mode is dt.TuneMode.EXHAUSTIVE
    assert cfg.engine_id_filter == [dt.engine_id("FAKE_ENGINE_A"), 16, 42]
    assert cfg.max_iterations == 2 and cfg.window_size == 2  # clamped to stay valid
    assert cfg.cache_mode == "cold" and cfg.verify is False


def test_options_reject_bad_values() -> None:
    with pytest.raises(dt.InvalidValueError):
        TuneOptions(warmup_iterations=-1).autotune_config()


def test_tune_graph_on_fakes(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    with testing.fake_engines(
        timings={testing.FAKE_ENGINE_C: 0.25}, names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    ):
        handle = dt.create_handle("cpu")
        graph = testing.small_pointwise_graph()
        r = tune_graph(graph, handle, FAST, output=out, source="mem")
    assert r.ok, r.error
    assert r.winner_plan == testing.FAKE_ENGINE_C
    assert r.heuristic_plan == testing.FAKE_ENGINE_A
    assert r.heuristic_time_ms == pytest.approx(1.0)
    assert r.winner_retimed_ms == pytest.approx(0.25)
    assert r.speedup == pytest.approx(4.0)
    assert r.graph_key == graph.key()
    assert r.written_to == str(out)
    assert json.loads(out.read_text())["engine_overrides"][0]["engine_name"] == "FAKE_ENGINE_C"
    # the tuned graph keeps the winner for execute()
    assert graph.get_plan_name() == testing.FAKE_ENGINE_C


def test_an_engine_filter_without_the_heuristic_engine_is_confirmed_against_it(
    tmp_path: Path,
) -> None:
    """--engine C, where the heuristic pick is A: the session's default was C itself, so the
    table said "(same), 1.00x" and a plan 8-20x slower than the heuristic pick was written."""
    out = tmp_path / "o.json"
    with testing.fake_engines(
        timings={testing.FAKE_ENGINE_C: 4.0}, names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    ):
        opts = TuneOptions(
            strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
            timed_iterations=3,
            engines=[testing.FAKE_ENGINE_C],
        )
        r = tune_graph(testing.small_pointwise_graph(), dt.create_handle("cpu"), opts, output=out)
    assert r.ok, r.error
    assert r.heuristic_plan == testing.FAKE_ENGINE_A
    assert r.winner_plan == testing.FAKE_ENGINE_C
    assert not r.same_as_heuristic
    assert r.decision == "kept_default_slower" and r.kept_heuristic
    assert r.speedup == 1.0 and r.saved_per_call_ms == 0.0 and r.break_even_calls is None
    assert r.written_to == "" and not out.exists()  # the slower plan is not written
    # each plan with its own confirmed time: the kept heuristic plan's is not the winner's
    assert r.chosen_plan == testing.FAKE_ENGINE_A
    assert r.chosen_time_ms == pytest.approx(1.0) == r.heuristic_time_ms
    assert r.winner_retimed_ms == pytest.approx(4.0) == r.winner_time_ms
    d = r.to_dict()
    assert d["winner"]["plan"] == testing.FAKE_ENGINE_C
    assert d["winner_retimed_ms"] == pytest.approx(4.0)
    assert d["chosen_plan"] == testing.FAKE_ENGINE_A and d["chosen_time_ms"] == pytest.approx(1.0)


def test_tune_graph_without_output_writes_nothing(tmp_path: Path) -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        r = tune_graph(testing.small_matmul_graph(), dt.create_handle("cpu"), FAST)
    assert r.ok and r.written_to == ""
    assert list(tmp_path.iterdir()) == []


def test_tune_graph_failure_is_data() -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_FAILS]):
        r = tune_graph(testing.small_pointwise_graph(), dt.create_handle("cpu"), FAST)
    assert not r.ok
    assert r.error
    assert len(r.results) == 1 and not r.results[0].succeeded


def test_a_graph_with_compiled_plans_is_refused_in_tune_graphs_terms() -> None:
    """The quick start's graph, built on the heuristic path, then given to tune_graph: the
    report said 'add_engine_configs: execution plans already exist', a call the user never
    made, after making inputs and the heuristic plan (new-user audit)."""
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        handle = dt.create_handle("cpu")
        graph = testing.small_pointwise_graph().build(handle)
        r = tune_graph(graph, handle, FAST)
        assert not r.ok
        assert r.error.startswith("tune_graph: graph ")
        assert "already holds execution plans" in r.error
        assert "Graph.from_json(graph.to_json())" in r.error
        assert r.heuristic_plan == ""  # refused before any work
        assert graph.get_plan_name() == testing.FAKE_ENGINE_A  # its plan is untouched
        fresh = tune_graph(dt.Graph.from_json(graph.to_json()), handle, FAST)
    assert fresh.ok, fresh.error


def test_tune_graphs_goes_on_after_a_bad_item(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    started: list[str] = []
    items = [
        ("bad.json", ValueError("nodes[0]: broken")),
        ("pw", testing.small_pointwise_graph()),
        ("mm", testing.small_matmul_graph()),
    ]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        reports = list(
            tune_graphs(
                items, dt.create_handle("cpu"), FAST, out, overwrite=True, on_start=started.append
            )
        )
    assert started == ["bad.json", "pw", "mm"]
    assert [r.ok for r in reports] == [False, True, True]
    assert reports[0].error == "nodes[0]: broken" and reports[0].graph_name == "bad"
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2


def test_tune_graphs_turns_a_bug_into_a_failed_report(monkeypatch: pytest.MonkeyPatch) -> None:
    import dnntune.workflows.tuning as tuning

    def broken(*args: object, **kwargs: object) -> GraphTuneReport:
        raise TypeError("boom")

    monkeypatch.setattr(tuning, "tune_graph", broken)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        (r,) = tune_graphs([("x", testing.small_pointwise_graph())], dt.create_handle("cpu"))
    assert not r.ok
    assert r.error == "internal error: TypeError: boom"


def test_the_confirmation_after_the_session_keeps_to_the_budget_and_is_counted() -> None:
    """--engine C leaves the heuristic pick A out, so tune_graph confirms C against A itself:
    that confirmation ran the full confirm_budget_ms (2 s) whatever --budget-s said, and
    its time was missing from the cost (audit, session 18). The two plans are too noisy to
    tell apart, so only the budget stops the rounds."""
    import random

    rng = random.Random(1)
    timings = {
        name: [round(1.0 + rng.random(), 3) for _ in range(97)]
        for name in (testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C)
    }
    opts = TuneOptions(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        timed_iterations=3,
        engines=[testing.FAKE_ENGINE_C],
        time_budget_s=0.05,
    )
    with testing.fake_engines(names=list(timings), timings=timings):
        r = tune_graph(testing.small_pointwise_graph(), dt.create_handle("cpu"), opts)
    c = r.confirmation
    assert r.ok and c is not None and c.default == testing.FAKE_ENGINE_A
    assert c.verdict == "kept_default_unsure"
    assert c.rounds == dt.AutotuneConfig().confirm_rounds  # the minimum: the budget was spent
    assert c.time_ms < 200.0  # not the 2 s of confirm_budget_ms
    assert r.cost["confirm_ms"] == pytest.approx(c.time_ms)
    assert r.cost["budget_used_s"] >= c.time_ms / 1e3


def test_confirm_config_caps_the_confirmation_by_the_budget() -> None:
    from dnntune.workflows.tuning import confirm_config

    plain = dt.AutotuneConfig()
    assert confirm_config(plain, 5.0) is plain  # no budget: unchanged
    budgeted = dt.AutotuneConfig(time_budget_s=1.0)
    assert confirm_config(budgeted, 0.5).confirm_budget_ms == pytest.approx(500.0)
    # spent: the confirmation's share is left (15 %)
    assert confirm_config(budgeted, 3.0).confirm_budget_ms == pytest.approx(150.0)
    assert confirm_config(dt.AutotuneConfig(time_budget_s=60.0), 0.0).confirm_budget_ms == 2000.0


def test_saved_time_and_break_even_follow_the_paired_speedup() -> None:
    """A confirmed win's saving per call and break-even come from the confirmation's paired
    speedup, as its "faster 1.14x" does: two separate medians of a noisy clock can say the
    winner is slower (here 1.05 against 1.0 ms) while the paired rounds say 1.14x faster,
    which printed "faster 1.14x" beside a break-even of "never"."""
    from dnntune.autotune.confirm import Confirmation

    confirmed = Confirmation(verdict="confirmed", winner="FAST", default="SLOW", speedup=1.14)
    r = report(heuristic_time_ms=1.0, winner_retimed_ms=1.05, confirmation=confirmed)
    assert r.speedup == pytest.approx(1.14)
    assert r.saved_per_call_ms == pytest.approx(1.05 * 0.14)
    assert r.break_even_calls == math.ceil(100.0 / (1.05 * 0.14))
    slower = Confirmation(verdict="confirmed", winner="FAST", default="SLOW", speedup=0.97)
    r = report(heuristic_time_ms=1.1, winner_retimed_ms=1.0, confirmation=slower)
    assert r.saved_per_call_ms is not None and r.saved_per_call_ms < 0
    assert r.break_even_calls is None


@pytest.mark.parametrize(
    "options",
    [
        TuneOptions(run_budget_s=float("nan")),
        TuneOptions(time_budget_s=float("nan")),
        TuneOptions(time_budget_s=0),
        TuneOptions(run_budget_s=True),
        TuneOptions(time_budget_s=True),
    ],
)
def test_tune_graphs_refuses_a_bad_budget_once_as_the_callers_error(options: TuneOptions) -> None:
    """Each graph's report read "internal error: InvalidValueError: ..." and the library went
    on; ``run_budget_s=True`` was taken as one second (new-user audit, session 56)."""
    graphs = [("a", testing.small_pointwise_graph()), ("b", testing.small_pointwise_graph())]
    with pytest.raises(dt.InvalidValueError, match="budget_s must be"):
        list(tune_graphs(graphs, dt.create_handle("cpu"), options))


def test_a_budget_too_large_names_the_limit() -> None:
    """1e12 s is finite: "must be a finite number" alone was untrue for it."""
    with pytest.raises(dt.InvalidValueError, match=r"below 1e\+12, got 1000000000000\.0"):
        TuneOptions(time_budget_s=1e12).autotune_config()


def test_a_run_budget_is_split_over_a_list_of_graphs_without_total() -> None:
    """``tune_graphs(graphs_list, handle, TuneOptions(run_budget_s=...))`` gave the first graph
    the whole run budget and the others 1 ms each: ``total`` was needed to know how many were
    left, and a library caller passing a list had no reason to give it (new-user audit,
    session 61). A list's length is now the total."""
    graphs = [(name, testing.small_pointwise_graph()) for name in ("a", "b", "c")]
    options = TuneOptions(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3, run_budget_s=600.0
    )
    shares = [
        r.cost["time_budget_s"] for r in tune_graphs(graphs, dt.create_handle("cpu"), options)
    ]
    assert len(shares) == 3
    # each graph's share is what is left over the graphs left: about 200 s, 300 s and 600 s
    # of the 600 s (each graph spends seconds at most); the old code gave each one all of it
    assert 150.0 < shares[0] <= 200.0
    assert 200.0 < shares[1] <= 300.0
    assert 400.0 < shares[2] <= 600.0
