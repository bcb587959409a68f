"""Tune a library of graphs across the ranks of a torchrun job; rank 0 writes the override file.

Two ways to split the work:

* ``shard="graphs"`` (default): graphs are dealt round-robin, one per rank per round. After
  each round the ranks gather their reports and rank 0 appends the winners to the override file
  in the graphs' order, so the file grows as the job runs and ends identical (modulo timings)
  to a one-process run. The gathers run on a thread beside the tuning, so a rank goes on to its
  next graph instead of waiting for the round's slowest graph.
* ``shard="candidates"``: every rank takes the same graph and benchmarks its share of the
  candidates (a plan set of its own beside the graph's, ``PlanSet.for_specs``); rank 0 ranks
  the merged results as one ``autotune()`` call ranks its own (``rank_results``: by decision
  time, a tie to the lower rank, failures last), confirms the best against
  the heuristic plan on its own GPU (``tuning.confirm_plans``, the same confirmation as
  ``autotune()``: kept only if faster beyond noise, else the heuristic plan is the decision)
  and broadcasts the decision, and every rank builds exactly that plan (ranks never disagree
  on a winner). Timings from different GPUs are compared, so use it on identical GPUs.

Either way a graph's entry is written only after its confirmation (graph mode: inside each
rank's ``tune_graph``), and what rank 0's write did (written, or why not) is broadcast, so every
rank returns the same reports. The entry records the device of the rank that tuned the graph.

A rank whose graph fails reports the failure in its payload (candidate mode: also a rank that
cannot build the decided plan, and an exception in rank 0's confirmation); a rank that dies
makes the others fail at the next collective after ``timeout_s`` with a message naming the
round. One process joins one tuning job: call :func:`tune_library` once per process.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import dnntune as dt
from dnntune import reference
from dnntune.autotune.confirm import WINNER_IS_DEFAULT, Confirmation
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.ranking import by_decision_time, by_min_time, rank_results
from dnntune.autotune.session import run_autotune
from dnntune.autotune.variants import add_knob_variants, add_suggested_variants
from dnntune.backend.plan_choice import choose_plan
from dnntune.backend.plans import allocate_workspace
from dnntune.distributed.env import DistContext, init_distributed
from dnntune.distributed.payload import result_from_dict, result_to_dict
from dnntune.errors import AutotuneError, DnnTuneError
from dnntune.frontend import Graph
from dnntune.overrides.writer import write_autotune_winner
from dnntune.rfc import AutotuneConfig, AutotuneResult, AutotuneStorageConfig
from dnntune.workflows.tune_report import cost_of
from dnntune.workflows.tuning import (
    GraphTuneReport,
    TuneOptions,
    confirm_plans,
    heuristic_plan,
    tune_graph,
)

__all__ = ["DistributedTuneError", "LibraryReport", "tune_library"]

_log = logging.getLogger(__name__)

GraphSource = tuple[str, "Graph | Exception"]


class DistributedTuneError(DnnTuneError, RuntimeError):
    """A collective failed (a rank died or timed out); the message says where."""


@dataclass
class LibraryReport:
    """What the job did: one report per graph (in input order) and the ranks' agreement."""

    reports: list[GraphTuneReport] = field(default_factory=list)
    world_size: int = 1
    shard: str = "graphs"
    wall_time_s: float = 0.0
    #: candidate mode: per graph, the plan name each rank built (all equal when ranks agree;
    #: "" for a rank that built none: no winner, or its failure is the graph's ``error``)
    decisions: list[list[str]] = field(default_factory=list)

    @property
    def ranks_agree(self) -> bool:
        """No two ranks built different plans for a graph (a rank that built none is a
        failure of that graph, reported in its ``error``, not a disagreement)."""
        return all(len(set(names) - {""}) <= 1 for names in self.decisions)


def _report_to_payload(
    index: int, report: GraphTuneReport, device_name: str | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "graph_name": report.graph_name,
        "source": report.source,
        "graph_key": report.graph_key,
        "device": report.device,
        "results": [result_to_dict(r) for r in report.results],
        "heuristic_plan": report.heuristic_plan,
        "heuristic_error": report.heuristic_error,
        "heuristic_time_ms": report.heuristic_time_ms,
        "winner_retimed_ms": report.winner_retimed_ms,
        "tuning_time_ms": report.tuning_time_ms,
        "cost": dict(report.cost),
        "error": report.error,
        "confirmation": _confirmation_to_dict(report.confirmation),
        "write_winner": report.write_winner,
        #: the tuning rank's device, for the entry rank 0 writes (``autotune_metadata.device``)
        "device_name": device_name,
    }


def _confirmation_to_dict(c: Confirmation | None) -> dict[str, Any] | None:
    return None if c is None else c.to_dict()


def _confirmation_from_dict(data: dict[str, Any] | None) -> Confirmation | None:
    if data is None:
        return None
    known = {f.name for f in dataclasses.fields(Confirmation)}
    return Confirmation(**{k: v for k, v in data.items() if k in known})


def _report_from_payload(data: dict[str, Any]) -> GraphTuneReport:
    return GraphTuneReport(
        graph_name=data["graph_name"],
        source=data["source"],
        graph_key=data["graph_key"],
        device=data["device"],
        results=[result_from_dict(r) for r in data["results"]],
        heuristic_plan=data["heuristic_plan"],
        heuristic_error=data["heuristic_error"],
        heuristic_time_ms=data["heuristic_time_ms"],
        winner_retimed_ms=data["winner_retimed_ms"],
        tuning_time_ms=data["tuning_time_ms"],
        cost=dict(data.get("cost") or {}),
        error=data["error"],
        confirmation=_confirmation_from_dict(data.get("confirmation")),
        write_winner=data.get("write_winner", True),
    )


class _Writer:
    """Rank 0's override-file writer: clears the file once (overwrite), then appends."""

    def __init__(self, output: str | Path | None, overwrite: bool) -> None:
        self.output = output
        self.clear_pending = overwrite

    def write(
        self,
        graph: Graph,
        report: GraphTuneReport,
        options: TuneOptions,
        device_name: str | None = None,
    ) -> None:
        """Write ``report``'s winner for ``graph``; ``device_name``: the device of the rank
        that tuned it (default: the one ``graph`` was built for). A failure is the graph's
        ``error``, never an exception (the other ranks wait for rank 0's next collective)."""
        if self.output is None or not report.ok or not report.write_winner:
            return
        storage = AutotuneStorageConfig(str(self.output), self.clear_pending)
        try:
            if not graph.is_validated:
                graph.validate()
            write_autotune_winner(
                graph, report.results, storage, options.autotune_config(), device=device_name
            )
        except DnnTuneError as exc:
            report.error = f"writing {self.output}: {exc}"
            return
        except Exception as exc:  # a bug in one graph's write must not stop the job
            _log.debug("distributed: writing %s raised", report.graph_name, exc_info=True)
            report.error = f"writing {self.output}: internal error: {type(exc).__name__}: {exc}"
            return
        self.clear_pending = False
        report.written_to = str(self.output)


def _device_name(handle: Any) -> str | None:
    """The name of ``handle``'s device, as the writer records it (``autotune_metadata.device``)."""
    try:
        name = handle.device_signature().get("name")
    except Exception:  # no signature (a test's stand-in handle): nothing to record
        return None
    return str(name) if name else None


def _collective_failed(ctx: DistContext, where: str, exc: BaseException) -> DistributedTuneError:
    return DistributedTuneError(
        f"rank {ctx.rank}: collective after {where} failed ({type(exc).__name__}: {exc}); "
        f"another rank died or did not answer within {ctx.timeout_s:.0f} s: look for the first "
        "error in the other ranks' output, or give a slow rank a longer collective timeout"
    )


def _gather(ctx: DistContext, payload: Any, where: str) -> list[Any]:
    try:
        return ctx.all_gather(payload)
    except Exception as exc:  # gloo raises RuntimeError on timeouts and dead peers
        raise _collective_failed(ctx, where, exc) from None


def _broadcast(ctx: DistContext, payload: Any, where: str) -> Any:
    """Rank 0's ``payload`` on every rank (the others pass None)."""
    try:
        return ctx.broadcast(payload)
    except Exception as exc:  # gloo raises RuntimeError on timeouts and dead peers
        raise _collective_failed(ctx, where, exc) from None


def _failed_report(source: str, item: Graph | Exception, exc: BaseException) -> GraphTuneReport:
    name = item.name if isinstance(item, Graph) else Path(source).stem
    return GraphTuneReport(graph_name=name, source=source, error=f"{type(exc).__name__}: {exc}")


class _Exchange:
    """Graph mode's collectives, on a thread of their own: after each round the ranks gather
    their reports and rank 0 writes the winners in the graphs' order, while every rank's main
    thread already tunes its next graph. A rank never waits for a slower one between graphs,
    so the job takes as long as the busiest rank's share, not the sum of each round's slowest
    graph."""

    STOP = object()

    def __init__(
        self,
        sources: Sequence[GraphSource],
        ctx: DistContext,
        options: TuneOptions,
        writer: _Writer,
        on_report: Callable[[GraphTuneReport], None],
        out: LibraryReport,
    ) -> None:
        self.sources, self.ctx, self.options, self.writer = sources, ctx, options, writer
        self.on_report, self.out = on_report, out
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.failure: BaseException | None = None

    def run(self) -> None:
        n, world = len(self.sources), self.ctx.world_size
        try:
            for start in range(0, n, world):
                payload = self.outbox.get()
                if payload is self.STOP:
                    return
                where = f"graphs {start}..{min(start + world, n) - 1}"
                gathered = _gather(self.ctx, payload, where)
                taken = [
                    self._take(data)
                    for data in sorted((p for p in gathered if p is not None), key=_index)
                ]
                # rank 0's writes, on every rank: the same reports (and exit code) everywhere
                mine = [[r.written_to, r.error] for r in taken] if self.ctx.is_main else None
                outcomes = _broadcast(self.ctx, mine, f"writing {where}")
                for report, (written_to, error) in zip(taken, outcomes, strict=True):
                    report.written_to, report.error = written_to, error
                    self.out.reports.append(report)
                    self.on_report(report)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.failure = exc

    def _take(self, data: dict[str, Any]) -> GraphTuneReport:
        report = _report_from_payload(data)
        if self.ctx.is_main:
            item = self.sources[data["index"]][1]
            if isinstance(item, Graph):
                self.writer.write(item, report, self.options, data.get("device_name"))
        return report


def _index(payload: dict[str, Any]) -> int:
    return int(payload["index"])


def _tune_one(source: str, item: Graph | Exception, handle: Any, options: TuneOptions) -> Any:
    if isinstance(item, Exception):
        return _failed_report(source, item, item)
    try:
        return tune_graph(item, handle, options, output=None, source=source)
    except Exception as exc:  # a bug in one graph must not hang the other ranks
        _log.debug("distributed: %s raised", source, exc_info=True)
        return _failed_report(source, item, exc)


def _tune_graph_sharded(
    sources: Sequence[GraphSource],
    ctx: DistContext,
    handle: Any,
    options: TuneOptions,
    writer: _Writer,
    on_report: Callable[[GraphTuneReport], None],
) -> LibraryReport:
    out = LibraryReport(world_size=ctx.world_size, shard="graphs")
    device_name = _device_name(handle)
    exchange = _Exchange(sources, ctx, options, writer, on_report, out)
    thread = threading.Thread(target=exchange.run, name="dnntune-dist-exchange", daemon=True)
    thread.start()
    n, handed_all = len(sources), False
    try:
        for start in range(0, n, ctx.world_size):
            if exchange.failure is not None:
                break
            index = start + ctx.rank
            payload: dict[str, Any] | None = None
            if index < n:
                report = _tune_one(*sources[index], handle, options)
                payload = _report_to_payload(index, report, device_name)
            exchange.outbox.put(payload)
        handed_all = True
    finally:
        if not handed_all:
            exchange.outbox.put(_Exchange.STOP)
    thread.join()
    if exchange.failure is not None:
        raise exchange.failure
    return out


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


def _tune_candidate_sharded(
    sources: Sequence[GraphSource],
    ctx: DistContext,
    handle: Any,
    options: TuneOptions,
    writer: _Writer,
    on_report: Callable[[GraphTuneReport], None],
) -> LibraryReport:

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
        gathered = _gather(ctx, payload, f"the candidates of {what}")
        errors = [f"rank {r}: {p['error']}" for r, p in enumerate(gathered) if p["error"]]
        merged = _rank_merged(gathered, config)
        winner = merged[0] if merged and merged[0].succeeded else None
        decision = _Decision()
        if winner is not None:
            decision.plan = [winner.engine_id, [[s.knob_id, s.value] for s in winner.knob_settings]]
            if ctx.is_main and isinstance(item, Graph):
                decision = _decide(item, handle, options, config, decision.plan)
        decision = _Decision(
            **_broadcast(ctx, dataclasses.asdict(decision), f"the decision on {what}")
        )
        _apply_decision(report, decision)
        if report.confirmation is not None and report.confirmation.kept_default:
            assert decision.plan is not None
            merged, report.write_winner = _heuristic_first(merged, decision.plan)
        built = _build_decided(item, handle, decision.plan)
        outcomes = _gather(ctx, built, f"building the winner of {what}")
        names = [o["name"] for o in outcomes]
        out.decisions.append(names)
        report.results = merged
        report.cost = _merged_cost([p.get("cost") or {} for p in gathered], decision.confirm_ms)
        report.tuning_time_ms = (time.perf_counter_ns() - start_ns) / 1e6
        report.error = _candidate_error(winner, errors, decision, outcomes)
        if ctx.is_main and isinstance(item, Graph):
            writer.write(item, report, options)
        # rank 0's write and timing, on every rank: the same reports (and exit code) everywhere
        mine = None
        if ctx.is_main:
            mine = [report.written_to, report.error, report.tuning_time_ms, report.device]
        shared = _broadcast(ctx, mine, f"writing {what}")
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
    report.confirmation = _confirmation_from_dict(decision.confirmation)
    c = report.confirmation
    if c is not None and c.speedup is not None:
        report.heuristic_time_ms, report.winner_retimed_ms = c.default_ms, c.winner_ms


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


def tune_library(
    graphs: Sequence[GraphSource],
    output: str | Path | None = None,
    options: TuneOptions | None = None,
    *,
    overwrite: bool = False,
    shard: Literal["graphs", "candidates"] = "graphs",
    ctx: DistContext | None = None,
    device: str | None = None,
    timeout_s: float = 600.0,
    on_report: Callable[[GraphTuneReport], None] | None = None,
) -> LibraryReport:
    """Tune ``graphs`` (``(source, Graph or load error)`` pairs) on every rank of the job.

    Every rank calls this with the same graph list. Rank 0 alone writes ``output``, and what
    its writes did (``written_to``, a write's ``error``) is shared, so each rank returns the
    same LibraryReport (reports of every graph, in input order; only ``wall_time_s`` is the
    rank's own) and ``on_report`` sees the same reports on every rank. One process joins one
    tuning job: call this once per process.

    Raises:
        DistributedTuneError: a collective failed (a rank died or timed out).
    """

    own_ctx = ctx is None
    context = ctx or init_distributed(device, timeout_s)
    finished = False
    try:
        handle = dt.create_handle(context.device)
        opts = options or TuneOptions()
        writer = _Writer(output if context.is_main else None, overwrite)
        callback = on_report or (lambda report: None)
        start = time.perf_counter()
        if shard == "graphs":
            result = _tune_graph_sharded(graphs, context, handle, opts, writer, callback)
        elif shard == "candidates":
            result = _tune_candidate_sharded(graphs, context, handle, opts, writer, callback)
        else:
            raise ValueError(f"shard must be 'graphs' or 'candidates', got {shard!r}")
        result.wall_time_s = time.perf_counter() - start
        finished = True
        return result
    finally:
        if own_ctx:
            context.close(wait_for_peers=finished)
