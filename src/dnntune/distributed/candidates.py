"""Candidate mode (``shard="candidates"``): every rank takes the same graph and benchmarks its
share of the candidates; rank 0 decides, and every rank builds exactly the decided plan.

Each rank tunes its share in a plan set of its own beside the graph's (``PlanSet.for_specs``);
rank 0 ranks the merged results as one ``autotune()`` call ranks its own (``rank_results``: by
decision time, a tie to the lower rank, failures last), confirms the best against the
heuristic plan on its own GPU (``tuning.confirm_plans``, the same confirmation as
``autotune()``: kept only if faster beyond noise, else the heuristic plan is the decision) and
broadcasts the decision, and every rank builds exactly that plan (ranks never disagree on a
winner). Timings from different GPUs are compared, so use it on identical GPUs.

A rank whose share fails, a rank that cannot build the decided plan, and an exception in rank
0's confirmation fail that graph only (its ``error``); the job goes on with the next graph.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnntune import reference
from dnntune.autotune.confirm import Confirmation
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.ranking import by_decision_time, by_min_time, rank_results
from dnntune.autotune.session import run_autotune
from dnntune.autotune.variants import add_knob_variants, add_suggested_variants
from dnntune.autotune.verdicts import WINNER_IS_DEFAULT
from dnntune.backend.plan_choice import choose_plan
from dnntune.backend.plans import allocate_workspace
from dnntune.distributed.collectives import broadcast, gather
from dnntune.distributed.env import DistContext
from dnntune.distributed.payload import confirmation_from_dict, result_from_dict, result_to_dict
from dnntune.distributed.report import GraphSource, LibraryReport
from dnntune.distributed.writer import Writer
from dnntune.errors import AutotuneError, DnnTuneError
from dnntune.frontend import Graph
from dnntune.rfc import AutotuneConfig, AutotuneResult
from dnntune.workflows.tune_report import cost_of
from dnntune.workflows.tuning import (
    GraphTuneReport,
    TuneOptions,
    confirm_config,
    confirm_plans,
    heuristic_plan,
)

__all__ = ["tune_candidate_sharded"]

_log = logging.getLogger(__name__)


@dataclass
class _Decision:
    """Rank 0's word on one graph in candidate mode, broadcast to every rank (plain data)."""

    #: ``[engine id, [[knob id, value], ...]]`` every rank builds; None: no plan (no winner,
    #: or ``error``)
    plan: list[Any] | None = None
    #: the confirmation against the heuristic plan (``Confirmation.to_dict``); None: none
    confirmation: dict[str, Any] | None = None
    heuristic_plan: str = ""
    heuristic_error: str = ""
    #: rank 0 could not decide (its confirmation raised): the graph failed
    error: str = ""
    #: rank 0's confirmation wall time (the report's ``cost["confirm_ms"]``)
    confirm_ms: float = 0.0


def tune_candidate_sharded(
    sources: Sequence[GraphSource],
    ctx: DistContext,
    handle: Any,
    options: TuneOptions,
    writer: Writer,
    on_report: Callable[[GraphTuneReport], None],
) -> LibraryReport:
    """Tune ``sources`` one graph at a time, each rank its share of the graph's candidates;
    rank 0 decides and writes (``writer``), and every rank returns the same reports.

    Raises:
        DistributedTuneError: a collective failed (a rank died or timed out).
    """
    out = LibraryReport(world_size=ctx.world_size, shard="candidates")
    config = options.autotune_config()
    # a rank's share has no heuristic plan of its own: rank 0 confirms the merged winner
    shard_config = dataclasses.replace(config, baseline=None)
    for index, (source, item) in enumerate(sources):
        report = GraphTuneReport(
            graph_name=Path(source).stem, source=source, device=str(handle.device)
        )
        payload: dict[str, Any] = {"results": [], "error": "", "cost": {}}
        start_ns = time.perf_counter_ns()
        try:
            if isinstance(item, Exception):
                raise item
            report.graph_name = item.name
            item.build_operation_graph(handle)
            report.graph_key = item.key()
            results, payload["cost"] = _tune_share(item, handle, options, shard_config, ctx)
            payload["results"] = [result_to_dict(r) for r in results]
        except Exception as exc:  # reported per graph; the collective below still runs
            payload["error"] = f"{type(exc).__name__}: {exc}"
        what = f"graph {index} ({source})"
        gathered = gather(ctx, payload, f"the candidates of {what}")
        errors = [f"rank {r}: {p['error']}" for r, p in enumerate(gathered) if p["error"]]
        merged = _rank_merged(gathered, config)
        winner = merged[0] if merged and merged[0].succeeded else None
        decision = _Decision()
        if winner is not None:
            decision.plan = [winner.engine_id, [[s.knob_id, s.value] for s in winner.knob_settings]]
            if ctx.is_main and isinstance(item, Graph):
                # the confirmation keeps to what the ranks left of the budget, as tune's
                used = max(float((p.get("cost") or {}).get("budget_used_s") or 0) for p in gathered)
                bounded = confirm_config(config, used)
                decision = _decide(item, handle, options, bounded, decision.plan)
        decision = _Decision(
            **broadcast(ctx, dataclasses.asdict(decision), f"the decision on {what}")
        )
        _apply_decision(report, decision)
        if report.confirmation is not None and report.confirmation.kept_default:
            assert decision.plan is not None
            merged, report.write_winner = _heuristic_first(merged, decision.plan)
        built = _build_decided(item, handle, decision.plan)
        outcomes = gather(ctx, built, f"building the winner of {what}")
        names = [o["name"] for o in outcomes]
        out.decisions.append(names)
        report.results = merged
        report.take_confirmed_times()
        report.cost = _merged_cost([p.get("cost") or {} for p in gathered], decision.confirm_ms)
        report.tuning_time_ms = (time.perf_counter_ns() - start_ns) / 1e6
        report.error = _candidate_error(winner, errors, decision, outcomes)
        if ctx.is_main and isinstance(item, Graph):
            writer.write(item, report, options)
        # rank 0's write and timing, on every rank: the same reports (and exit code) everywhere
        mine = None
        if ctx.is_main:
            mine = [report.written_to, report.error, report.tuning_time_ms, report.device]
        shared = broadcast(ctx, mine, f"writing {what}")
        report.written_to, report.error, report.tuning_time_ms, report.device = shared
        out.reports.append(report)
        on_report(report)
    return out


def _decide(
    item: Graph, handle: Any, options: TuneOptions, config: AutotuneConfig, plan: list[Any]
) -> _Decision:
    """Rank 0: the confirmed decision on the merged winner ``plan``; an exception in the
    confirmation fails this graph only (reported), and the job goes on."""
    start_ns = time.perf_counter_ns()
    try:
        decision = _confirm_merged(item, handle, options, config, plan)
    except Exception as exc:  # one graph's confirmation must not stop the job
        _log.debug("distributed: confirming %s raised", item.name, exc_info=True)
        decision = _Decision(
            error=f"rank 0: confirming the winner against the heuristic plan failed: "
            f"{type(exc).__name__}: {exc}"
        )
    decision.confirm_ms = (time.perf_counter_ns() - start_ns) / 1e6
    return decision


def _apply_decision(report: GraphTuneReport, decision: _Decision) -> None:
    """The heuristic plan and the confirmation, as ``tune_graph`` reports them."""
    report.heuristic_plan, report.heuristic_error = (
        decision.heuristic_plan,
        decision.heuristic_error,
    )
    report.confirmation = confirmation_from_dict(decision.confirmation)


def _build_decided(item: Graph | Exception, handle: Any, plan: list[Any] | None) -> dict[str, str]:
    """This rank builds the decided plan: ``{"name": plan name or "", "error": why not}``."""
    if plan is None or isinstance(item, Exception):
        return {"name": "", "error": ""}
    try:
        return {"name": choose_plan(item, handle, engine=plan[0], knobs=dict(plan[1])).name}
    except DnnTuneError as exc:
        return {"name": "", "error": str(exc)}
    except Exception as exc:  # reported for this graph; the other ranks wait for this one
        _log.debug("distributed: building the winner of %s raised", item.name, exc_info=True)
        return {"name": "", "error": f"{type(exc).__name__}: {exc}"}


def _candidate_error(
    winner: AutotuneResult | None,
    errors: list[str],
    decision: _Decision,
    outcomes: Sequence[dict[str, str]],
) -> str:
    """Why a graph failed in candidate mode ("" if it did not)."""
    if decision.error:
        return decision.error
    if winner is None:
        return "; ".join(errors) or "no candidate succeeded"
    failed = [(r, o["error"]) for r, o in enumerate(outcomes) if o.get("error")]
    if failed:
        plan = next((o["name"] for o in outcomes if o["name"]), "")
        what = f"the decided plan {plan}" if plan else "the decided plan"
        why = "; ".join(f"could not build {what} on rank {r}: {e}" for r, e in failed)
        return f"{why} (not written: check that rank's device and engines)"
    names = {o["name"] for o in outcomes}
    if len(names) > 1:
        return f"ranks built different plans: {[o['name'] for o in outcomes]}"
    return ""


#: cost fields summed over the ranks' shares (``cost_of``)
_SUMMED_COST = (
    "compile_ms",
    "priming_ms",
    "timing_ms",
    "recheck_ms",
    "confirm_ms",
    "total_ms",
    "skipped_budget",
    "abandoned",
)


def _merged_cost(costs: Sequence[dict[str, Any]], confirm_ms: float) -> dict[str, Any]:
    """One graph's cost over the ranks: their shares' times and counts summed, rank 0's
    confirmation added, and the budget as each rank had it (the most any rank used)."""
    costs = [c for c in costs if c]
    if not costs:
        return {}
    out: dict[str, Any] = {k: sum(c.get(k) or 0 for c in costs) for k in _SUMMED_COST}
    out["confirm_ms"] += confirm_ms
    budgeted = [c for c in costs if c.get("time_budget_s") is not None]
    out["time_budget_s"] = budgeted[0]["time_budget_s"] if budgeted else None
    out["budget_used_s"] = (
        max(c.get("budget_used_s") or 0.0 for c in budgeted) if budgeted else None
    )
    return out


def _tune_share(
    graph: Graph, handle: Any, options: TuneOptions, config: AutotuneConfig, ctx: DistContext
) -> tuple[list[AutotuneResult], dict[str, Any]]:
    """This rank's share of ``graph``'s candidates, autotuned: every ``world_size``-th of the
    candidates an undistributed tune has (the graph's own plan set holds them all afterwards,
    as after ``tune_graph``), in a plan set of its own beside the graph's; and its cost."""
    graph.add_all_engines()
    add_suggested_variants(graph)  # the same candidates as an undistributed tune
    if options.sweep_knobs:
        add_knob_variants(graph)
    mine = graph.plan_specs[ctx.rank :: ctx.world_size]
    if not mine:
        return [], {}
    share = PlanSet.for_specs(graph, handle, mine)
    assert share.specs is not None
    pack = reference.make_inputs(
        graph, handle.device, seed=options.seed, max_bytes=options.max_input_bytes
    )
    ws = share.specs.estimated_max_workspace_size()
    workspace = allocate_workspace(ws, handle.device)
    try:
        results = run_autotune(graph, share, handle, pack, workspace, ws, config).results
    except AutotuneError as exc:
        results = list(exc.results)
    return results, cost_of(share.summary)


def _rank_merged(
    gathered: Sequence[dict[str, Any]], config: AutotuneConfig
) -> list[AutotuneResult]:
    """Every rank's results (in rank order) ranked as one ``autotune()`` call with ``config``
    ranks its own: ``rank_results`` by decision time (``min_time_ms`` with
    ``ranking_statistic="min"``) or the config's ``ranking_fn``; stable, so a tie goes to the
    lower rank's result; failures last with rank -1."""
    key = by_min_time if config.ranking_statistic == "min" else by_decision_time
    results = [result_from_dict(d) for p in gathered for d in p["results"]]
    return rank_results(results, config.ranking_fn, key)


def _confirm_merged(
    item: Graph,
    handle: Any,
    options: TuneOptions,
    config: AutotuneConfig,
    chosen: list[Any],
) -> _Decision:
    """Rank 0: confirm the merged winner against the heuristic plan, as ``tune_graph`` does;
    the decision to broadcast (the heuristic plan's engine and knobs when it is kept)."""

    decision = _Decision(plan=chosen)
    try:
        heuristic = heuristic_plan(item, handle, options.heuristic_mode)
    except DnnTuneError as exc:
        decision.heuristic_error = str(exc)
        _log.info("distributed: %s: no heuristic plan to compare with: %s", item.name, exc)
        return decision
    decision.heuristic_plan = heuristic.name
    try:
        tuned = choose_plan(item, handle, engine=chosen[0], knobs=dict(chosen[1]))
        if tuned.name == heuristic.name:  # as the session says it (no speedup measured)
            name = heuristic.name
            decision.confirmation = Confirmation(WINNER_IS_DEFAULT, name, name).to_dict()
            return decision
        pack = reference.make_inputs(
            item, handle.device, seed=options.seed, max_bytes=options.max_input_bytes
        )
        conf = confirm_plans(tuned, heuristic, handle, pack, config)
    except DnnTuneError as exc:
        decision.heuristic_error = f"confirmation failed: {exc}"
        _log.info("distributed: %s: no confirmation against the heuristic plan: %s", item.name, exc)
        return decision
    decision.confirmation = conf.to_dict()
    if conf.kept_default:
        plan = heuristic.plan
        decision.plan = [plan.engine.id, [[s.knob_id, s.value] for s in plan.knob_settings]]
    return decision


def _heuristic_first(
    merged: list[AutotuneResult], decision: list[Any]
) -> tuple[list[AutotuneResult], bool]:
    """Put the kept heuristic plan's result first; (results, whether it can be written)."""
    engine, knobs = decision[0], sorted((k, str(v)) for k, v in decision[1])
    for r in merged:
        mine = sorted((s.knob_id, str(s.value)) for s in r.knob_settings)
        if r.succeeded and r.engine_id == engine and mine == knobs:
            return _put_first(r, merged), True
    return merged, False


def _put_first(first: AutotuneResult, merged: list[AutotuneResult]) -> list[AutotuneResult]:
    ok = [first, *(r for r in merged if r.succeeded and r is not first)]
    for rank, r in enumerate(ok):
        r.rank = rank
    return ok + [r for r in merged if not r.succeeded]
