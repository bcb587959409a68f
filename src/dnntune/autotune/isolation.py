"""``isolate=True``: compile and time candidates in a worker process that may die.

:class:`IsolatedRunner` keeps one worker process (:mod:`dnntune.autotune.worker`, started with
the "spawn" method) and sends it one request per step: compile each candidate, benchmark each
candidate, take one re-check sample. The worker answers with plain data (a result's measured
fields), which is copied into the candidate's result here.

* A candidate that kills the worker (segfault, abort, illegal memory access) fails with
  "worker crashed (exit code ...)"; the next request starts a fresh worker.
* A candidate that times out inside the worker (its own watchdog, ``candidate_timeout_s``)
  fails with "timed out" and the worker is killed, since a thread of it is stuck; a worker
  that stops answering altogether is killed after a safety deadline.
* The worker verifies candidates on its own inputs, made with
  ``reference.make_inputs(graph, device, config.worker_input_seed)``.

The winner is then compiled here (after priming it again in EXHAUSTIVE mode), run once into
fresh buffers and verified on the caller's inputs, so ``execute()`` works; if that fails, the
next candidate is tried. Isolation needs plan specs (the worker rebuilds plans from engine id
and knobs); compiled plans cannot cross a process boundary.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dnntune.autotune import candidates as cand
from dnntune.autotune.benchmark import ExecutionContext, fail_candidate, log_cost
from dnntune.autotune.candidates import BARRED, FAILED_COMPILE
from dnntune.autotune.compilation import CompileError, apply_workspace_ceiling, guarded_compile
from dnntune.autotune.failures import (
    OOM,
    TIMEOUT,
    UNSUPPORTED,
    VERIFICATION,
    CandidateTimeout,
    RemoteFailure,
    WorkerCrashed,
    describe_failure,
    expected_failure,
    failure_kind,
    release_memory,
)
from dnntune.autotune.priming import PrimingAborted, priming_settings
from dnntune.autotune.search import Budget, learned_engine_rank, search_order, skip_for_budget
from dnntune.autotune.worker import worker_main
from dnntune.graph.json_format import graph_to_dict
from dnntune.measure import contention
from dnntune.rfc import AutotuneConfig, TuneMode

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from dnntune.autotune.verification import Verifier
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = ["WORKER_START_TIMEOUT_S", "IsolatedRunner"]

_log = logging.getLogger(__name__)

#: how long a new worker may take to import, build the graph and compute the reference
WORKER_START_TIMEOUT_S = 300.0
#: added to every request's deadline (the worker's own watchdog should answer first)
_SAFETY_S = 30.0


class _StartFailed(Exception):
    pass


def _graph_document(graph: OpGraph) -> dict[str, Any]:

    return graph_to_dict(graph)


class IsolatedRunner:
    """Runs candidates in a worker subprocess (see the module docstring)."""

    def __init__(
        self,
        graph: OpGraph,
        ctx: ExecutionContext,
        config: AutotuneConfig,
        verifier: Verifier | None,
        deselect: DeselectCriteria,
        workspace_limit: int,
    ) -> None:
        self.graph = graph
        self.ctx = ctx
        self.config = config
        self.verifier = verifier
        self.deselect = deselect
        self.limit = workspace_limit
        self._init = {
            "graph": _graph_document(graph),
            "device": str(ctx.handle.device),
            "seed": config.worker_input_seed,
            "config": dataclasses.replace(config, ranking_fn=None),
            "workspace_bytes": workspace_limit,
        }
        self._mp = multiprocessing.get_context("spawn")
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._start_error: str | None = None
        self._next_index = 0
        #: workers started (1 + restarts)
        self.started = 0
        #: the run-queue wait of the timing, as each worker measured it in its replies: summed
        #: over every worker started, so a restart neither lowers nor loses it
        self.timing_wait = contention.TimingWait()

    # ---- the worker process -------------------------------------------------------------
    def _ensure_worker(self) -> Connection:
        if self._start_error is not None:
            raise _StartFailed(self._start_error)
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            return self._conn
        self._stop_worker()
        parent, child = self._mp.Pipe()

        # not a daemon: a daemonic process may not start processes of its own (compile pools
        # of some providers do); it exits by itself when this end of the pipe closes
        proc = self._mp.Process(
            target=worker_main, args=(child, self._init), name="dnntune-isolate"
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.started += 1
        reply: Any = None
        try:
            if parent.poll(WORKER_START_TIMEOUT_S):
                reply = parent.recv()
        except (EOFError, OSError):
            reply = None
        if not (isinstance(reply, tuple) and reply[0] == "ready"):
            code = self._stop_worker()
            if isinstance(reply, tuple) and reply[0] == "fatal":
                why = reply[1]
            elif reply is None and code is None:
                why = f"no answer within {WORKER_START_TIMEOUT_S:g} s"
            else:
                why = f"it exited with code {code}"
            self._start_error = f"the isolate worker failed to start: {why}"
            _log.error("autotune: %s", self._start_error)
            raise _StartFailed(self._start_error)
        _log.info("autotune: isolate worker %d started (pid %s)", self.started, reply[1])
        return parent

    def _stop_worker(self, kill: bool = False) -> int | None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            try:
                if not kill:
                    conn.send(("stop",))
            except (OSError, ValueError):
                pass
            conn.close()
        if proc is None:
            return None
        proc.join(0 if kill else 5.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
        return proc.exitcode

    def _request(self, message: tuple[Any, ...], deadline_s: float | None, what: str) -> Any:
        conn = self._ensure_worker()
        conn.send(message)
        try:
            ready = conn.poll(deadline_s)
            reply = conn.recv() if ready else None
        except (EOFError, OSError):
            ready, reply = True, None
        if not ready:
            self._stop_worker(kill=True)
            assert deadline_s is not None
            raise CandidateTimeout(f"{what} (the worker stopped answering)", deadline_s)
        if reply is None:
            raise WorkerCrashed(self._stop_worker(kill=True), what)
        if reply[0] == "error":
            _, kind, text = reply
            if kind == TIMEOUT:
                self._stop_worker(kill=True)  # a thread of it is stuck in the candidate
            raise RemoteFailure(text, kind)
        return reply[1]

    def _deadline(self, calls: int) -> float | None:
        t = self.config.candidate_timeout_s
        return None if t is None else calls * t + _SAFETY_S

    @staticmethod
    def _spec(c: cand.Candidate) -> tuple[int, int, list[list[Any]]]:
        return c.index, c.engine_id, [[s.knob_id, s.value] for s in c.knob_settings]

    # ---- CandidateRunner ----------------------------------------------------------------
    def prepare(self, candidates: Sequence[cand.Candidate]) -> None:
        exhaustive = self.config.mode is TuneMode.EXHAUSTIVE
        for c in candidates:
            if not c.in_play:
                continue
            prime = exhaustive and c.prime  # the unprimed default is never primed
            what = f"compile of {c.name}"
            try:
                reply = self._request(
                    ("compile", *self._spec(c), prime), self._deadline(3 if prime else 1), what
                )
            except (_StartFailed, CandidateTimeout, WorkerCrashed, RemoteFailure) as exc:
                c.exclude(FAILED_COMPILE, f"Plan {FAILED_COMPILE}: {exc}", by_caller=False)
                c.result.failure_kind = failure_kind(exc)
                _log.warning("autotune: %s: %s: %s", c.name, FAILED_COMPILE, exc)
                continue
            self._apply(c, reply)
            if reply["priming_aborted"] is not None:
                raise PrimingAborted(c, reply["priming_aborted"])
            if reply["disposition"] is not None:
                c.exclude(
                    reply["disposition"], c.result.error_message, by_caller=False, workspace_size=-1
                )
                expected = c.result.failure_kind == UNSUPPORTED  # a result, shown with -v
                level = logging.INFO if expected else logging.WARNING
                _log.log(level, "autotune: %s: %s", c.name, c.result.error_message)
                continue
            barred = self.deselect.workspace_reason(c.result.workspace_size)
            if barred is not None:
                c.exclude(BARRED, barred, by_caller=True)
        apply_workspace_ceiling(candidates, self.limit)
        _log.info(
            "autotune: compilation (isolate worker) - %d compiled",
            sum(1 for c in candidates if c.result.plan_name),
        )

    def benchmark_all(
        self, candidates: Sequence[cand.Candidate], default: cand.Candidate | None, budget: Budget
    ) -> None:
        # the worker compiled everything in prepare(); the budget skips timing only, and the
        # worker's timed loop does not abandon early
        rank = learned_engine_rank(self.graph, self.ctx.handle, candidates, self.config)
        todo = [c for c in search_order(candidates, self.config, default, rank) if c.in_play]
        exhaustive = self.config.mode is TuneMode.EXHAUSTIVE
        for n, c in enumerate(todo, 1):
            if any(d.result.succeeded for d in todo[: n - 1]) and budget.search_spent():
                skip_for_budget(c, budget)
                continue
            prime = exhaustive and c.prime
            c.result.compiled_plan_index = self._next_index
            self._next_index += 1
            position = f"{n}/{len(todo)}"
            _log.info("autotune: benchmarking %s (%s, isolate worker)", c.name, position)
            start = time.perf_counter()
            calls = 2 + self.config.warmup_iterations
            try:
                reply = self._request(
                    ("benchmark", *self._spec(c), prime, position),
                    self._deadline(calls),
                    f"benchmark of {c.name}",
                )
            except (_StartFailed, CandidateTimeout, WorkerCrashed, RemoteFailure) as exc:
                c.result.benchmark_time_ms = (time.perf_counter() - start) * 1e3
                fail_candidate(c, describe_failure(exc), failure_kind(exc))
                continue
            self._apply(c, reply)
            self.timing_wait.add(*reply["timing_wait"])
            log_cost(c)
            if not c.result.succeeded:
                c.fail(c.result.error_message)
                level = logging.INFO if expected_failure(c.result.failure_kind) else logging.WARNING
                _log.log(level, "autotune: %s failed: %s", c.name, c.result.error_message)

    def sample(self, c: cand.Candidate) -> float:
        prime = self.config.mode is TuneMode.EXHAUSTIVE and c.prime
        reply = self._request(
            ("sample", *self._spec(c), prime, c.result.launches_per_sample),
            self._deadline(1),
            f"re-check sample of {c.name}",
        )
        self.timing_wait.add(*reply["timing_wait"])
        return float(reply["ms"])

    def materialize(self, c: cand.Candidate) -> bool:
        """Compile the winner here (priming it first in EXHAUSTIVE mode) and verify it on
        the caller's inputs; False (and ``c`` failed) if either fails."""
        start = time.perf_counter()
        handle, watchdog = self.ctx.handle, self.ctx.watchdog
        if self.config.mode is TuneMode.EXHAUSTIVE and c.result.ran_exhaustive:
            try:  # the worker's primed state (e.g. a benchmark cache) did not come along
                primer = guarded_compile(
                    c, self.graph, handle, watchdog, priming_settings(c.knob_settings), "priming"
                )
                self.ctx.run_once_synchronized(primer)
                del primer
            except Exception as exc:
                _log.warning("autotune: %s: priming the winner here failed: %s", c.name, exc)
        try:
            plan = guarded_compile(c, self.graph, handle, watchdog)
            verdict = self.ctx.verify(plan, self.verifier) if self.verifier else None
        except CompileError as exc:
            message = f"the winner failed to compile in the tuning process: {exc}"
            kind = exc.kind
        except Exception as exc:
            message = f"the winner failed to run in the tuning process: {describe_failure(exc)}"
            kind = failure_kind(exc)
        else:
            c.result.compile_time_ms += (time.perf_counter() - start) * 1e3
            if verdict is None or verdict.ok is not False:
                c.plan = plan
                return True
            message = f"failed verification on the caller's inputs: {verdict.message}"
            kind = VERIFICATION
        fail_candidate(c, message, kind)
        if kind == OOM:
            release_memory(handle.device)
        return False

    def cpu_wait_s(self) -> float | None:
        """The run-queue wait of the workers' threads while they timed (each benchmark and
        sample reply carries its own), summed over every worker started: it was read from
        whichever worker was alive, so after a crash and restart it went back (clipped to 0)
        or was None with no worker left, and a busy sweep passed for a quiet one."""
        return self.timing_wait.wait_s()

    def timed_s(self) -> float:
        """Wall seconds of the timing :meth:`cpu_wait_s` covers (the workers' clocks)."""
        return self.timing_wait.wall_s()

    def close(self) -> None:
        self._stop_worker()
        self.ctx.watchdog.close()

    # ---- helpers ------------------------------------------------------------------------
    def _apply(self, c: cand.Candidate, reply: dict[str, Any]) -> None:
        """Copy the worker's measurements into ``c.result``; a worker with a stuck thread
        (a call its watchdog gave up on) is killed, the next request starts a fresh one."""
        for name, value in reply["result"].items():
            setattr(c.result, name, value)
        if reply["stuck"]:
            self._stop_worker(kill=True)
