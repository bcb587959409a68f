"""Where candidates are compiled and timed: in this process, or in a worker (``isolation``).

The session drives a :class:`CandidateRunner` through the same steps either way:
``prepare`` (EXHAUSTIVE priming, compiling plan specs, the workspace checks), ``benchmark_all``
(verify, warm up, time), ``sample`` (one more sample for the interleaved re-check) and
``materialize`` (make sure the chosen winner is an executable plan in this process).
:class:`InProcessRunner` runs everything here, each call into a candidate bounded by the
watchdog when ``candidate_timeout_s`` is set.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from dnntune.autotune import candidates as cand
from dnntune.autotune.benchmark import ExecutionContext, benchmark_candidate, steady_sample
from dnntune.autotune.call_floor import (
    cannot_win,
    floor_gated,
    floor_ms,
    gated_last,
    skip_for_floor,
)
from dnntune.autotune.compilation import (
    apply_workspace_ceiling,
    compile_candidates,
    unsupported_here,
)
from dnntune.autotune.priming import prime_candidates
from dnntune.autotune.search import (
    Budget,
    expected_compile_s,
    learned_engine_rank,
    note_compile,
    search_order,
    skip_for_budget,
)
from dnntune.measure import cold_flush, contention
from dnntune.rfc import AutotuneConfig, TuneMode

if TYPE_CHECKING:
    from dnntune.autotune.verification import Verifier
    from dnntune.backend.engine import Plan
    from dnntune.backend.handle import Handle
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = ["CandidateRunner", "InProcessRunner", "install_cold_flush"]

_log = logging.getLogger(__name__)


class CandidateRunner(Protocol):
    """What the session needs from wherever candidates run."""

    def prepare(self, candidates: Sequence[cand.Candidate]) -> None:
        """Prime (EXHAUSTIVE) and compile (plan-spec path); apply the workspace checks.

        Raises:
            PrimingAborted: priming failed under ABORT_ON_PRIMING_FAILURE.
        """

    def benchmark_all(
        self, candidates: Sequence[cand.Candidate], default: cand.Candidate | None, budget: Budget
    ) -> None:
        """Verify, warm up and time every candidate still in play (failures become data), in
        ``search.search_order``; candidates the budget leaves no time for are skipped.

        Raises:
            PrimingAborted: under a budget, priming happens candidate by candidate here.
        """

    def sample(self, c: cand.Candidate) -> float:
        """One more timed sample of a succeeded candidate, in ms (raises on failure)."""
        ...

    def materialize(self, c: cand.Candidate) -> bool:
        """Make ``c.plan`` an executable plan here; False (``c`` failed) if it cannot be."""
        ...

    def close(self) -> None:
        """Release threads, processes and buffers."""

    def cpu_wait_s(self) -> float | None:
        """Seconds the threads timing the candidates have waited for a CPU core so far, in the
        timing alone (verification, warmup, samples; never a compile or priming:
        :class:`dnntune.measure.contention.TimingWait`; None: unknown)."""
        ...

    def timed_s(self) -> float:
        """Wall seconds of the timing :meth:`cpu_wait_s` covers so far: the clock its share
        (:func:`dnntune.measure.contention.wait_share`) is taken on."""
        ...


def install_cold_flush(ctx: ExecutionContext, config: AutotuneConfig) -> None:
    """Install the cold-cache flush (:func:`dnntune.measure.cold_flush`) on ``ctx`` when
    ``config.cache_mode`` is "cold" and it has none yet."""
    if ctx.flush is None:
        ctx.flush = cold_flush(ctx.handle.device, config.cache_mode)


class InProcessRunner:
    """Compiles and times candidates in this process (the default)."""

    def __init__(
        self,
        graph: OpGraph,
        ctx: ExecutionContext,
        config: AutotuneConfig,
        verifier: Verifier | None,
        spec_path: bool,
        deselect: DeselectCriteria,
        workspace_limit: int,
        prebuilt: Sequence[Plan] = (),
    ) -> None:
        self.graph = graph
        self.ctx = ctx
        self.config = config
        self.verifier = verifier
        self.spec_path = spec_path
        self.deselect = deselect
        self.limit = workspace_limit
        #: plans built before the call (``PlanSet.prebuilt``), taken by the candidates that
        #: would build them again, before any priming
        self.prebuilt = tuple(prebuilt)
        self._compiled_index: dict[int, int] = {}
        #: candidates left unbuilt by ``prepare`` to be built in their turn, after every other
        #: candidate was timed, unless their call floor already loses (``autotune.call_floor``)
        self._deferred: list[cand.Candidate] = []
        #: the run-queue wait of the timing alone (under a budget, compiles happen between)
        self.timing_wait = contention.TimingWait()

    @property
    def handle(self) -> Handle:
        return self.ctx.handle

    def prepare(self, candidates: Sequence[cand.Candidate]) -> None:
        if not self.spec_path:
            apply_workspace_ceiling(candidates, self.limit)
            return
        if self.config.time_budget_s is not None:
            return  # under a budget each candidate is primed and compiled in its turn
        if sum(1 for c in candidates if c.in_play) > 1:
            self._deferred = [
                c for c in candidates if c.in_play and floor_gated(c, self.handle, self.config)
            ]
        deferred = {id(c) for c in self._deferred}
        self._build([c for c in candidates if id(c) not in deferred])

    def _build(self, candidates: Sequence[cand.Candidate]) -> None:
        """Prime (EXHAUSTIVE), compile and check the workspace of ``candidates``."""
        watchdog = self.ctx.watchdog
        if self.config.mode is TuneMode.EXHAUSTIVE:
            # the unprimed default first: an engine's search record (cuDNN's find db) could
            # otherwise reach the build of the plan the caller runs untuned
            self._compile([c for c in candidates if not c.prime], self.prebuilt)
            candidates = [c for c in candidates if c.prime]
            prime_candidates(
                self.graph,
                self.handle,
                candidates,
                self.ctx.run_once_synchronized,
                self.limit,
                self.config,
                watchdog,
            )
            self._compile(candidates)  # primed: each builds from its search, never prebuilt
            return
        self._compile(candidates, self.prebuilt)

    def _compile(self, candidates: Sequence[cand.Candidate], prebuilt: Sequence[Plan] = ()) -> None:
        if not candidates:
            return
        compiled = compile_candidates(
            self.graph, self.handle, candidates, self.deselect, self.ctx.watchdog, prebuilt
        )
        for plan in compiled:
            self._compiled_index[id(plan)] = len(self._compiled_index)
        for c in candidates:
            note_compile(c)
        apply_workspace_ceiling(candidates, self.limit)

    def benchmark_all(
        self, candidates: Sequence[cand.Candidate], default: cand.Candidate | None, budget: Budget
    ) -> None:
        install_cold_flush(self.ctx, self.config)
        # under a budget, priming and compiling happen here, one candidate at a time
        build = self.spec_path and self.config.time_budget_s is not None
        rank = learned_engine_rank(self.graph, self.handle, candidates, self.config)
        todo = [c for c in search_order(candidates, self.config, default, rank) if c.in_play]
        gated: set[int] = set()
        if self.spec_path and len(todo) > 1:
            gated = {id(c) for c in todo if floor_gated(c, self.handle, self.config)}
            todo = gated_last(todo, [c for c in todo if id(c) in gated])
        deferred = {id(c) for c in self._deferred}
        margin = self.config.abandon_margin
        best: cand.Candidate | None = None
        for n, c in enumerate(todo, 1):
            in_turn = build or id(c) in deferred
            if in_turn and unsupported_here(c, self.graph, self.handle):
                continue
            if best is not None and budget.search_spent():
                skip_for_budget(c, budget)
                continue
            if in_turn:
                compile_s = expected_compile_s(c, self.config)
                if best is not None and not budget.affords(compile_s):
                    skip_for_budget(c, budget, compile_s)
                    continue
                if best is not None and id(c) in gated:
                    floor = floor_ms(c, self.handle)
                    if floor is not None and cannot_win(floor, best.result, margin):
                        skip_for_floor(c, floor, best.result)
                        continue
                self.timing_wait.close()  # a compile is no timing
                self._build([c])
                if not c.in_play:
                    continue
            assert c.plan is not None
            if self.spec_path:
                c.result.compiled_plan_index = self._compiled_index[id(c.plan)]
            else:
                c.result.compiled_plan_index = c.collection_index
            with self._timing():
                benchmark_candidate(
                    c,
                    self.ctx,
                    self.config,
                    self.verifier,
                    f"{n}/{len(todo)}",
                    budget=budget,
                    best=best.result if best is not None else None,
                )
            if c.result.succeeded and (
                best is None or c.result.decision_time_ms < best.result.decision_time_ms
            ):
                best = c

    def sample(self, c: cand.Candidate) -> float:
        assert c.plan is not None
        metric = self.config.ranking_metric
        # samples come back to back (re-check and confirmation rounds): one span, open from
        # the first, read when the share is asked, not around each sample
        timer = self.ctx.handle.timer
        self.timing_wait.begin(
            lambda: contention.timer_wait_s(timer), contention.timer_clock(timer)
        )
        return steady_sample(self.ctx, c.plan, metric, c.result.launches_per_sample)

    def materialize(self, c: cand.Candidate) -> bool:
        return c.plan is not None

    def _timing(self) -> AbstractContextManager[None]:
        timer = self.ctx.handle.timer
        return self.timing_wait.span(
            lambda: contention.timer_wait_s(timer), contention.timer_clock(timer)
        )

    def cpu_wait_s(self) -> float | None:
        return self.timing_wait.wait_s()

    def timed_s(self) -> float:
        return self.timing_wait.wall_s()

    def close(self) -> None:
        self.timing_wait.close()
        self.ctx.watchdog.close()
