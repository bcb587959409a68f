"""Issue 8, bullet 2: every candidate is measured under the same conditions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from autotune_helpers import Pack, tune

import dnntune as dt
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C, FakeEngines

FIXED: dict[str, Any] = {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 4}


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch, fakes: FakeEngines) -> list[int]:
    """Replace the cold-cache flusher by one that logs a "flush" event on the fake clock."""
    made: list[int] = []

    class Flusher:
        def __init__(self, device: torch.device) -> None:
            made.append(1)

        def flush(self) -> None:
            fakes.clock.record("flush")

    monkeypatch.setattr("dnntune.backend.cache_flush.CacheFlusher", Flusher)
    return made


def test_cold_mode_flushes_before_every_run(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines, flushes: list[int]
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    results = tune(graph, handle, pack, cache_mode="cold", warmup_iterations=3, **FIXED)
    assert all(r.cache_mode == "cold" and r.succeeded for r in results)
    assert len(flushes) == 1  # one flush buffer per session
    events = fakes.clock.events
    executes = [i for i, (kind, _) in enumerate(events) if kind == "execute"]
    assert executes
    for i in executes:
        before = [kind for kind, _ in events[max(0, i - 2) : i]]
        # verification and warmup runs: flush, execute; samples: flush, sync, execute
        assert before[-1] == "flush" or before == ["flush", "sync"], (i, events[i - 3 : i + 1])


def test_warm_mode_never_flushes(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines, flushes: list[int]
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    results = tune(graph, handle, pack, **FIXED)
    assert all(r.cache_mode == "warm" for r in results)
    assert not flushes and all(kind != "flush" for kind, _ in fakes.clock.events)


@pytest.mark.parametrize("cache_mode", ["warm", "cold"])
def test_same_history_for_every_candidate(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    flushes: list[int],
    cache_mode: Any,
) -> None:
    """Each candidate's events up to its first timed sample are the same sequence."""
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C])
    tune(graph, handle, pack, cache_mode=cache_mode, warmup_iterations=2, **FIXED)
    events = fakes.clock.events
    starts = [
        next(i for i, (k, who) in enumerate(events) if k == "execute" and who == name)
        for name in (FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C)
    ]
    prefixes = []
    for start in starts:
        # the flush (cold) just before the verification run belongs to the candidate
        begin = start - 1 if start and events[start - 1][0] == "flush" else start
        prefixes.append([kind for kind, _ in events[begin : begin + 9]])
    assert prefixes[0] == prefixes[1] == prefixes[2]
    assert prefixes[0].count("execute") >= 3  # verification + 2 warmups


def test_warmup_is_followed_by_a_synchronize(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_C])
    tune(graph, handle, pack, warmup_iterations=2, **FIXED)
    kinds = [kind for kind, _ in fakes.clock.events]
    # verification (sync), warmup, warmup, sync, then samples each after a sync
    assert kinds[:6] == ["execute", "sync", "execute", "execute", "sync", "sync"]


@pytest.mark.usefixtures("fakes")
def test_candidates_are_timed_through_their_bound_call(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every timed run goes through the plan's bound call, the call ``Graph.execute`` makes
    (each engine's host cost as the user pays it); ``execute`` with a pack only for the
    verification run, on fresh outputs. Each plan binds once."""
    from dnntune.testing.engines import FakePlan

    binds: list[tuple[int, ...]] = []
    calls = {"bound": 0, "execute": 0}
    real_bind, real_execute = FakePlan.bind, FakePlan.execute

    def bind(self: FakePlan, uids: Any) -> Any:
        binds.append(tuple(uids))
        inner = real_bind(self, uids)

        def call(tensors: Any, workspace: Any) -> None:
            calls["bound"] += 1
            inner(tensors, workspace)

        return call

    def execute(self: FakePlan, *args: Any, **kwargs: Any) -> None:
        calls["execute"] += 1
        real_execute(self, *args, **kwargs)

    monkeypatch.setattr(FakePlan, "bind", bind)
    monkeypatch.setattr(FakePlan, "execute", execute)
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    results = tune(graph, handle, pack, warmup_iterations=2, **FIXED)
    assert all(r.succeeded for r in results)
    assert len(binds) == 2 and all(set(b) == set(pack) for b in binds)
    # bound: 2 warm-up runs and 4 timed per candidate, and the decision's re-timing; the
    # execute calls that remain are the verification runs and the bound call's own inner one
    assert calls["bound"] >= 2 * (2 + 4)
    assert calls["execute"] == calls["bound"] + 2


def test_a_plan_that_cannot_bind_runs_through_execute(handle: dt.Handle) -> None:
    """A plan whose bind refuses the pack (it reads a tensor the pack lacks: ValueError) is
    timed through ``execute`` instead, and asked to bind once."""
    from dnntune.autotune.benchmark import ExecutionContext

    class Unbindable:
        name = "unbindable"

        def __init__(self) -> None:
            self.binds, self.executes = 0, 0

        def bind(self, uids: Any) -> Any:
            self.binds += 1
            raise ValueError("bind() needs uid(s) [9]")

        def execute(self, pack: Any, workspace: Any, stream: Any) -> None:
            self.executes += 1

    ctx = ExecutionContext(handle, {1: torch.zeros(2)}, None)
    plan = Unbindable()
    for _ in range(3):
        ctx.run(plan)  # type: ignore[arg-type]
    assert (plan.binds, plan.executes) == (1, 3)


def test_a_bound_call_lives_with_its_plan_and_is_made_outside_the_clock(
    handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tuner keeps no plan alive (a priming plan it discards is freed), and a plan's
    first timed sample does not pay its bind."""
    import gc
    import weakref

    from dnntune.autotune import benchmark
    from dnntune.autotune.benchmark import ExecutionContext

    class Plan:
        name = "plan"

        def bind(self, uids: Any) -> Any:
            return lambda tensors, workspace: None

        def execute(self, pack: Any, workspace: Any, stream: Any) -> None:
            raise AssertionError("timed through its bound call")

    bound_before_clock: list[bool] = []
    plans = [Plan()]

    def latency_sample(timer: Any, fn: Any, flush: Any, calls: int) -> float:
        bound_before_clock.append(benchmark._BOUND in vars(plans[0]))
        fn()
        return 1.0

    monkeypatch.setattr(benchmark.clocks, "latency_sample", latency_sample)
    ctx = ExecutionContext(handle, {1: torch.zeros(2)}, None)
    assert ctx.latency_sample(plans[0]) == 1.0  # type: ignore[arg-type]
    assert bound_before_clock == [True]
    gone = weakref.ref(plans[0])
    plans.clear()
    gc.collect()
    assert gone() is None


def test_a_tune_leaves_no_plan_alive_in_a_cycle(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound calls a tune keeps on its plans refer to the plans: a cycle the tune takes
    back when it ends, so a priming plan or a losing candidate is freed by reference counting
    (the collector, which counts Python objects, would leave their device memory held)."""
    import gc
    import weakref

    from dnntune.autotune import benchmark
    from dnntune.testing import engines as fake

    made: list[weakref.ref[Any]] = []
    compile_plan = fake.FakeEngine.compile

    def compile_and_track(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = compile_plan(self, *args, **kwargs)
        made.append(weakref.ref(plan))
        return plan

    monkeypatch.setattr(fake.FakeEngine, "compile", compile_and_track)
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C])
    gc.collect()
    gc.disable()
    try:
        tune(graph, handle, pack, mode=dt.TuneMode.EXHAUSTIVE)
        alive = [r() for r in made if r() is not None]
        assert len(made) >= 4  # a priming plan and the three candidates
        assert [p.name for p in alive] == [graph.active_plan.name]
        assert benchmark._BOUND not in vars(alive[0])
    finally:
        gc.enable()
