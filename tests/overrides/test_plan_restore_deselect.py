"""Graph.deserialize_plan honours the graph's deselect criteria, as the plan-building paths do.

A serialized plan of an engine the graph deselected, or with a workspace over the graph's
limit, was restored and run (audit): the deselection must hold for a restored plan too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import dnntune as dt
from dnntune import testing

A = testing.FAKE_ENGINE_A
WORKSPACE = torch.empty(4096, dtype=torch.uint8)


@pytest.fixture(autouse=True)
def _fakes() -> Iterator[None]:
    with testing.fake_engines(names=[A, testing.FAKE_ENGINE_C]):
        yield


@pytest.fixture
def handle() -> dt.Handle:
    return dt.create_handle("cpu")


@pytest.fixture
def data(handle: dt.Handle) -> str:
    g = testing.small_matmul_graph()
    g.build_operation_graph(handle)
    g.create_execution_plan_ext(A, {"fake.variant": 2})
    g.build_plans()
    assert g.get_workspace_size() == 1024
    return g.serialize_plan()


@pytest.mark.parametrize(
    "engine", [A, dt.engine_id(A), str(dt.engine_id(A))], ids=["name", "id", "id-text"]
)
def test_a_deselected_engine_is_refused(handle: dt.Handle, data: str, engine: str | int) -> None:
    g = testing.small_matmul_graph().deselect_engines([engine])
    with pytest.raises(
        dt.InvalidValueError,
        match=r"Plan barred: engine FAKE_ENGINE_A deselected by deselect_engines\(\); restore "
        r"a plan of an engine the graph allows, or build one",
    ):
        g.deserialize_plan(handle, data)
    assert g.active_plan is None


def test_deselecting_another_engine_changes_nothing(handle: dt.Handle, data: str) -> None:
    g = testing.small_matmul_graph().deselect_engines([testing.FAKE_ENGINE_C])
    g.deselect_workspace_greater_than(1024)  # exactly the plan's workspace: allowed
    g.deserialize_plan(handle, data)
    assert g.get_plan_name() == "FAKE_ENGINE_A[fake.variant=2]"
    g.execute(handle, testing.make_pack(g), WORKSPACE)


def test_a_workspace_over_the_limit_is_refused(handle: dt.Handle, data: str) -> None:
    g = testing.small_matmul_graph().deselect_workspace_greater_than(1023)
    with pytest.raises(
        dt.InvalidValueError,
        match=r"Plan barred: workspace 1024 bytes is greater than the "
        r"deselect_workspace_greater_than limit 1023; raise the limit",
    ):
        g.deserialize_plan(handle, data)
    assert g.active_plan is None


def test_a_refused_restore_keeps_the_plan_selected_before(handle: dt.Handle, data: str) -> None:
    g = testing.small_matmul_graph()
    g.build_operation_graph(handle)
    g.create_execution_plan_ext(testing.FAKE_ENGINE_C)
    g.build_plans()
    g.deselect_engines([A])
    with pytest.raises(dt.InvalidValueError, match="Plan barred"):
        g.deserialize_plan(handle, data)
    assert g.get_plan_name() == testing.FAKE_ENGINE_C


def test_deselecting_the_restored_plans_engine_bars_it(handle: dt.Handle, data: str) -> None:
    """As for built plans: deselect_engines() after the restore bars the plan at once."""
    g = testing.small_matmul_graph()
    g.deserialize_plan(handle, data)
    pack = testing.make_pack(g)
    g.execute(handle, pack, WORKSPACE)  # binds the fast path too
    g.deselect_engines([A])
    with pytest.raises(
        dt.InvalidValueError,
        match=r"plan FAKE_ENGINE_A\[fake.variant=2\]: Plan barred: engine FAKE_ENGINE_A "
        r"deselected by deselect_engines\(\)",
    ):
        g.execute(handle, pack, WORKSPACE)
