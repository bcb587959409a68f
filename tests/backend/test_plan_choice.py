"""backend.plan_choice: a plan built as a value beside a Graph, run as the Graph runs its own."""

from __future__ import annotations

import torch

import dnntune as dt
from dnntune import reference, testing
from dnntune.backend.plan_choice import choose_plan


def _conv_graph(handle: dt.Handle) -> dt.Graph:
    g = dt.Graph("pc", io_data_type=dt.DataType.FLOAT, intermediate_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 4, 5, 5], uid=10)
    w = g.tensor("W", [3, 4, 3, 3], uid=11)
    y = g.conv_fprop(x, w, padding=1)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y").set_uid(12)
    g.build_operation_graph(handle)
    return g


def test_heuristic_choice_is_the_graph_build_choice_with_its_decision() -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_A]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.build_operation_graph(handle)
        choice = choose_plan(g, handle, modes=[dt.HeuristicMode.A])
        g.build(handle, [dt.HeuristicMode.A])
    assert choice.name == g.get_plan_name()
    assert choice.workspace_size == choice.plan.workspace_size
    assert choice.decision is not None
    assert choice.decision.engines[0].name == choice.name
    assert choice.graph is g
    assert choice.plan.origin == (g, handle)


def test_choice_leaves_the_graph_plan_set_alone() -> None:
    """A second plan for a graph that holds plan specs: nothing of the graph's set changes."""
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        specs = list(g.plan_specs)
        heuristic = choose_plan(g, handle, modes=[dt.HeuristicMode.A])
        explicit = choose_plan(g, handle, engine=testing.FAKE_ENGINE_C)
        assert g.plan_specs == specs
        assert g.plan_set.plans is None and g.active_plan is None
        g.add_engine(testing.FAKE_ENGINE_A, {"fake.variant": 1})  # the spec path still open
    assert explicit.name == testing.FAKE_ENGINE_C
    assert explicit.decision is None  # no policy was asked for an explicit engine
    assert heuristic.plan is not explicit.plan


def test_choice_executes_like_the_graph_and_binds_once() -> None:
    handle = dt.create_handle("cpu")
    g = _conv_graph(handle)
    choice = choose_plan(g, handle, engine="TORCH_ENGINE")
    first = reference.make_inputs(g, seed=1)
    choice.execute(handle, first)
    binding = choice._binding
    assert binding is not None
    expected = reference.run(g, {u: t for u, t in first.items() if u != 12})[12].float()
    torch.testing.assert_close(first[12], expected)
    second = reference.make_inputs(g, seed=2)
    choice.execute(handle, second)
    assert choice._binding is binding  # same keys: the bound call, as Graph.execute's fast path
    expected = reference.run(g, {u: t for u, t in second.items() if u != 12})[12].float()
    torch.testing.assert_close(second[12], expected)
    by_tensor = {g.tensor_by_uid(u): t for u, t in second.items()}  # other keys: full check
    by_tensor[g.tensor_by_uid(12)].zero_()
    choice.execute(handle, by_tensor)
    torch.testing.assert_close(second[12], expected)
