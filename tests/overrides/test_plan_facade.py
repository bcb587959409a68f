"""Graph.serialize_plan / Graph.deserialize_plan facade over plan serialization."""

from __future__ import annotations

import json

import pytest

import dnntune as dt
from dnntune import testing


def test_serialize_and_restore_selected_plan() -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.build_operation_graph(handle)
        g.create_execution_plan_ext(testing.FAKE_ENGINE_A, {"fake.variant": 2})
        g.check_support()
        g.build_plans()
        data = g.serialize_plan()
        doc = json.loads(data)
        assert doc["engine_name"] == testing.FAKE_ENGINE_A
        assert {"knob_id": "fake.variant", "type": "int", "value": 2} in doc["knob_settings"]
        restored = testing.small_matmul_graph()
        restored.deserialize_plan(handle, data)
        assert restored.get_plan_name() == g.get_plan_name()
        other = testing.small_matmul_graph(m=4)
        with pytest.raises(dt.InvalidValueError):
            other.deserialize_plan(handle, data)


def test_plan_serialize_method_matches_the_graph_facade() -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.build(handle)
        plan = g.active_plan
        assert plan is not None
        assert json.loads(plan.serialize()) == json.loads(g.serialize_plan())
        restored = testing.small_matmul_graph()
        restored.deserialize_plan(handle, plan.serialize())
        assert restored.get_plan_name() == plan.name


def test_a_plan_compiled_outside_a_graph_cannot_serialize() -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.validate()
        engine = dt.get_registry().get(testing.FAKE_ENGINE_A)
        plan = engine.compile(g, [], handle)
        with pytest.raises(dt.BadStateError, match="not selected through a Graph"):
            plan.serialize()
