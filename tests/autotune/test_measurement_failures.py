"""Issue 8, bullet 4 (in process): hangs time out, out-of-memory fails one candidate only."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from autotune_helpers import by_name

import dnntune as dt
from dnntune import testing
from dnntune.autotune.failures import (
    CandidateTimeout,
    WorkerCrashed,
    describe_failure,
    failure_kind,
    is_out_of_memory,
)
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.registry import get_registry
from dnntune.errors import AutotuneError
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_C,
    FAKE_ENGINE_CRASHES,
    FAKE_ENGINE_HANGS,
    FAKE_ENGINE_OOM,
    FakeEngine,
    FakeEngines,
    FakePlan,
)

WS = testing.ESTIMATED_WORKSPACE_BYTES
#: generous: only the hanging fake ever gets near it, even on a loaded machine
TIMEOUT_S = 2.0


@pytest.fixture
def session() -> Iterator[tuple[FakeEngines, dt.Handle, dt.Graph, dict[int, torch.Tensor]]]:
    names = [FAKE_ENGINE_HANGS, FAKE_ENGINE_OOM, FAKE_ENGINE_CRASHES, FAKE_ENGINE_A, FAKE_ENGINE_C]
    with testing.fake_engines(names=names) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        yield fakes, handle, g, testing.make_pack(g)


def _autotune(
    g: dt.Graph, handle: dt.Handle, pack: dict[int, torch.Tensor], **config: Any
) -> list[dt.AutotuneResult]:
    ws = torch.empty(WS, dtype=torch.uint8)
    return g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config))


# ---- the watchdog ------------------------------------------------------------------------
def test_watchdog_without_timeout_runs_inline() -> None:
    dog = Watchdog(None)
    assert dog.call(threading.get_ident, "x") == threading.get_ident()


def test_watchdog_returns_values_and_raises_errors() -> None:
    dog = Watchdog(5.0)
    try:
        assert dog.call(lambda: 42, "x") == 42
        assert dog.call(threading.get_ident, "x") != threading.get_ident()
        with pytest.raises(KeyError, match="boom"):
            dog.call(lambda: dict[str, int]()["boom"], "x")
    finally:
        dog.close()


def test_watchdog_gives_up_and_serves_the_next_call_on_a_new_thread() -> None:
    dog = Watchdog(1.0)
    release = threading.Event()
    try:
        first = dog.call(threading.get_ident, "warm")
        with pytest.raises(CandidateTimeout, match="timed out: stuck did not finish"):
            dog.call(lambda: release.wait(30), "stuck")
        assert dog.abandoned == 1
        second = dog.call(threading.get_ident, "next")
        assert second != first
    finally:
        release.set()
        dog.close()


def test_watchdog_lets_a_slow_call_finish_before_the_next_one() -> None:
    """A call that was only slow (a long JIT compile) returns within its grace period, and the
    next call starts after it, not next to it; a stuck one is waited for once, not again."""
    dog = Watchdog(0.5)
    events: list[str] = []

    def slow() -> None:
        time.sleep(0.8)
        events.append("slow done")

    try:
        with pytest.raises(CandidateTimeout):
            dog.call(slow, "slow")
        dog.call(lambda: events.append("next"), "next")
        assert events == ["slow done", "next"]
        assert dog.settled == 1
        release = threading.Event()
        with pytest.raises(CandidateTimeout):
            dog.call(lambda: release.wait(30), "stuck")
        start = time.monotonic()
        dog.call(lambda: None, "after stuck")  # waits one grace period for the stuck call
        dog.call(lambda: None, "later")  # ... and never again
        assert 0.4 < time.monotonic() - start < 1.5
        assert dog.settled == 1 and dog.abandoned == 2
        release.set()
    finally:
        dog.close()


def test_watchdog_carries_grad_and_inference_mode() -> None:
    dog = Watchdog(5.0)
    try:
        with torch.inference_mode():
            assert dog.call(torch.is_inference_mode_enabled, "x") is True
    finally:
        dog.close()
    dog = Watchdog(5.0)
    try:
        with torch.no_grad():
            assert dog.call(torch.is_grad_enabled, "x") is False
    finally:
        dog.close()


def test_watchdog_fails_calls_at_once_when_the_helper_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a helper whose thread state cannot be entered must not leave callers to time out
    from dnntune.autotune import watchdog

    def broken(self: Any) -> Any:
        raise ValueError("no such device")

    monkeypatch.setattr(watchdog._ThreadState, "enter", broken)
    dog = Watchdog(30.0)
    try:
        start = time.perf_counter()
        for _ in range(2):
            with pytest.raises(ValueError, match="no such device"):
                dog.call(lambda: 1, "x")
        assert time.perf_counter() - start < 5.0
    finally:
        dog.close()


@pytest.mark.gpu
def test_watchdog_accepts_a_cuda_device_without_an_index() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dog = Watchdog(30.0, torch.device("cuda"))
    try:
        assert dog.call(torch.cuda.current_device, "x") == torch.cuda.current_device()
    finally:
        dog.close()


def test_failure_classification() -> None:
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    assert is_out_of_memory(oom) and failure_kind(oom) == "oom"
    assert describe_failure(oom).startswith("out of memory: OutOfMemoryError")
    plain = RuntimeError("CUDA error: out of memory")
    assert is_out_of_memory(plain) and describe_failure(plain).startswith("out of memory")
    assert not is_out_of_memory(RuntimeError("illegal memory access"))
    assert failure_kind(CandidateTimeout("x", 1.0)) == "timeout"
    crashed = WorkerCrashed(-11, "benchmark of X")
    assert failure_kind(crashed) == "crash"
    assert str(crashed) == "worker crashed (exit code -11, SIGSEGV) during benchmark of X"


# ---- hangs -------------------------------------------------------------------------------
def test_hanging_execute_times_out_and_tuning_continues(session: Any) -> None:
    _fakes, handle, g, pack = session
    g.add_engines([FAKE_ENGINE_HANGS, FAKE_ENGINE_C, FAKE_ENGINE_A])
    start = time.perf_counter()
    results = by_name(_autotune(g, handle, pack, candidate_timeout_s=TIMEOUT_S))
    hung = results[FAKE_ENGINE_HANGS]
    assert not hung.succeeded and hung.failure_kind == "timeout"
    assert "timed out" in hung.error_message and "verification run" in hung.error_message
    assert results[FAKE_ENGINE_C].succeeded and results[FAKE_ENGINE_A].succeeded
    assert results[FAKE_ENGINE_A].rank == 0
    assert time.perf_counter() - start < 20 * TIMEOUT_S
    assert g.last_autotune_summary.timed_out == 1
    g.execute(handle, pack, torch.empty(WS, dtype=torch.uint8))


def test_hanging_compile_times_out(session: Any) -> None:
    _fakes, handle, g, pack = session
    g.add_engine_variants(
        [dt.EngineVariant(dt.engine_id(FAKE_ENGINE_HANGS), {"fake.hang_in": "compile"})]
    )
    g.add_engines([FAKE_ENGINE_C])
    results = by_name(_autotune(g, handle, pack, candidate_timeout_s=TIMEOUT_S))
    hung = results[FAKE_ENGINE_HANGS]
    assert hung.error_message.startswith("Plan failed compile: timed out: compile of")
    assert hung.failure_kind == "timeout" and not hung.benchmarked
    assert results[FAKE_ENGINE_C].succeeded


def test_without_a_timeout_nothing_runs_on_another_thread(session: Any) -> None:
    fakes, handle, g, pack = session
    threads: set[int] = set()
    real = fakes[FAKE_ENGINE_C].run

    def spy(plan: Any, p: Any, ws: Any) -> None:
        threads.add(threading.get_ident())
        real(plan, p, ws)

    fakes[FAKE_ENGINE_C].run = spy
    g.add_engines([FAKE_ENGINE_C])
    _autotune(g, handle, pack)
    assert threads == {threading.get_ident()}


class _SlowEngine(FakeEngine):
    """Really takes 20 ms per execute, and never stabilizes."""

    def run(self, plan: FakePlan, pack: Mapping[int, torch.Tensor], workspace: Any) -> None:
        time.sleep(0.02)
        super().run(plan, pack, workspace)


def test_time_budget_stops_the_timed_loop_early(session: Any) -> None:
    fakes, handle, g, pack = session
    slow = _SlowEngine("FAKE_SLOW", [], fakes.clock, fakes.timings, fakes.counters)
    fakes.timings.set("FAKE_SLOW", [1.0, 3.0])
    with get_registry().extra_engines([slow], exclusive=False):
        g.add_engines(["FAKE_SLOW"])
        r = _autotune(g, handle, pack, candidate_timeout_s=0.5, max_iterations=1000)[0]
    assert r.succeeded and not r.converged and 1 <= r.iterations_run < 100


# ---- out of memory -----------------------------------------------------------------------
@pytest.mark.parametrize("error", ["torch", "runtime"])
def test_out_of_memory_fails_the_candidate_and_memory_is_released(
    session: Any, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fakes, handle, g, pack = session
    released: list[object] = []
    monkeypatch.setattr(
        "dnntune.autotune.benchmark.release_memory", lambda device: released.append(device)
    )
    g.add_engine_variants(
        [dt.EngineVariant(dt.engine_id(FAKE_ENGINE_OOM), {"fake.oom_error": error})]
    )
    g.add_engines([FAKE_ENGINE_C])
    results = by_name(_autotune(g, handle, pack))
    oom = results[FAKE_ENGINE_OOM]
    assert not oom.succeeded and oom.failure_kind == "oom"
    assert "out of memory" in oom.error_message
    assert released == [handle.device]
    # the next candidate still ran, after the failed one
    assert results[FAKE_ENGINE_C].succeeded and results[FAKE_ENGINE_C].rank == 0
    executions = fakes.executions()
    assert executions.index(FAKE_ENGINE_OOM) < executions.index(FAKE_ENGINE_C)
    assert g.last_autotune_summary.out_of_memory == 1


def test_every_candidate_out_of_memory_is_an_autotune_error(session: Any) -> None:
    _fakes, handle, g, pack = session
    g.add_engines([FAKE_ENGINE_OOM])
    with pytest.raises(AutotuneError) as err:
        _autotune(g, handle, pack)
    assert "out of memory" in err.value.results[0].error_message


def test_the_crashing_fake_refuses_to_crash_this_process(session: Any) -> None:
    _fakes, handle, g, pack = session
    g.add_engines([FAKE_ENGINE_CRASHES, FAKE_ENGINE_C])
    results = by_name(_autotune(g, handle, pack))
    crash = results[FAKE_ENGINE_CRASHES]
    assert not crash.succeeded and "only inside an isolate worker" in crash.error_message
    assert results[FAKE_ENGINE_C].succeeded


def test_failure_engines_are_opt_in() -> None:
    assert not set(testing.OPT_IN_FAKE_ENGINES) & set(testing.ALL_FAKE_ENGINES)
    with testing.fake_engines() as fakes:
        assert not set(testing.OPT_IN_FAKE_ENGINES) & set(fakes.engines)
