"""RFC 0013 Appendix B use cases 1-12 and the section 8 complete example, on the fake engines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from autotune_helpers import Pack, by_name, check_coverage

import dnntune as dt
from dnntune import testing
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    PRIMED_KNOB,
    FakeEngines,
)

UNPRIMED = dt.PrimingFailurePolicy.BENCHMARK_UNPRIMED


def _alloc(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


@pytest.mark.parametrize("mode", [dt.TuneMode.STANDARD, dt.TuneMode.EXHAUSTIVE])
def test_uc1_quick_autotune(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, mode: dt.TuneMode
) -> None:
    graph.add_all_engines()
    max_ws = graph.get_estimated_max_workspace_size()
    ws = _alloc(max_ws)
    cfg = dt.AutotuneConfig(mode=mode, priming_failure_policy=UNPRIMED)
    graph.autotune(handle, pack, ws, max_ws, cfg)
    graph.execute(handle, pack, ws)
    assert graph.get_plan_name() == FAKE_ENGINE_A


def test_uc2_inspect_results(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_all_engines()
    max_ws = graph.get_estimated_max_workspace_size()
    results = graph.autotune(
        handle,
        pack,
        _alloc(max_ws),
        max_ws,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE, priming_failure_policy=UNPRIMED),
    )
    check_coverage(graph, results)
    lines = [
        f"#{r.rank} {r.engine_name:<30} min={r.min_time_ms:.4f} ms avg={r.avg_time_ms:.4f} ms "
        f"ws={r.workspace_size} {'OK' if r.succeeded else r.error_message}"
        for r in results
    ]
    assert lines[0].startswith("#0 FAKE_ENGINE_A") and lines[0].endswith("OK")
    assert lines[-1].startswith("#-1 ")
    assert graph.last_autotune_results == results


def test_uc3_config_options(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, tmp_path: Path, fakes: FakeEngines
) -> None:
    graph.add_all_engines()
    max_ws = graph.get_estimated_max_workspace_size()
    ws = _alloc(max_ws)
    exhaustive = {"mode": dt.TuneMode.EXHAUSTIVE, "priming_failure_policy": UNPRIMED}
    # custom warmup/iteration counts
    fixed = dt.AutotuneConfig(
        **exhaustive,
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,  # type: ignore[arg-type]
        warmup_iterations=10,
        timed_iterations=50,
        recheck_within=0.0,
    )
    results = graph.autotune(handle, pack, ws, max_ws, fixed)
    assert all(r.iterations_run == 50 for r in results if r.succeeded)
    # workspace-constrained: nothing fits in 512 bytes
    with pytest.raises(dt.AutotuneError, match="exceeds limit"):
        graph.autotune(handle, pack, _alloc(512), 512, dt.AutotuneConfig(mode=dt.TuneMode.STANDARD))
    # specific engines only
    ids = [dt.engine_id(FAKE_ENGINE_B), dt.engine_id(FAKE_ENGINE_C)]
    results = graph.autotune(
        handle, pack, ws, max_ws, dt.AutotuneConfig(**exhaustive, engine_id_filter=ids)
    )  # type: ignore[arg-type]
    assert {r.engine_name for r in results if r.succeeded} == {FAKE_ENGINE_B, FAKE_ENGINE_C}
    # combined: mode, warmup, iterations and output file
    path = tmp_path / "autotune_results.json"
    graph.autotune(
        handle,
        pack,
        ws,
        max_ws,
        dt.AutotuneConfig(**exhaustive, warmup_iterations=5, timed_iterations=20),  # type: ignore[arg-type]
        dt.AutotuneStorageConfig(file_path=str(path)),
    )
    assert path.exists()


def test_uc4_custom_stream_cpu_handle_has_none(handle: dt.Handle) -> None:
    handle.set_stream(None)
    with pytest.raises(dt.InvalidValueError, match="streams need CUDA"):
        handle.set_stream(object())  # type: ignore[arg-type]


@pytest.mark.gpu
def test_uc4_custom_stream_gpu() -> None:
    with testing.fake_engines() as fakes:
        handle = dt.create_handle("cuda")
        stream = torch.cuda.Stream()
        handle.set_stream(stream)
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        pack = testing.make_pack(g, "cuda")
        ws = torch.empty(1024, dtype=torch.uint8, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())  # the inputs, written on the default one
        results = g.autotune(handle, pack, ws, 1024)
        assert results[0].engine_name == FAKE_ENGINE_A and results[0].verified
        g.execute(handle, pack, ws)
        assert fakes.executions()[-1] == FAKE_ENGINE_A


def test_uc5_inspect_engines_before_adding(graph: dt.Graph) -> None:
    configs = graph.get_engine_configs()
    lines = [
        f"[{c.engine_id}] {c.engine_name} exhaustive={'yes' if c.supports_exhaustive else 'no'} "
        f"knobs={len(c.knobs)}"
        for c in configs
    ]
    assert len(lines) == 7 and "FAKE_ENGINE_A exhaustive=yes knobs=2" in lines[0]
    graph.add_engine_configs(configs)
    assert len(graph.plan_specs) == 7


def test_uc6_exclude_engines_by_name(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    configs = [c for c in graph.get_engine_configs() if "FAIL" not in c.engine_name]
    graph.add_engine_configs(configs)
    results = graph.autotune(handle, pack, _alloc(1024), 1024)
    assert len(results) == 5
    assert not any("FAIL" in r.engine_name for r in results)


def test_uc7_only_exhaustive_capable(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_A, 0.25, {PRIMED_KNOB: 1})  # A's search helps
    configs = [c for c in graph.get_engine_configs() if c.supports_exhaustive]
    assert {c.engine_name for c in configs} == {
        FAKE_ENGINE_A,
        FAKE_ENGINE_PRIMING_FAILS,
        FAKE_ENGINE_WORKSPACE_GROWS,
    }
    graph.add_engine_configs(configs)
    max_ws = graph.get_estimated_max_workspace_size()
    results = graph.autotune(
        handle,
        pack,
        _alloc(max_ws),
        max_ws,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE, priming_failure_policy=UNPRIMED),
    )
    assert by_name(results)[FAKE_ENGINE_A].ran_exhaustive
    assert all(r.supports_exhaustive for r in results)


def test_uc8_single_engine(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engine(dt.engine_id(FAKE_ENGINE_A), {"fake.variant": 3})
    max_ws = graph.get_estimated_max_workspace_size()
    ws = _alloc(max_ws)
    results = graph.autotune(handle, pack, ws, max_ws)
    assert len(results) == 1 and results[0].knobs == {"fake.variant": 3}
    graph.execute(handle, pack, ws)
    assert graph.get_plan_name() == "FAKE_ENGINE_A[fake.variant=3]"


def test_uc9_convergence_based(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, [1.0, 1.3, 1.0, 1.01, 1.0, 1.0, 1.0])
    graph.add_engines([FAKE_ENGINE_C])
    results = graph.autotune(
        handle,
        pack,
        _alloc(1024),
        1024,
        dt.AutotuneConfig(
            mode=dt.TuneMode.EXHAUSTIVE,
            strategy=dt.AutotuneStrategy.RUN_UNTIL_STABLE,
            max_iterations=100,
            window_size=5,
            stability_threshold=0.02,
            recheck_within=0.0,
            verify=False,
            warmup_iterations=0,
        ),
    )  # every execute is a timed sample
    r = results[0]
    assert r.converged and r.iterations_run == 7 and r.min_time_ms == 1.0


def test_uc10_knob_variants(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    variants = []
    for c in graph.get_engine_configs():
        if c.engine_name == FAKE_ENGINE_A:
            variants += [dt.EngineVariant(c.engine_id, {"fake.variant": v}) for v in range(4)]
        else:
            variants.append(dt.EngineVariant(c.engine_id, {}))
    graph.add_engine_variants(variants)
    max_ws = graph.get_estimated_max_workspace_size()
    results = graph.autotune(
        handle,
        pack,
        _alloc(max_ws),
        max_ws,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE, priming_failure_policy=UNPRIMED),
    )
    check_coverage(graph, results)
    assert len(results) == 10
    assert (results[0].engine_name, results[0].knobs) == (FAKE_ENGINE_A, {"fake.variant": 1})
    variant_times = {
        r.knobs["fake.variant"]: r.min_time_ms for r in results if r.engine_name == FAKE_ENGINE_A
    }
    assert variant_times == {0: 1.0, 1: 0.7, 2: 1.3, 3: 1.6}


def test_uc11_automated_sweep(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    configs = graph.get_engine_configs()
    spec = dt.EngineSweepSpec(
        configs[1].engine_id, [dt.KnobSweepAxis("fake.algorithm", ["direct", "winograd", "fft"])]
    )
    graph.add_engine_sweep([spec])
    max_ws = graph.get_estimated_max_workspace_size()
    results = graph.autotune(
        handle, pack, _alloc(max_ws), max_ws, dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE)
    )
    assert [r.knobs["fake.algorithm"] for r in results] == ["winograd", "fft", "direct"]


def test_uc12_custom_ranking_by_workspace(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B])

    def smallest_workspace_then_fastest(results: list[dt.AutotuneResult]) -> None:
        results.sort(key=lambda r: (r.workspace_size, r.min_time_ms))

    fakes.timings.set(FAKE_ENGINE_A, 0.5)
    results = graph.autotune(
        handle,
        pack,
        _alloc(1024),
        1024,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE, ranking_fn=smallest_workspace_then_fastest),
    )
    # every fake needs 1024 bytes: the tie-break by speed decides
    assert [r.engine_name for r in results] == [FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_B]
    assert [r.rank for r in results] == [0, 1, 2]


def test_section8_complete_example(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, tmp_path: Path, fakes: FakeEngines
) -> None:
    configs = [c for c in graph.get_engine_configs() if c.estimated_workspace_size <= (256 << 20)]
    graph.add_engine_configs(configs)  # step 1: default-knob specs
    variants = [
        dt.EngineVariant(c.engine_id, {"fake.variant": v})
        for c in configs
        if c.engine_name == FAKE_ENGINE_A
        for v in (0, 1, 2)
    ]
    graph.add_engine_variants(variants)  # step 2: knob variants (explicit knobs: new specs)
    assert len(graph.plan_specs) == 10
    max_ws = graph.get_estimated_max_workspace_size()
    ws = _alloc(max_ws)
    path = tmp_path / "autotune_results.json"
    results = graph.autotune(
        handle,
        pack,
        ws,
        max_ws,
        dt.AutotuneConfig(
            mode=dt.TuneMode.EXHAUSTIVE,
            strategy=dt.AutotuneStrategy.RUN_UNTIL_STABLE,
            max_iterations=50,
            stability_threshold=0.03,
            priming_failure_policy=UNPRIMED,
        ),
        dt.AutotuneStorageConfig(file_path=str(path)),
    )
    check_coverage(graph, results)
    assert results[0].knobs == {"fake.variant": 1}
    graph.execute(handle, pack, ws)
    assert fakes.executions()[-1] == FAKE_ENGINE_A
    assert path.exists()
