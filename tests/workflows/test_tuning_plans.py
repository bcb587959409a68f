"""workflows.tuning: the heuristic plan is a value beside the tuned graph (no JSON clone), and
confirm_plans takes plan values as well as graphs."""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune import reference, testing
from dnntune.backend.plan_choice import choose_plan
from dnntune.workflows.tuning import TuneOptions, confirm_plans, heuristic_plan, tune_graph

FAST = TuneOptions(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=3)
TIMINGS = {testing.FAKE_ENGINE_A: 1.0, testing.FAKE_ENGINE_C: 0.25}
NAMES = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]


def _no_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    def clone(cls: type, text: object) -> dt.Graph:
        raise AssertionError("a graph was cloned through JSON")

    monkeypatch.setattr(dt.Graph, "from_json", classmethod(clone))


def test_tune_graph_makes_no_second_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_clones(monkeypatch)
    with testing.fake_engines(timings=TIMINGS, names=NAMES):
        graph = testing.small_pointwise_graph()
        r = tune_graph(graph, dt.create_handle("cpu"), FAST)
    assert r.ok, r.error
    assert r.heuristic_plan == testing.FAKE_ENGINE_A and r.heuristic_error == ""
    assert r.winner_plan == testing.FAKE_ENGINE_C
    assert graph.get_plan_name() == testing.FAKE_ENGINE_C


def test_heuristic_plan_is_one_policy_query_and_leaves_the_graph_alone() -> None:
    with testing.fake_engines(timings=TIMINGS, names=NAMES):
        handle = dt.create_handle("cpu")
        graph = testing.small_pointwise_graph()
        graph.build_operation_graph(handle)
        choice = heuristic_plan(graph, handle, dt.HeuristicMode.A)
    assert choice.name == testing.FAKE_ENGINE_A
    assert choice.decision is not None and choice.decision.policy
    assert graph.plan_set.plans is None and graph.active_plan is None


def test_confirm_plans_on_plan_values_and_on_a_graph() -> None:
    with testing.fake_engines(timings=TIMINGS, names=NAMES):
        handle = dt.create_handle("cpu")
        graph = testing.small_pointwise_graph()
        graph.build_operation_graph(handle)
        pack = reference.make_inputs(graph, handle.device, seed=0)
        heuristic = heuristic_plan(graph, handle, dt.HeuristicMode.A)
        tuned = choose_plan(graph, handle, engine=testing.FAKE_ENGINE_C)
        values = confirm_plans(tuned, heuristic, handle, pack, dt.AutotuneConfig())
        built = testing.small_pointwise_graph()
        built.build_operation_graph(handle)
        built.create_execution_plan_ext(testing.FAKE_ENGINE_C)
        built.build_plans()
        mixed = confirm_plans(built, heuristic, handle, pack, dt.AutotuneConfig())
    for c in (values, mixed):
        assert c.winner == testing.FAKE_ENGINE_C and c.default == testing.FAKE_ENGINE_A
        assert not c.kept_default
        assert c.speedup == pytest.approx(4.0)
