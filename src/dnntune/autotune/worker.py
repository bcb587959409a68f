"""The isolate worker: a child process that compiles and times candidates for the session.

Started by :class:`~dnntune.autotune.isolation.IsolatedRunner` with the "spawn" start method,
so it shares nothing with the tuning process but what it is sent: the graph as JSON, the
device, the config and the seed of the inputs. It then

1. calls ``config.worker_setup`` ("module:function", with ``config.worker_setup_args``) so
   engines registered in the tuning process with ``register()`` (or the fakes of
   ``dnntune.testing``) exist here too; entry-point providers load on their own;
2. rebuilds the graph (``graph_from_dict``), creates its own handle on the same device, makes
   the inputs with ``reference.make_inputs(graph, device, seed)`` (the same seed gives the same
   data as the tuning process) and computes the reference once;
3. answers requests (compile, benchmark, sample) with plain data, running each candidate with
   the same code as the in-process path, watchdog included. A benchmark or sample reply also
   carries the run-queue wait and wall time of its timing alone (``timing_wait``: a plan a
   restarted worker compiles again first is left out), which the tuning process adds up over
   every worker it started.

A candidate that crashes the process (a segfault, an abort, an illegal memory access) takes the
worker with it; the tuning process reports the candidate as crashed and starts a new worker.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dnntune import reference
from dnntune.autotune import candidates as cand
from dnntune.autotune.benchmark import ExecutionContext, benchmark_candidate, steady_sample
from dnntune.autotune.compilation import CompileError, guarded_compile, record_compile_failure
from dnntune.autotune.failures import describe_failure, failure_kind
from dnntune.autotune.priming import PrimingAborted, prime_candidates
from dnntune.autotune.runner import install_cold_flush
from dnntune.autotune.verification import Verifier
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.handle import create_handle
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.plans import allocate_workspace
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict
from dnntune.measure import contention
from dnntune.rfc import AutotuneConfig, AutotuneResult, PlanSpec, TuneMode

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from dnntune.backend.engine import Plan

__all__ = ["IDENTITY_FIELDS", "measured_fields", "run_worker_setup", "worker_main"]

#: AutotuneResult fields the tuning process owns; every other field is measured here
IDENTITY_FIELDS = frozenset(
    {
        "engine_id",
        "engine_name",
        "knob_settings",
        "rank",
        "compiled_plan_index",
        "mode_used",
        "strategy_used",
        "excluded_by_caller",
        "estimated_workspace_size",
        "supports_exhaustive",
        "cache_mode",
        "is_default",
    }
)


def measured_fields(result: AutotuneResult) -> dict[str, Any]:
    """The measured fields of ``result`` as plain data."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        if f.name in IDENTITY_FIELDS:
            continue
        value = getattr(result, f.name)
        out[f.name] = list(value) if isinstance(value, list) else value
    return out


def run_worker_setup(path: str | None, args: Mapping[str, Any]) -> None:
    """Call the "module:function" hook with ``args`` as keyword arguments (None: nothing)."""
    if not path:
        return
    module_name, _, attr = path.partition(":")
    function = getattr(importlib.import_module(module_name), attr)
    function(**dict(args))


class _Worker:
    def __init__(self, init: Mapping[str, Any]) -> None:

        self.config: AutotuneConfig = init["config"]
        run_worker_setup(self.config.worker_setup, self.config.worker_setup_args)
        self.handle = create_handle(init["device"])
        self.graph = graph_from_dict(init["graph"], OpGraph)
        self.limit: int = init["workspace_bytes"]
        pack = reference.make_inputs(self.graph, self.handle.device, seed=init["seed"])
        workspace = allocate_workspace(self.limit, self.handle.device)
        watchdog = Watchdog(self.config.candidate_timeout_s, self.handle.device)
        self.ctx = ExecutionContext(self.handle, pack, workspace, watchdog=watchdog)
        self.verifier: Verifier | None = None
        if self.config.verify:
            self.verifier = Verifier(self.graph, pack, self.config)
            self.verifier.prepare()
        install_cold_flush(self.ctx, self.config)
        self.candidates: dict[int, cand.Candidate] = {}

    def _timed(self) -> tuple[contention.TimingWait, AbstractContextManager[None]]:
        """A tally of one request's timing and the span that measures it (this process)."""
        timer = self.handle.timer
        tally = contention.TimingWait()
        span = tally.span(lambda: contention.timer_wait_s(timer), contention.timer_clock(timer))
        return tally, span

    # ---- candidates -----------------------------------------------------------------------
    def _candidate(self, index: int, engine_id: int, knobs: list[list[Any]]) -> cand.Candidate:
        c = self.candidates.get(index)
        if c is None:
            spec = PlanSpec(engine_id, [KnobSetting(k, v) for k, v in knobs])
            c = cand.from_plan_specs(self.graph, [spec], self.config)[0]
            c.index = index
            self.candidates[index] = c
        return c

    def _compile(self, c: cand.Candidate, prime: bool) -> dict[str, Any]:
        """Prime (EXHAUSTIVE) and compile ``c``; its fields plus the disposition."""
        out: dict[str, Any] = {"priming_aborted": None}
        if prime and self.config.mode is TuneMode.EXHAUSTIVE:
            try:
                prime_candidates(
                    self.graph,
                    self.handle,
                    [c],
                    self.ctx.run_once_synchronized,
                    self.limit,
                    self.config,
                    self.ctx.watchdog,
                )
            except PrimingAborted as exc:
                out["priming_aborted"] = exc.message
        start = time.perf_counter()
        try:
            plan = guarded_compile(c, self.graph, self.handle, self.ctx.watchdog)
        except CompileError as exc:
            record_compile_failure(c, exc)
        else:
            c.plan = plan
            c.result.workspace_size = plan.workspace_size
            c.result.plan_name = plan.name
        c.result.compile_time_ms = (time.perf_counter() - start) * 1e3
        out.update(self._reply(c))
        return out

    def _reply(self, c: cand.Candidate) -> dict[str, Any]:
        return {
            "disposition": c.disposition,
            "result": measured_fields(c.result),
            # a call the watchdog gave up on still runs here: the tuning process restarts us
            "stuck": self.ctx.watchdog.abandoned > 0,
        }

    def _plan(self, c: cand.Candidate, prime: bool) -> Plan:
        """``c``'s plan; a restarted worker compiles (and primes) it again."""
        if c.plan is None:
            self._compile(c, prime)
        if c.plan is None:
            raise RuntimeError(f"{c.name} no longer compiles: {c.result.error_message}")
        return c.plan

    # ---- requests -------------------------------------------------------------------------
    def serve(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        op = message[0]
        if op == "compile":
            _, index, engine_id, knobs, prime = message
            self.candidates.pop(index, None)
            c = self._candidate(index, engine_id, knobs)
            return ("compiled", self._compile(c, prime))
        if op == "benchmark":
            _, index, engine_id, knobs, prime, position = message
            c = self._candidate(index, engine_id, knobs)
            self._plan(c, prime)
            tally, span = self._timed()
            with span:
                benchmark_candidate(c, self.ctx, self.config, self.verifier, position)
            reply = self._reply(c)
            reply["timing_wait"] = [tally.wait_s(), tally.wall_s()]
            return ("benchmarked", reply)
        if op == "sample":
            _, index, engine_id, knobs, prime, launches = message
            c = self._candidate(index, engine_id, knobs)
            plan = self._plan(c, prime)
            tally, span = self._timed()
            with span:
                ms = steady_sample(self.ctx, plan, self.config.ranking_metric, launches)
            return ("sample", {"ms": ms, "timing_wait": [tally.wait_s(), tally.wall_s()]})
        raise ValueError(f"unknown isolate worker request {op!r}")


def worker_main(conn: Connection, init: Mapping[str, Any]) -> None:
    """The worker process's entry point (see the module docstring)."""
    # Ctrl-C reaches the whole process group: let the tuning process handle it and stop us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = _Worker(init)
    except BaseException as exc:
        conn.send(("fatal", describe_failure(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        try:
            reply = worker.serve(message)
        except Exception as exc:
            reply = ("error", failure_kind(exc), describe_failure(exc))
        conn.send(reply)
