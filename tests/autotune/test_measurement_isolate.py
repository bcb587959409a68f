"""Issue 8, bullet 4 (isolate=True): a crashing or hanging candidate cannot take the tuner down.

Each test starts worker processes (spawn: a fresh interpreter importing torch), so there are
few of them and each checks several things.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from autotune_helpers import by_name, check_coverage

import dnntune as dt
from dnntune import reference, testing
from dnntune.errors import AutotuneError
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_C,
    FAKE_ENGINE_CRASHES,
    FAKE_ENGINE_HANGS,
    FAKE_ENGINE_WRONG,
    FakeEngines,
)

WS = testing.ESTIMATED_WORKSPACE_BYTES
NAMES = [FAKE_ENGINE_CRASHES, FAKE_ENGINE_HANGS, FAKE_ENGINE_WRONG, FAKE_ENGINE_A, FAKE_ENGINE_C]


@pytest.fixture
def session() -> Iterator[tuple[FakeEngines, dt.Handle, dt.Graph, dict[int, torch.Tensor]]]:
    with testing.fake_engines(names=NAMES) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        yield fakes, handle, g, testing.make_pack(g)


def _config(fakes: FakeEngines, **extra: Any) -> dt.AutotuneConfig:
    return dt.AutotuneConfig(isolate=True, **fakes.worker_config(), **extra)


def test_crashes_fail_their_candidate_and_the_winner_executes(
    session: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fakes, handle, g, pack = session
    crash = dt.engine_id(FAKE_ENGINE_CRASHES)
    g.add_engine_variants(
        [
            dt.EngineVariant(crash, {"fake.crash_with": "abort"}),
            dt.EngineVariant(crash, {"fake.crash_with": "segv"}),
        ]
    )
    g.add_engines([FAKE_ENGINE_WRONG, FAKE_ENGINE_C, FAKE_ENGINE_A])
    ws = torch.empty(WS, dtype=torch.uint8)
    with caplog.at_level(logging.INFO, logger="dnntune.autotune"):
        results = g.autotune(handle, pack, ws, WS, _config(fakes))
    check_coverage(g, results)
    crashed = [r for r in results if r.engine_name == FAKE_ENGINE_CRASHES]
    assert len(crashed) == 2 and all(not r.succeeded for r in crashed)
    assert all(r.failure_kind == "crash" for r in crashed)
    assert "worker crashed (exit code -6, SIGABRT)" in crashed[0].error_message
    assert "worker crashed (exit code -11, SIGSEGV)" in crashed[1].error_message
    named = by_name(results)
    # the worker verified on its own inputs: the wrong engine failed there
    assert named[FAKE_ENGINE_WRONG].failure_kind == "verification"
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].verified
    assert named[FAKE_ENGINE_C].succeeded and named[FAKE_ENGINE_C].timer_kind == "fake"
    assert results[0].min_time_ms == 1.0 and named[FAKE_ENGINE_C].min_time_ms == 2.0
    assert "isolate worker 3 started" in caplog.text  # one start plus one per crash
    summary = g.last_autotune_summary
    assert summary.isolate and summary.crashed == 2 and summary.winner == FAKE_ENGINE_A
    # the winner was compiled in this process: execute() runs it here, on the fake clock
    fakes.counters.reset()
    y = g.output_tensors()[0]
    pack[y.uid].zero_()
    g.execute(handle, pack, ws)
    assert fakes.counters.executes[FAKE_ENGINE_A] == 1
    expected = reference.run(g, pack)[y.uid]
    torch.testing.assert_close(pack[y.uid], expected.to(pack[y.uid].dtype))


def test_a_hang_kills_the_worker_and_exhaustive_primes_the_winner_here(session: Any) -> None:
    fakes, handle, g, pack = session
    g.add_engines([FAKE_ENGINE_HANGS, FAKE_ENGINE_C, FAKE_ENGINE_A])
    ws = torch.empty(WS, dtype=torch.uint8)
    config = _config(fakes, candidate_timeout_s=3.0, mode=dt.TuneMode.EXHAUSTIVE)
    results = by_name(g.autotune(handle, pack, ws, WS, config))
    hung = results[FAKE_ENGINE_HANGS]
    assert (
        not hung.succeeded and hung.failure_kind == "timeout" and "timed out" in hung.error_message
    )
    assert results[FAKE_ENGINE_C].succeeded
    a = results[FAKE_ENGINE_A]
    assert a.rank == 0 and a.ran_exhaustive
    # the worker's primed state stays in the worker: the winner was primed again here
    assert fakes.counters.priming_compiles[FAKE_ENGINE_A] == 1
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 2  # priming plan + the winner


def test_a_worker_that_cannot_start_fails_every_candidate(session: Any) -> None:
    _fakes, handle, g, pack = session
    g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    config = dt.AutotuneConfig(isolate=True, worker_setup="dnntune_no_such_module:setup")
    with pytest.raises(AutotuneError) as err:
        g.autotune(handle, pack, torch.empty(WS, dtype=torch.uint8), WS, config)
    messages = [r.error_message for r in err.value.results]
    assert len(messages) == 2
    assert all("the isolate worker failed to start" in m for m in messages)
    assert all("dnntune_no_such_module" in m for m in messages)


def test_the_plan_confirmed_is_the_plan_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    """C (0.5 ms) beats the default A (1.0 ms) in the worker, but cannot be compiled in this
    process: it is failed before the confirmation, so the confirmation never speaks of a plan
    the graph does not run (audit, session 17: "confirmed" C was reported while A ran)."""
    from dnntune.autotune import isolation
    from dnntune.autotune.compilation import CompileError

    compile_here = isolation.guarded_compile

    def refuse_c(c: Any, *args: Any, **kwargs: Any) -> Any:
        if c.name == FAKE_ENGINE_C:
            raise CompileError("failed_compile", "no C here")
        return compile_here(c, *args, **kwargs)

    monkeypatch.setattr(isolation, "guarded_compile", refuse_c)
    with testing.fake_engines(
        names=[FAKE_ENGINE_A, FAKE_ENGINE_C], timings={FAKE_ENGINE_C: 0.5}
    ) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
        ws = torch.empty(WS, dtype=torch.uint8)
        results = g.autotune(handle, testing.make_pack(g), ws, WS, _config(fakes))
    check_coverage(g, results)
    named = by_name(results)
    assert results[0].engine_name == FAKE_ENGINE_A == g.get_plan_name()
    assert not named[FAKE_ENGINE_C].succeeded
    assert "failed to compile in the tuning process" in named[FAKE_ENGINE_C].error_message
    summary = g.last_autotune_summary
    assert summary is not None and summary.confirmation is not None
    assert summary.confirmation.verdict == "winner_is_default"


def test_a_busy_sweep_with_a_crash_is_judged_busy(session: Any) -> None:
    """The busy-CPU share read the run-queue wait of whichever worker was alive (and, with a
    timer of its own such as the fake clock, this process's clock, which the workers never
    advance): after a crash the new worker's wait was below the old one's (clipped to 0) or
    none was alive at the end (None), so a sweep timed on a busy CPU passed for a quiet one and
    its ranking was cached. Each worker now reports the wait of its own timing, summed over
    every worker started."""
    fakes, handle, g, pack = session
    fakes.clock.busy_share = 0.6  # in the workers too (worker_config carries it)
    g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_CRASHES, FAKE_ENGINE_C])
    ws = torch.empty(WS, dtype=torch.uint8)
    results, outcome = g.autotune_exhaustive_sweep(handle, pack, ws, WS, _config(fakes))
    named = by_name(results)
    assert named[FAKE_ENGINE_CRASHES].failure_kind == "crash"
    assert named[FAKE_ENGINE_A].succeeded and named[FAKE_ENGINE_C].succeeded
    summary = g.last_autotune_summary
    assert summary.isolate and summary.crashed == 1
    assert summary.timing_cpu_wait_share == pytest.approx(0.6, abs=0.01)
    assert summary.timed_while_busy
    assert outcome is dt.CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU
