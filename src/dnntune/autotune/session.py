"""One autotune() call from start to winner (RFC 0013 sections 6.3 and 6.4).

:func:`run_autotune` checks everything it can before spending time (config, handle, variant
pack, workspace, which path), builds one candidate per plan spec or compiled plan, applies the
caller's exclusions, primes (EXHAUSTIVE), compiles (plan-spec path), verifies and times each
candidate, re-times close contenders interleaved and decides on those samples, ranks, and
returns every candidate's result with the winning plan. Candidates run in this process
(:class:`~dnntune.autotune.runner.InProcessRunner`) or, with ``isolate=True``, in a worker
process (:class:`~dnntune.autotune.isolation.IsolatedRunner`). The graph's plans come in as
one :class:`~dnntune.autotune.plan_set.PlanSet` (the ``Graph`` facade owns it); what the call
cost (:class:`~dnntune.autotune.cost.AutotuneSummary`) is returned and recorded in the set,
which ``Graph.last_autotune_summary`` reads.
:func:`run_exhaustive_sweep`, the same run over every applicable engine that also records the
full ranking in the exact-match cache, lives in :mod:`dnntune.autotune.exhaustive`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dnntune.autotune import candidates as cand
from dnntune.autotune.baseline import confirm_against_default, find_default
from dnntune.autotune.benchmark import ExecutionContext
from dnntune.autotune.confirm import Confirmation
from dnntune.autotune.cost import AutotuneSummary, summarize
from dnntune.autotune.decision import winner_margin
from dnntune.autotune.isolation import IsolatedRunner
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.preconditions import (
    check_config,
    check_workspace,
    detect_path,
    writer_available,
)
from dnntune.autotune.priming import PrimingAborted, cap_workspace_limit
from dnntune.autotune.ranking import (
    SortKey,
    by_decision_time,
    by_min_time,
    rank_and_say,
)
from dnntune.autotune.recheck import Recheck, recheck_close_contenders
from dnntune.autotune.runner import CandidateRunner, InProcessRunner
from dnntune.autotune.search import Budget
from dnntune.autotune.unprimed import add_unprimed_default, fold_unprimed, primed_twin
from dnntune.autotune.verdicts import DEFAULT_FAILED
from dnntune.autotune.verification import Verifier
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.handle import Handle
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.errors import (
    AutotuneError,
    InvalidValueError,
    NotSupportedError,
    Status,
)
from dnntune.measure import contention
from dnntune.overrides.writer import write_autotune_winner
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneResult,
    AutotuneStorageConfig,
    PrimingFailurePolicy,
    TuneMode,
)

if TYPE_CHECKING:
    import torch

    from dnntune.backend.engine import Plan
    from dnntune.graph.ir import OpGraph

__all__ = ["AutotuneOutcome", "run_autotune"]

_log = logging.getLogger(__name__)


@dataclass
class AutotuneOutcome:
    """What one autotune() call produced: ranked results (one per candidate) and the winner."""

    results: list[AutotuneResult]
    winner: Plan
    winner_result: AutotuneResult
    #: True when the candidates came from plan specs (False: the compiled-plan collection)
    plan_spec_path: bool
    #: what the call cost, counts and the winner's margin (also ``plan_set.summary``)
    summary: AutotuneSummary | None = None
    #: the winner against the default plan (``dnntune.autotune.confirm``)
    confirmation: Confirmation | None = None


# ---- the session -----------------------------------------------------------------------------
def run_autotune(
    graph: OpGraph,
    plan_set: PlanSet,
    handle: Handle,
    variant_pack: Mapping[Any, Any],
    workspace: torch.Tensor | None,
    workspace_size: int | None,
    config: AutotuneConfig | None = None,
    storage_config: AutotuneStorageConfig | None = None,
    *,
    ranking_key: SortKey | None = None,
) -> AutotuneOutcome:
    """Benchmark the candidates of ``plan_set`` (the graph's plan specs or compiled plans)
    and choose the winner (see the module docstring). What the call cost is recorded in
    ``plan_set.summary``, also when it raises, and returned in the outcome.

    Raises:
        InvalidValueError: a bad config, handle, variant pack or workspace.
        BadStateError: both or neither path's candidates exist, or the wrong call form.
        AutotuneError: no candidate left after filtering (status INVALID_VALUE), every
            candidate failed, or priming failed under ABORT_ON_PRIMING_FAILURE; ``.results``
            holds one entry per candidate.
    """
    start = time.perf_counter()
    plan_set.summary = None  # a call that raises before any candidate ran leaves no old one
    config = check_config(config)
    budget = Budget.for_call(config, getattr(handle, "timer", None))
    storage = storage_config or AutotuneStorageConfig()
    if not isinstance(handle, Handle):
        raise InvalidValueError(
            f"autotune: handle must be a Handle (create_handle()), got {handle!r}"
        )
    have_bytes = check_workspace(workspace, workspace_size)
    pack = normalize_variant_pack(graph, variant_pack, handle)
    specs, plans = detect_path(plan_set, workspace_size)
    spec_path = specs is not None
    if config.isolate and not spec_path:
        raise NotSupportedError(
            "autotune: isolate=True needs the plan-spec path (add_engine_*() + the general "
            "autotune form with workspace_size): compiled plans cannot move to a worker "
            "process; run this graph with isolate=False"
        )
    if not spec_path and config.mode is TuneMode.EXHAUSTIVE:
        raise InvalidValueError(
            "autotune: EXHAUSTIVE mode needs the plan-spec path (add_engine_*()); on the "
            "compiled-plan path set global.benchmarking with create_execution_plan_ext() instead"
        )
    writer_available(storage)
    deselect = plan_set.deselect
    limit = workspace_size if workspace_size is not None else have_bytes

    if spec_path:
        candidates = cand.from_plan_specs(graph, list(specs), config)
        cand.apply_deselect_engines(candidates, deselect)
    else:
        candidates = cand.from_plan_collection(graph, plans, config)
        if workspace is None and workspace_size is None:
            needs = [c for c in candidates if c.in_play and c.plan and c.plan.workspace_size > 0]
            if needs:
                raise InvalidValueError(
                    f"autotune: workspace is None but plan {needs[0].name} needs "
                    f"{needs[0].plan.workspace_size} bytes; allocate get_autotune_workspace_size()"  # type: ignore[union-attr]
                    " bytes (torch.uint8)"
                )
    cand.apply_engine_id_filter(candidates, config)
    _log.info(
        "autotune: session start - %d candidate(s) (%s path), mode=%s, strategy=%s, verify=%s, "
        "metric=%s, cache=%s, workspace limit=%d bytes%s",
        len(candidates),
        "plan-spec" if spec_path else "compiled-plan",
        config.mode.name,
        config.strategy.name,
        config.verify,
        config.ranking_metric,
        config.cache_mode,
        limit,
        ", isolated" if config.isolate else "",
    )
    try:
        _require_some_in_play(candidates)
    except AutotuneError:  # every candidate filtered out: what the call cost, all the same
        plan_set.summary = _summarize(candidates, config, start, Recheck(), None)
        raise
    if ranking_key is None:
        ranking_key = by_min_time if config.ranking_statistic == "min" else by_decision_time
    default = find_default(graph, handle, candidates, config.baseline)
    if spec_path and config.mode is TuneMode.EXHAUSTIVE:
        # the plan the caller runs untuned is the default unprimed: priming changes what the
        # default's own candidate builds, so a copy of it stays out of priming and is the
        # baseline (first in the list: compiled before any priming, in a worker too)
        default = add_unprimed_default(candidates, default)
        cap_workspace_limit(graph, candidates, limit)
    twin = primed_twin(candidates, default)
    if default is not None:
        default.result.is_default = True
        _log.info("autotune: the default plan (heuristic pick) is %s", default.name)

    watchdog = Watchdog(config.candidate_timeout_s, handle.device)
    ctx = ExecutionContext(handle, pack, workspace, watchdog=watchdog)
    verifier = Verifier(graph, pack, config) if config.verify else None
    runner: CandidateRunner
    if config.isolate:
        runner = IsolatedRunner(graph, ctx, config, verifier, deselect, limit)
    else:
        runner = InProcessRunner(
            graph, ctx, config, verifier, spec_path, deselect, limit, plan_set.prebuilt
        )
    recheck = Recheck()
    outcome: AutotuneOutcome | None = None
    timing_wait_share: float | None = None
    try:
        if verifier is not None:
            verifier.prepare()  # the reference sees the caller's inputs before anything runs
        timing_wait = _unmeasured  # (priming aborted before any timing)
        try:
            runner.prepare(candidates)
            _require_some_in_play(candidates, after_compile=True)
            # a share of the timing alone, on the threads that time: the runner counts the
            # wait and wall time of its timing spans only (under a budget, compiles and
            # priming happen between them, inside benchmark_all)
            timing_wait = contention.wait_share(runner.cpu_wait_s, runner.timed_s)
            runner.benchmark_all(candidates, default, budget)
        except PrimingAborted as exc:
            _abort_after_priming(candidates, exc)
        recheck_config = config
        if budget.search_spent():  # the interleaved re-check takes its minimum rounds only
            recheck_config = dataclasses.replace(config, recheck_max_rounds=config.recheck_rounds)
        recheck = recheck_close_contenders(
            candidates, runner.sample, recheck_config, budget.search_spent
        )
        timing_wait_share = timing_wait()
        confirm_config = dataclasses.replace(
            config, confirm_budget_ms=budget.confirm_budget_ms(config.confirm_budget_ms)
        )
        outcome = _finish(
            graph,
            candidates,
            confirm_config,
            storage,
            spec_path,
            ranking_key,
            recheck,
            runner,
            default,
            budget.clock,
            twin,
        )
    except AutotuneError as exc:
        if twin is not None and default is not None:  # one result per plan spec, failed too
            exc.results = [r for r in exc.results if r is not default.result]
        raise
    finally:
        runner.close()
        ctx.release()
        if verifier is not None:
            verifier.restore_inputs()
        confirmation = outcome.confirmation if outcome is not None else None
        summary = _summarize(candidates, config, start, recheck, confirmation)
        summary.budget_used_s = budget.elapsed_s() if budget.limited else 0.0
        summary.timing_cpu_wait_share = timing_wait_share
        plan_set.summary = summary
    assert outcome is not None
    outcome.summary = summary
    return outcome


def _unmeasured() -> float | None:
    return None


def _summarize(
    candidates: Sequence[cand.Candidate],
    config: AutotuneConfig,
    start: float,
    recheck: Recheck,
    confirmation: Confirmation | None,
) -> AutotuneSummary:
    """Add up the call and log it."""
    results = [c.result for c in candidates]
    total_ms = (time.perf_counter() - start) * 1e3
    summary = summarize(
        results, config, total_ms, recheck.time_ms, recheck.rounds, confirmation=confirmation
    )
    _log.info("autotune: session done %s", summary.describe())
    return summary


def _require_some_in_play(
    candidates: Sequence[cand.Candidate], after_compile: bool = False
) -> None:
    if any(c.in_play for c in candidates):
        return
    results = [c.result for c in candidates]
    summary = cand.exclusion_summary(candidates)
    by_caller = all(c.result.excluded_by_caller for c in candidates)
    if by_caller:
        raise AutotuneError(
            f"autotune: no candidates remain after filtering ({len(candidates)} candidate(s): "
            f"{summary}); relax engine_id_filter / deselect_*() or the workspace limit",
            results,
            Status.INVALID_VALUE,
        )
    raise AutotuneError(
        f"autotune: all {len(candidates)} candidate(s) failed "
        f"{'to compile ' if after_compile else ''}or were excluded ({summary}); no winner selected",
        results,
        Status.EXECUTION_FAILED,
    )


def _abort_after_priming(candidates: Sequence[cand.Candidate], exc: PrimingAborted) -> None:
    failed = exc.candidate
    failed.fail(f"autotune aborted: priming failed: {exc.message}")
    for c in candidates:
        if c.in_play:
            # (under a time budget candidates are primed in turn: some were timed already)
            done = "benchmarked, then discarded" if c.result.benchmarked else "not benchmarked"
            c.fail(f"{done}: autotune aborted after priming of {failed.name} failed")
    _log.error("autotune: priming of %s failed: %s; aborting", failed.name, exc.message)
    raise AutotuneError(
        f"autotune: EXHAUSTIVE priming of {failed.name} failed: {exc.message}. autotune() "
        f"aborted (priming_failure_policy=ABORT_ON_PRIMING_FAILURE); use "
        f"{PrimingFailurePolicy.BENCHMARK_UNPRIMED.name} to benchmark it unprimed",
        [c.result for c in candidates],
        Status.EXECUTION_FAILED,
    )


def _executable_first(
    ranked: list[AutotuneResult],
    by_result: dict[int, cand.Candidate],
    runner: CandidateRunner,
) -> list[AutotuneResult]:
    """``ranked`` with failed ones moved back until its first can run here
    (:meth:`CandidateRunner.materialize`: under ``isolate`` it is compiled and verified again
    in this process; a failure fails the candidate)."""
    while ranked and ranked[0].succeeded and not runner.materialize(by_result[id(ranked[0])]):
        ranked = _rerank(ranked)
    return ranked


def _rerank(ranked: list[AutotuneResult]) -> list[AutotuneResult]:
    """Succeeded first (order kept), failed after; ranks reassigned."""
    ok = [r for r in ranked if r.succeeded]
    failed = [r for r in ranked if not r.succeeded]
    for i, r in enumerate(ok):
        r.rank = i
    for r in failed:
        r.rank = -1
    return [*ok, *failed]


def _contenders_first(ranked: list[AutotuneResult], recheck: Recheck) -> list[AutotuneResult]:
    """The re-measured contenders in their decided order, then the rest as ranked."""
    first = [c.result for c in recheck.order if c.result.succeeded]
    chosen = {id(r) for r in first}
    return _rerank([*first, *(r for r in ranked if id(r) not in chosen)])


def _finish(
    graph: OpGraph,
    candidates: Sequence[cand.Candidate],
    config: AutotuneConfig,
    storage: AutotuneStorageConfig,
    spec_path: bool,
    ranking_key: SortKey,
    recheck: Recheck,
    runner: CandidateRunner,
    default: cand.Candidate | None,
    clock: Callable[[], float],
    twin: cand.Candidate | None = None,
) -> AutotuneOutcome:
    ranked, caller_ranked = rank_and_say(
        [c.result for c in candidates], config.ranking_fn, ranking_key
    )
    if not caller_ranked and recheck.order:
        ranked = _contenders_first(ranked, recheck)
    by_result = {id(c.result): c for c in candidates}
    # the winner must be executable here (under isolate it is compiled and verified again):
    # before the confirmation, so that the plan confirmed is the plan selected
    ranked = _executable_first(ranked, by_result, runner)
    # never worse than the default: the winner must beat it in fresh interleaved rounds
    ranked, confirmation = confirm_against_default(
        ranked, candidates, default, runner, config, clock, caller_ranked=caller_ranked
    )
    if confirmation is not None and confirmation.kept_default:
        before = ranked[0] if ranked else None
        ranked = _executable_first(ranked, by_result, runner)
        if ranked and ranked[0] is not before and ranked[0].succeeded:
            # the default it kept cannot run here: the challenger stands, unconfirmed
            confirmation = dataclasses.replace(confirmation, verdict=DEFAULT_FAILED)
            ranked[0].confirmation = DEFAULT_FAILED
    if twin is not None and default is not None:
        ranked = fold_unprimed(ranked, default, twin)
    n_ok = sum(1 for r in ranked if r.succeeded)
    _log.info("autotune: ranking complete - %d succeeded, %d failed", n_ok, len(ranked) - n_ok)
    if n_ok == 0:
        raise AutotuneError(
            f"autotune: all engines failed during autotuning; no winner selected "
            f"({cand.exclusion_summary(candidates)}); see each result's error_message",
            ranked,
            Status.EXECUTION_FAILED,
        )
    winner = by_result[id(ranked[0])]
    assert winner.plan is not None
    margin = winner_margin(ranked)
    winner.result.separated = margin.separated if margin.runner_up is not None else None
    winner.result.separation_noise = margin.noise
    _log.info(
        "autotune: winner - %s (ID %d), min=%.4f ms",
        winner.name,
        winner.engine_id,
        winner.result.min_time_ms,
    )
    if storage.file_path:
        write_autotune_winner(graph, ranked, storage, config)
    return AutotuneOutcome(ranked, winner.plan, winner.result, spec_path, None, confirmation)
