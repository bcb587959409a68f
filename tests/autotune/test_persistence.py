"""Config-file output after autotune() and autotune_exhaustive_sweep's ranking cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from autotune_helpers import Pack, by_name, workspace

import dnntune as dt
from dnntune import testing
from dnntune.errors import BadStateError, InvalidValueError
from dnntune.overrides import exact_cache
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WRONG,
    PRIMED_KNOB,
    FakeEngines,
)


def test_winner_written_to_config_file(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, tmp_path: Path
) -> None:
    path = tmp_path / "overrides.json"
    graph.add_engine(FAKE_ENGINE_B, {"fake.algorithm": "winograd"})
    graph.add_engine(FAKE_ENGINE_C)
    results = graph.autotune(
        handle,
        pack,
        workspace(),
        1024,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE),
        dt.AutotuneStorageConfig(file_path=str(path)),
    )
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    [entry] = doc["engine_overrides"]
    assert entry["engine_name"] == results[0].engine_name == FAKE_ENGINE_B
    assert entry["op"] == "pointwise"


def test_config_file_reload_then_execute(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    tmp_path: Path,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Write -> reload through DNNTUNE_HEUR_CONFIG_PATH -> execute() (RFC 10.3)."""
    path = tmp_path / "autotune_results.json"
    fakes.timings.set(FAKE_ENGINE_C, 0.3)
    graph.add_all_engines()
    results = graph.autotune(
        handle, pack, workspace(), 1024, storage_config=dt.AutotuneStorageConfig(str(path))
    )
    assert results[0].engine_name == FAKE_ENGINE_C
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "1")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    g2 = testing.small_pointwise_graph()
    g2.build(handle)  # heuristics only: no autotune
    assert g2.get_plan_name() == FAKE_ENGINE_C
    g2.execute(handle, pack, workspace())
    assert fakes.executions()[-1] == FAKE_ENGINE_C


def test_no_file_without_a_winner(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, tmp_path: Path
) -> None:
    path = tmp_path / "overrides.json"
    graph.add_engines([FAKE_ENGINE_FAILS])
    with pytest.raises(dt.AutotuneError):
        graph.autotune(
            handle,
            pack,
            workspace(),
            1024,
            storage_config=dt.AutotuneStorageConfig(file_path=str(path)),
        )
    assert not path.exists()


def test_refused_append_propagates_as_invalid_value(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, tmp_path: Path
) -> None:
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps({"version": 1, "engine_overrides": []}))
    graph.add_engines([FAKE_ENGINE_C])
    with pytest.raises(InvalidValueError):
        graph.autotune(
            handle,
            pack,
            workspace(),
            1024,
            storage_config=dt.AutotuneStorageConfig(file_path=str(path)),
        )


# ---- autotune_exhaustive_sweep ---------------------------------------------------------------
def test_sweep_adds_every_engine_and_writes_the_cache(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_A, 0.25, {PRIMED_KNOB: 1})  # A's search helps
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert len(results) == 7 == len(graph.plan_specs)
    assert outcome is dt.CacheWriteOutcome.WRITTEN
    named = by_name(results)
    assert all(r.mode_used is dt.TuneMode.EXHAUSTIVE for r in results)
    # BENCHMARK_UNPRIMED is forced: the priming failure does not abort
    assert named[FAKE_ENGINE_PRIMING_FAILS].succeeded
    assert not named[FAKE_ENGINE_PRIMING_FAILS].ran_exhaustive
    assert named[FAKE_ENGINE_A].ran_exhaustive
    assert results[0].engine_name == FAKE_ENGINE_A
    record = exact_cache.read_record(graph, handle)
    assert record is not None
    assert set(record.sampled_engine_ids) == {dt.engine_id(n) for n in testing.ALL_FAKE_ENGINES}
    assert record.order[0] == dt.engine_id(FAKE_ENGINE_A)
    assert dt.engine_id(FAKE_ENGINE_WRONG) not in record.order
    graph.execute(handle, pack, workspace())
    assert fakes.executions()[-1] == FAKE_ENGINE_A


def test_a_sweep_timed_on_a_busy_cpu_is_not_cached(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    """The Config policy follows a cached ranking without timing anything: one timed while the
    sweep's threads waited for a core 60 % of the time is not written (session 20)."""
    fakes.clock.busy_share = 0.6
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert results[0].succeeded
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU
    assert exact_cache.read_record(graph, handle) is None
    summary = graph.last_autotune_summary
    assert summary is not None and summary.timed_while_busy
    assert "timed while the CPU was busy" in summary.describe()


def test_sweep_ranks_by_robust_time(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    # C's minimum is lower but its typical time is worse
    fakes.timings.set(FAKE_ENGINE_C, [0.5, 5.0, 5.0, 5.0])
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    cfg = dt.AutotuneConfig(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=8, recheck_within=0.0
    )
    results, _ = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024, cfg)
    assert [r.engine_name for r in results] == [FAKE_ENGINE_A, FAKE_ENGINE_C]
    assert by_name(results)[FAKE_ENGINE_C].min_time_ms < 1.0


def test_sweep_with_filter_is_partial(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    cfg = dt.AutotuneConfig(engine_id_filter=[dt.engine_id(FAKE_ENGINE_C)])
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024, cfg)
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    assert len(results) == 7 and results[0].engine_name == FAKE_ENGINE_C
    assert exact_cache.read_record(graph, handle) is None


def test_sweep_with_knob_variants_is_partial(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.add_engine(FAKE_ENGINE_A, {"fake.variant": 1})
    graph.add_engine(FAKE_ENGINE_C)
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    assert len(results) == 2


def test_sweep_respects_disabled_cache(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "1")
    _, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert outcome is dt.CacheWriteOutcome.DECLINED_DISABLED


def test_sweep_allocates_workspace_when_none_given(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    results, outcome = graph.autotune_exhaustive_sweep(handle, pack)
    assert outcome is dt.CacheWriteOutcome.WRITTEN
    assert results[0].succeeded


def test_second_identical_sweep_is_unchanged(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    _, outcome = graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    assert outcome is dt.CacheWriteOutcome.UNCHANGED


def test_sweep_refuses_compiled_plan_path(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plans().build_plans(dt.BuildPlanPolicy.ALL)
    with pytest.raises(BadStateError, match="plan-spec path"):
        graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)


def test_sweep_negative_workspace(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match=">= 0"):
        graph.autotune_exhaustive_sweep(handle, pack, workspace(), -1)


def test_cached_ranking_orders_the_next_heuristic_query(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, 0.2)
    graph.autotune_exhaustive_sweep(handle, pack, workspace(), 1024)
    g2 = testing.small_pointwise_graph()
    g2.build_operation_graph(handle)
    configs = g2.get_engine_configs()
    assert configs[0].engine_name == FAKE_ENGINE_C
