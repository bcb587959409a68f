"""dnntune.testing: the fake engines, timer, timings and the registration scope."""

from __future__ import annotations

import pytest
import torch
from autotune_helpers import Pack

import dnntune as dt
from dnntune import testing
from dnntune.backend.knobs import BENCHMARKING, KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.backend.timer import CpuTimer, Timer
from dnntune.errors import ExecutionError, InvalidValueError, NotSupportedError
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    FAKE_ENGINE_WRONG,
    FakeClock,
    FakeTimer,
    FakeTimings,
)


def _graph_pack(handle: dt.Handle) -> tuple[dt.Graph, dict[int, torch.Tensor]]:
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    return g, testing.make_pack(g)


def _expected(g: dt.Graph, pack: Pack[int, torch.Tensor]) -> torch.Tensor:
    x, b = (pack[t.uid] for t in g.input_tensors())  # type: ignore[index]
    return torch.relu(x + b)


def test_fakes_exist_only_inside_the_block() -> None:
    registry = get_registry()
    assert registry.find(FAKE_ENGINE_A) is None
    with testing.fake_engines() as fakes:
        assert [e.name for e in registry.engines()] == list(testing.ALL_FAKE_ENGINES)
        assert registry.get(FAKE_ENGINE_A) is fakes[FAKE_ENGINE_A]
        assert fakes.id(FAKE_ENGINE_A) == dt.engine_id(FAKE_ENGINE_A)
        assert fakes.ids[FAKE_ENGINE_C] == dt.engine_id(FAKE_ENGINE_C)
    assert registry.find(FAKE_ENGINE_A) is None


def test_non_exclusive_keeps_other_engines() -> None:
    registry = get_registry()
    before = [e.name for e in registry.engines()]
    with testing.fake_engines(exclusive=False):
        names = [e.name for e in registry.engines()]
        assert names[: len(before)] == before
        assert set(testing.ALL_FAKE_ENGINES) <= set(names)


def test_subset_of_engines() -> None:
    with testing.fake_engines(names=[FAKE_ENGINE_A, FAKE_ENGINE_C]):
        assert [e.name for e in get_registry().engines()] == [FAKE_ENGINE_A, FAKE_ENGINE_C]
    with pytest.raises(ValueError, match="unknown fake engine"), testing.fake_engines(names=["X"]):
        pass


def test_handles_inside_get_the_fake_timer() -> None:
    outside = dt.create_handle("cpu")
    with testing.fake_engines() as fakes:
        inside = dt.create_handle("cpu")
        assert isinstance(inside.timer, FakeTimer) and inside.timer.clock is fakes.clock
        assert isinstance(inside.timer, Timer)
    assert isinstance(outside.timer, CpuTimer)
    assert isinstance(dt.create_handle("cpu").timer, CpuTimer)


def test_fake_plan_computes_real_outputs() -> None:
    with testing.fake_engines() as fakes:
        handle = dt.create_handle("cpu")
        g, pack = _graph_pack(handle)
        y = g.output_tensors()[0].uid
        ws = torch.empty(1024, dtype=torch.uint8)
        fakes[FAKE_ENGINE_C].compile(g, (), handle).execute(pack, ws)
        torch.testing.assert_close(pack[y], _expected(g, pack))
        fakes[FAKE_ENGINE_WRONG].compile(g, (), handle).execute(pack, ws)
        torch.testing.assert_close(pack[y], _expected(g, pack) + 1.0)
        assert fakes.counters.executes == {FAKE_ENGINE_C: 1, FAKE_ENGINE_WRONG: 1}
        assert fakes.counters.compiles == {FAKE_ENGINE_C: 1, FAKE_ENGINE_WRONG: 1}


def test_fake_plan_advances_the_clock_by_its_script() -> None:
    with testing.fake_engines(timings={FAKE_ENGINE_C: 0.25}) as fakes:
        handle = dt.create_handle("cpu")
        g, pack = _graph_pack(handle)
        plan = fakes[FAKE_ENGINE_C].compile(g, (), handle)
        ws = torch.empty(1024, dtype=torch.uint8)
        assert handle.timer.time_ms(lambda: plan.execute(pack, ws), 4) == 0.25
        assert fakes.clock.now_ms == 1.0
        assert handle.timer.time_ms(lambda: None) == 0.0


def test_knob_specific_timings() -> None:
    with testing.fake_engines() as fakes:
        handle = dt.create_handle("cpu")
        g, pack = _graph_pack(handle)
        ws = torch.empty(1024, dtype=torch.uint8)
        for value, ms in [(0, 1.0), (1, 0.7), (2, 1.3), (3, 1.6)]:
            plan = fakes[FAKE_ENGINE_A].compile(g, [KnobSetting("fake.variant", value)], handle)
            assert handle.timer.time_ms(lambda plan=plan: plan.execute(pack, ws)) == ms
        for algo, ms in [("direct", 3.0), ("winograd", 1.5), ("fft", 2.0)]:
            plan = fakes[FAKE_ENGINE_B].compile(g, [KnobSetting("fake.algorithm", algo)], handle)
            assert handle.timer.time_ms(lambda plan=plan: plan.execute(pack, ws)) == ms


def test_engine_knobs_match_the_spec() -> None:
    with testing.fake_engines() as fakes:

        def ids(name: str) -> set[str]:
            return {k.knob_id for k in fakes[name].knobs()}

        assert ids(FAKE_ENGINE_A) == {BENCHMARKING, "fake.variant"}
        assert ids(FAKE_ENGINE_B) == {"fake.algorithm"}
        assert ids(FAKE_ENGINE_C) == ids(FAKE_ENGINE_FAILS) == ids(FAKE_ENGINE_WRONG) == set()
        assert ids(FAKE_ENGINE_PRIMING_FAILS) == ids(FAKE_ENGINE_WORKSPACE_GROWS) == {BENCHMARKING}
        b_default = {k.knob_id: k.default_value for k in fakes[FAKE_ENGINE_B].knobs()}
        assert b_default == {"fake.algorithm": "direct"}
        with pytest.raises(InvalidValueError):
            fakes[FAKE_ENGINE_A].validate_knobs([KnobSetting("fake.variant", 4)])
        with pytest.raises(InvalidValueError):
            fakes[FAKE_ENGINE_B].validate_knobs([KnobSetting("fake.algorithm", "gemm")])


def test_failure_engines() -> None:
    with testing.fake_engines() as fakes:
        handle = dt.create_handle("cpu")
        g, pack = _graph_pack(handle)
        ws = torch.empty(8192, dtype=torch.uint8)
        with pytest.raises(ExecutionError, match="always fails"):
            fakes[FAKE_ENGINE_FAILS].compile(g, (), handle).execute(pack, ws)
        pf = fakes[FAKE_ENGINE_PRIMING_FAILS]
        pf.compile(g, (), handle).execute(pack, ws)  # fine without benchmarking
        with pytest.raises(ExecutionError, match="benchmarking=1"):
            pf.compile(g, [KnobSetting(BENCHMARKING, 1)], handle).execute(pack, ws)
        pf.fail_stage = "compile"  # type: ignore[attr-defined]
        with pytest.raises(NotSupportedError):
            pf.compile(g, [KnobSetting(BENCHMARKING, 1)], handle)
        assert fakes.counters.priming_compiles[FAKE_ENGINE_PRIMING_FAILS] == 2


def test_workspace_grows_only_when_benchmarking() -> None:
    with testing.fake_engines() as fakes:
        handle = dt.create_handle("cpu")
        g, pack = _graph_pack(handle)
        e = fakes[FAKE_ENGINE_WORKSPACE_GROWS]
        assert e.estimate_workspace_size(g, [KnobSetting(BENCHMARKING, 1)]) == 1024
        assert e.compile(g, (), handle).workspace_size == 1024
        grown = e.compile(g, [KnobSetting(BENCHMARKING, 1)], handle)
        assert grown.workspace_size == 8192
        with pytest.raises(ExecutionError, match="needs a 8192-byte workspace, got 1024"):
            grown.execute(pack, torch.empty(1024, dtype=torch.uint8))
        with pytest.raises(ExecutionError, match="got 0"):
            grown.execute(pack, None)


def test_every_fake_applies_to_every_graph() -> None:
    with testing.fake_engines():
        handle = dt.create_handle("cpu")
        for g in (
            testing.small_pointwise_graph(),
            testing.small_matmul_graph(),
            testing.small_conv_graph(),
        ):
            assert len(get_registry().applicable(g, handle)) == 7


def test_timings_rules_sequences_and_noise() -> None:
    t = FakeTimings({"E": [1.0, 2.0]})
    assert [t.ms_for("E", {}) for _ in range(3)] == [1.0, 2.0, 1.0]
    t.set("E", 5.0, {"k": 1})
    assert t.ms_for("E", {"k": 1}) == 5.0 and t.ms_for("E", {"k": 2}) in (1.0, 2.0)
    t.set("E", 7.0, {"k": 1})  # later rules win
    assert t.ms_for("E", {"k": 1, "other": 0}) == 7.0
    assert t.ms_for("UNKNOWN", {}) == 1.0
    noisy = [FakeTimings(noise=0.1, seed=5).ms_for(FAKE_ENGINE_C, {}) for _ in range(2)]
    assert noisy[0] == noisy[1] != 2.0
    a = FakeTimings(noise=0.1, seed=5)
    assert len({a.ms_for(FAKE_ENGINE_C, {}) for _ in range(5)}) == 5


def test_setting_a_base_time_replaces_knob_defaults() -> None:
    t = FakeTimings({FAKE_ENGINE_A: 4.0})
    assert t.ms_for(FAKE_ENGINE_A, {"fake.variant": 1}) == 4.0


def test_clock_is_exact_and_logs() -> None:
    clock = FakeClock()
    timer = FakeTimer(clock)
    for _ in range(1000):
        clock.advance(0.1)
    assert timer.time_ms(lambda: clock.advance(0.2)) == 0.2
    timer.synchronize()
    assert clock.events[-1] == ("sync", "")


def test_counters_reset() -> None:
    with testing.fake_engines() as fakes:
        fakes.counters.executes["x"] += 1
        fakes.counters.syncs = 3
        fakes.counters.reset()
        assert not fakes.counters.executes and fakes.counters.syncs == 0
