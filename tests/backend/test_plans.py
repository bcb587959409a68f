"""The compiled-plan collection: deselect criteria, stable indices, barred plans.

Three small engines (TORCH_ENGINE's lowering under other names) report workspaces of 0 bytes,
1 KiB and 1 MiB, so that every workspace threshold can be exercised on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch

import dnntune as dt
from dnntune import reference
from dnntune.backend.engine import Plan, engine_id
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.plans import DeselectCriteria
from dnntune.graph.ir import OpGraph
from dnntune.providers.torch_eager import TorchEngine

SIZES = {"WS_SMALL": 0, "WS_MID": 1024, "WS_BIG": 1 << 20}


class SizedEngine(TorchEngine):
    """TORCH_ENGINE under another name, claiming a fixed workspace."""

    provider = "test"

    def __init__(self, name: str, workspace_bytes: int) -> None:
        self.name = name
        self.workspace_bytes = workspace_bytes

    def estimate_workspace_size(self, graph: OpGraph, knob_settings: Sequence[KnobSetting]) -> int:
        return self.workspace_bytes

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        plan = super().compile(graph, knob_settings, handle)
        plan.workspace_size = self.workspace_bytes
        return plan


@pytest.fixture(autouse=True)
def sized_engines() -> Iterator[None]:
    engines = [SizedEngine(name, size) for name, size in SIZES.items()]
    with dt.get_registry().extra_engines(engines, exclusive=True):
        yield


@pytest.fixture
def graph(cpu_handle: dt.Handle) -> dt.Graph:
    g = dt.Graph("tanh_add", io_data_type=dt.DataType.FLOAT)
    x, b = g.tensor("X", [2, 8]), g.tensor("B", [1, 8])
    y = g.pointwise(x, b, mode=dt.PointwiseMode.ADD)
    g.pointwise(y, mode=dt.PointwiseMode.TANH_FWD).set_output(True)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    return g


def _pack(g: dt.Graph) -> dict[int, torch.Tensor]:
    return reference.make_inputs(g)


WORKSPACE = torch.empty(1 << 20, dtype=torch.uint8)


def test_plans_come_in_registration_order(graph: dt.Graph) -> None:
    assert graph.get_execution_plan_count() == 3
    assert [graph.get_plan_name_at_index(i) for i in range(3)] == list(SIZES)
    assert [graph.get_workspace_size_plan_at_index(i) for i in range(3)] == list(SIZES.values())


def test_deselected_engine_keeps_its_index_and_is_barred(
    graph: dt.Graph, cpu_handle: dt.Handle
) -> None:
    graph.deselect_engines(["WS_MID"])
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    assert graph.get_execution_plan_count() == 3
    assert graph.get_plan_name_at_index(1) == "WS_MID"
    pack = _pack(graph)
    for i in (0, 2):
        graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, i)
    with pytest.raises(
        dt.InvalidValueError, match=r"plan 1 \(WS_MID\): Plan barred: engine WS_MID"
    ):
        graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, 1)
    with pytest.raises(dt.InvalidValueError, match="Plan barred"):
        graph.build_plan_at_index(1)


def test_engine_deselection_is_a_union_of_names_and_ids(graph: dt.Graph) -> None:
    graph.deselect_engines(["WS_SMALL"])
    graph.deselect_engines([engine_id("WS_BIG")])
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    assert graph.get_plan_name() == "WS_MID"
    for i in (0, 2):
        with pytest.raises(dt.InvalidValueError, match="deselected by deselect_engines"):
            graph.build_plan_at_index(i)


def test_engine_ids_as_hex_and_decimal_strings(graph: dt.Graph) -> None:
    graph.deselect_engines([hex(engine_id("WS_SMALL") % 2**64), str(engine_id("WS_MID"))])
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    assert graph.get_plan_name() == "WS_BIG"


@pytest.mark.parametrize(
    ("limits", "barred"),
    [((0, 2048), {2}), ((1 << 30, 0), {1, 2}), ((512, 1 << 20), set())],
    ids=["loosen", "tighten", "exact"],
)
def test_workspace_threshold_last_write_wins(
    graph: dt.Graph, cpu_handle: dt.Handle, limits: tuple[int, int], barred: set[int]
) -> None:
    for limit in limits:
        graph.deselect_workspace_greater_than(limit)
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    pack = _pack(graph)
    for i in range(3):
        if i in barred:
            with pytest.raises(
                dt.InvalidValueError,
                match="is greater than the deselect_workspace_greater_than limit",
            ):
                graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, i)
        else:
            graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, i)
    built = [i for i in range(3) if i not in barred]
    assert graph.get_autotune_workspace_size() == max(list(SIZES.values())[i] for i in built)


def test_barred_plans_stay_barred_across_builds(graph: dt.Graph, cpu_handle: dt.Handle) -> None:
    graph.deselect_workspace_greater_than(2048)
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    with pytest.raises(dt.InvalidValueError, match="Plan barred"):
        graph.execute_plan_at_index(cpu_handle, _pack(graph), WORKSPACE, 2)


def test_thresholds_after_compilation_do_not_touch_compiled_plans(
    graph: dt.Graph, cpu_handle: dt.Handle
) -> None:
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    graph.deselect_workspace_greater_than(0)
    graph.execute_plan_at_index(cpu_handle, _pack(graph), WORKSPACE, 2)


def test_an_engine_deselected_after_its_plans_were_built_is_barred(
    graph: dt.Graph, cpu_handle: dt.Handle
) -> None:
    """Deselecting the engine of built plans bars them at once: execute() and
    execute_plan_at_index() ran the deselected engine's plan until something rebuilt it."""
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    pack = _pack(graph)
    graph.execute(cpu_handle, pack, WORKSPACE)
    assert graph.get_plan_name() == "WS_SMALL"
    graph.deselect_engines(["WS_SMALL"])
    with pytest.raises(dt.InvalidValueError, match="Plan barred: engine WS_SMALL deselected"):
        graph.execute(cpu_handle, pack, WORKSPACE)
    with pytest.raises(dt.InvalidValueError, match=r"plan 0 \(WS_SMALL\): Plan barred"):
        graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, 0)
    graph.execute_plan_at_index(cpu_handle, pack, WORKSPACE, 1)
    graph.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)  # picks the next one
    assert graph.get_plan_name() == "WS_MID"
    graph.execute(cpu_handle, pack, WORKSPACE)


def test_heuristics_choice_skips_deselected_engines(graph: dt.Graph, cpu_handle: dt.Handle) -> None:
    graph.deselect_engines(["WS_SMALL"])
    graph.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    assert graph.get_plan_name() == "WS_MID"
    with pytest.raises(dt.BadStateError, match=r"plan 2 \(WS_BIG\) is not compiled"):
        graph.execute_plan_at_index(cpu_handle, _pack(graph), WORKSPACE, 2)


def test_everything_deselected_fails_the_build_with_reasons(graph: dt.Graph) -> None:
    graph.deselect_engines(["WS_SMALL", "WS_MID"]).deselect_workspace_greater_than(10)
    with pytest.raises(
        dt.NotSupportedError,
        match=r"no plan could be built .*WS_BIG: Plan barred: "
        r"workspace 1048576 bytes",
    ):
        graph.build_plans(dt.BuildPlanPolicy.ALL)


def test_execute_checks_the_workspace(graph: dt.Graph, cpu_handle: dt.Handle) -> None:
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    with pytest.raises(
        dt.InvalidValueError,
        match=r"plan WS_MID needs a workspace of 1024 bytes, "
        r"got 16",
    ):
        graph.execute_plan_at_index(cpu_handle, _pack(graph), torch.empty(16, dtype=torch.uint8), 1)


@pytest.mark.parametrize("index", [-1, 3, 100])
def test_out_of_range_indices(graph: dt.Graph, cpu_handle: dt.Handle, index: int) -> None:
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    message = f"plan index {index} is out of range; the graph has 3 plan"
    with pytest.raises(dt.InvalidValueError, match=message):
        graph.execute_plan_at_index(cpu_handle, _pack(graph), WORKSPACE, index)
    with pytest.raises(dt.InvalidValueError, match=message):
        graph.build_plan_at_index(index)
    with pytest.raises(dt.InvalidValueError, match=message):
        graph.get_workspace_size_plan_at_index(index)
    with pytest.raises(dt.InvalidValueError, match=message):
        graph.get_plan_name_at_index(index)


def test_non_int_index_is_refused(graph: dt.Graph) -> None:
    with pytest.raises(dt.InvalidValueError, match="plan index must be an int"):
        graph.build_plan_at_index(True)


def test_deselect_criteria_validation() -> None:
    criteria = DeselectCriteria()
    with pytest.raises(dt.InvalidValueError, match="expected bytes >= 0, got -1"):
        criteria.set_workspace_limit(-1)
    criteria.add_engines("WS_MID")  # a single name is one engine, not characters
    assert criteria.engine_ids == {engine_id("WS_MID")}


def test_one_heuristic_mode_is_taken_as_a_list_of_it_and_anything_else_is_named(
    cpu_handle: dt.Handle,
) -> None:
    """``create_execution_plans(HeuristicMode.A)`` (one mode, not cuDNN's list of them) lists
    the same plans as ``[HeuristicMode.A]``; it raised ``TypeError: 'HeuristicMode' object is
    not iterable`` (new-user audit). A value that is no mode (a string) is named with the modes
    to give."""

    def planned(modes: object) -> list[str]:
        g = dt.Graph("one_mode", io_data_type=dt.DataType.FLOAT)
        x = g.tensor("X", [2, 8])
        g.pointwise(x, mode=dt.PointwiseMode.TANH_FWD).set_output(True)
        g.build_operation_graph(cpu_handle)
        g.create_execution_plans(modes)  # type: ignore[arg-type]
        return [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]

    assert planned(dt.HeuristicMode.A) == planned([dt.HeuristicMode.A])
    assert planned(dt.HeuristicMode.FALLBACK) == planned((dt.HeuristicMode.FALLBACK,))
    for wrong in ("a", ["a"], 3):
        with pytest.raises(dt.InvalidValueError, match=r"HeuristicMode\.A.*\[HeuristicMode\.A\]"):
            planned(wrong)


class _NoKernelEngine(SizedEngine):
    """A SizedEngine whose plans never build (as TORCH_COMPILE_ENGINE's when Dynamo refuses)."""

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        raise dt.NotSupportedError(f"{self.name}: no kernel for this graph (test engine)")


def test_executing_a_plan_that_failed_to_build_says_why(cpu_handle: dt.Handle) -> None:
    """build_plans(ALL) skips a plan that fails to build, as cuDNN frontend does; executing it
    by index said 'is not compiled: call build_plans(ALL) ... first' to a caller who had just
    done that, and not why (new-user audit: an NHWC graph's TORCH_COMPILE_ENGINE plan)."""
    engines = [SizedEngine("WS_SMALL", 0), _NoKernelEngine("NO_KERNEL", 0)]
    with dt.get_registry().extra_engines(engines, exclusive=True):
        g = dt.Graph("tanh", io_data_type=dt.DataType.FLOAT)
        g.pointwise(g.tensor("X", [2, 8]), mode=dt.PointwiseMode.TANH_FWD).set_output(True)
        g.build_operation_graph(cpu_handle)
        g.create_execution_plans([dt.HeuristicMode.A])
        g.check_support()
        g.build_plans(dt.BuildPlanPolicy.ALL)
        assert [g.get_plan_name_at_index(i) for i in range(2)] == ["WS_SMALL", "NO_KERNEL"]
        pack = _pack(g)
        g.execute_plan_at_index(cpu_handle, pack, None, 0)
        with pytest.raises(
            dt.NotSupportedError,
            match=r"plan 1 \(NO_KERNEL\) could not be built: NO_KERNEL: no kernel for this graph",
        ):
            g.execute_plan_at_index(cpu_handle, pack, None, 1)


def test_a_graph_no_plan_builds_for_names_each_engine_once(cpu_handle: dt.Handle) -> None:
    """An engine's build error begins with its own name; build_plans' error put the name in
    front again ('TORCH_COMPILE_ENGINE: TORCH_COMPILE_ENGINE: graph ... failed a trial run')."""
    with dt.get_registry().extra_engines([_NoKernelEngine("NO_KERNEL", 0)], exclusive=True):
        g = dt.Graph("tanh", io_data_type=dt.DataType.FLOAT)
        g.pointwise(g.tensor("X", [2, 8]), mode=dt.PointwiseMode.TANH_FWD).set_output(True)
        g.build_operation_graph(cpu_handle)
        g.create_execution_plans([dt.HeuristicMode.A])
        g.check_support()
        with pytest.raises(dt.NotSupportedError) as caught:
            g.build_plans(dt.BuildPlanPolicy.ALL)
    assert str(caught.value).count("NO_KERNEL") == 1, caught.value
