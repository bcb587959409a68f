"""autotune() on the compiled-plan path, and the cuDNN-style manual loop (RFC 6.3, A.1, 10.3)."""

from __future__ import annotations

import pytest
import torch
from autotune_helpers import Pack, by_name, check_coverage, workspace

import dnntune as dt
from dnntune import testing
from dnntune.errors import AutotuneError, BadStateError, InvalidValueError, Status
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    FAKE_ENGINE_WRONG,
    FakeEngines,
)

ALL = dt.BuildPlanPolicy.ALL


@pytest.fixture
def built(graph: dt.Graph) -> dt.Graph:
    return graph.create_execution_plans().build_plans(ALL)


def test_compiled_plan_workflow(
    built: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    assert built.get_execution_plan_count() == 7
    ws = built.get_autotune_workspace_size()
    assert ws == 1024
    results = built.autotune(handle, pack, workspace(ws))  # cuDNN-compatible form
    check_coverage(built, results)
    assert results[0].engine_name == FAKE_ENGINE_A
    for r in results:
        if r.succeeded:
            assert built.get_plan_name_at_index(r.compiled_plan_index) == r.engine_name
    assert by_name(results)[FAKE_ENGINE_WRONG].verified is False
    built.execute(handle, pack, workspace(ws))
    assert fakes.executions()[-1] == FAKE_ENGINE_A


def test_compiled_path_compiles_nothing_more(
    built: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    compiles = sum(fakes.counters.compiles.values())
    built.autotune(handle, pack, workspace())
    assert sum(fakes.counters.compiles.values()) == compiles == 7


def test_general_form_on_compiled_path(built: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    cfg = dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=2)
    results = built.autotune(handle, pack, workspace(), 1024, cfg)
    assert len(results) == 7 and results[0].iterations_run == 2


def test_compiled_path_workspace_ceiling(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plan_ext(FAKE_ENGINE_WORKSPACE_GROWS, {"global.benchmarking": 1})
    graph.build_plans(ALL)
    assert graph.get_autotune_workspace_size() == 8192
    with pytest.raises(AutotuneError) as err:
        graph.autotune(handle, pack, workspace(1024), 1024)
    assert err.value.status is Status.INVALID_VALUE
    r = err.value.results[0]
    assert r.error_message == "Workspace size 8192 exceeds limit 1024" and r.workspace_size == 8192
    results = graph.autotune(handle, pack, workspace(8192), 8192)
    assert results[0].succeeded and results[0].knobs == {"global.benchmarking": 1}


def test_compiled_form_null_workspace_but_plans_need_it(
    built: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    with pytest.raises(InvalidValueError, match="workspace is None but plan"):
        built.autotune(handle, pack, None)


def test_compiled_form_small_workspace_skips_plans(
    built: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    with pytest.raises(AutotuneError, match="no candidates remain"):
        built.autotune(handle, pack, workspace(100))


def test_heuristics_choice_builds_one_plan(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plans().build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    results = graph.autotune(handle, pack, workspace())
    assert len(results) == 7
    assert [r.engine_name for r in results if r.succeeded] == [FAKE_ENGINE_A]
    unbuilt = [r for r in results if not r.succeeded]
    assert all(
        "failed finalize" in r.error_message and "never built" in r.error_message for r in unbuilt
    )
    assert all(r.workspace_size == -1 and r.compiled_plan_index == -1 for r in unbuilt)


def test_build_plans_all_vs_heuristics_choice(graph: dt.Graph, fakes: FakeEngines) -> None:
    graph.create_execution_plans().build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    assert sum(fakes.counters.compiles.values()) == 1
    graph.build_plans(ALL)
    assert sum(fakes.counters.compiles.values()) == 7


def test_deselect_before_build_on_compiled_path(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.deselect_engines([FAKE_ENGINE_A, FAKE_ENGINE_WRONG])
    graph.create_execution_plans().build_plans(ALL)
    assert graph.get_execution_plan_count() == 7  # stable indices: barred plans stay
    results = graph.autotune(handle, pack, workspace())
    check_coverage(graph, results)
    barred = [r for r in results if "Plan barred" in r.error_message]
    assert {r.engine_name for r in barred} == {FAKE_ENGINE_A, FAKE_ENGINE_WRONG}
    assert all(r.workspace_size == -1 and r.excluded_by_caller for r in barred)
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 0
    with pytest.raises(InvalidValueError, match="Plan barred"):
        graph.execute_plan_at_index(handle, pack, workspace(), 0)


def test_deselect_workspace_on_compiled_path(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.deselect_workspace_greater_than(512)
    graph.create_execution_plans()
    with pytest.raises(Exception, match="no plan could be built"):
        graph.build_plans(ALL)


def test_engine_id_filter_on_compiled_path(built: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    cfg = dt.AutotuneConfig(engine_id_filter=[dt.engine_id(FAKE_ENGINE_C), 5])
    results = built.autotune(handle, pack, workspace(), config=cfg)
    assert [r.engine_name for r in results if r.succeeded] == [FAKE_ENGINE_C]
    filtered = [r for r in results if "engineIdFilter" in r.error_message]
    assert len(filtered) == 6
    assert all(r.workspace_size == 1024 for r in filtered)  # compiled: size known


def test_compiled_path_all_fail(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plan_ext(FAKE_ENGINE_FAILS).build_plans(ALL)
    with pytest.raises(AutotuneError) as err:
        graph.autotune(handle, pack, workspace())
    assert err.value.status is Status.EXECUTION_FAILED and len(err.value.results) == 1


def test_single_plan_from_create_execution_plan_ext(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.create_execution_plan_ext(FAKE_ENGINE_B, {"fake.algorithm": "winograd"}).build_plans(ALL)
    results = graph.autotune(handle, pack, workspace())
    assert len(results) == 1 and results[0].min_time_ms == 1.5
    assert results[0].compiled_plan_index == 0


def test_multi_engine_plan_count_and_names(built: dt.Graph) -> None:
    names = [built.get_plan_name_at_index(i) for i in range(built.get_execution_plan_count())]
    assert names == list(testing.ALL_FAKE_ENGINES)


# ---- manual benchmark loop (cuDNN sample, RFC A.1) ---------------------------------------------
def test_manual_benchmark_loop(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, 0.3)
    graph.create_execution_plans().build_plans(ALL)
    count = graph.get_execution_plan_count()
    ws_bytes = max(graph.get_workspace_size_plan_at_index(i) for i in range(count))
    ws = workspace(ws_bytes)
    times = [10.0] * count
    timer = handle.timer
    for i in range(count):
        try:
            graph.execute_plan_at_index(handle, pack, ws, i)  # warmup
        except dt.DnnTuneError:
            continue
        timer.synchronize()
        times[i] = timer.time_ms(lambda i=i: graph.execute_plan_at_index(handle, pack, ws, i), 10)
    best = min(range(count), key=lambda i: times[i])
    assert graph.get_plan_name_at_index(best) == FAKE_ENGINE_WRONG  # no verification here
    best_correct = min(
        (i for i in range(count) if graph.get_plan_name_at_index(i) != FAKE_ENGINE_WRONG),
        key=lambda i: times[i],
    )
    assert graph.get_plan_name_at_index(best_correct) == FAKE_ENGINE_C
    graph.build_plan_at_index(best_correct)
    graph.execute(handle, pack, ws)
    assert fakes.executions()[-1] == FAKE_ENGINE_C
    assert graph.get_plan_name() == FAKE_ENGINE_C


def test_plan_indexed_access_errors(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plans().build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    for bad in (7, -1):
        with pytest.raises(InvalidValueError, match="out of range"):
            graph.execute_plan_at_index(handle, pack, workspace(), bad)
        with pytest.raises(InvalidValueError, match="out of range"):
            graph.build_plan_at_index(bad)
        with pytest.raises(InvalidValueError, match="out of range"):
            graph.get_plan_name_at_index(bad)
    with pytest.raises(BadStateError, match="not compiled"):
        graph.execute_plan_at_index(handle, pack, workspace(), 1)  # uncompiled
    graph.build_plan_at_index(1)
    graph.execute_plan_at_index(handle, pack, workspace(), 1)


def test_plan_index_workspace_too_small(built: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="needs a workspace of 1024 bytes"):
        built.execute_plan_at_index(handle, pack, torch.empty(10, dtype=torch.uint8), 0)
