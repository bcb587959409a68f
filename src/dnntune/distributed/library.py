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
rank's ``tune_graph``).

A rank whose graph fails reports the failure in its payload; a rank that dies makes the others
fail at the next collective after ``timeout_s`` with a message naming the round.
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
    #: candidate mode: per graph, the plan name each rank built (all equal when ranks agree)
    decisions: list[list[str]] = field(default_factory=list)

    @property
    def ranks_agree(self) -> bool:
        return all(len(set(names)) <= 1 for names in self.decisions)


def _report_to_payload(index: int, report: GraphTuneReport) -> dict[str, Any]:
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
        "error": report.error,
        "confirmation": _confirmation_to_dict(report.confirmation),
        "write_winner": report.write_winner,
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
        error=data["error"],
        confirmation=_confirmation_from_dict(data.get("confirmation")),
        write_winner=data.get("write_winner", True),
    )


class _Writer:
    """Rank 0's override-file writer: clears the file once (overwrite), then appends."""

    def __init__(self, output: str | Path | None, overwrite: bool) -> None:
        self.output = output
        self.clear_pending = overwrite

    def write(self, graph: Graph, report: GraphTuneReport, options: TuneOptions) -> None:
        if self.output is None or not report.ok or not report.write_winner:
            return

        if not graph.is_validated:
            graph.validate()
        storage = AutotuneStorageConfig(str(self.output), self.clear_pending)
        try:
            write_autotune_winner(graph, report.results, storage, options.autotune_config())
        except DnnTuneError as exc:
            report.error = f"writing {self.output}: {exc}"
            return
        self.clear_pending = False
        report.written_to = str(self.output)


def _gather(ctx: DistContext, payload: Any, where: str) -> list[Any]:
    try:
        return ctx.all_gather(payload)
    except Exception as exc:  # gloo raises RuntimeError on timeouts and dead peers
        raise DistributedTuneError(
            f"rank {ctx.rank}: collective after {where} failed ({type(exc).__name__}: {exc}); "
            f"another rank died or did not answer within {ctx.timeout_s:.0f} s"
        ) from None


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
                for data in sorted((p for p in gathered if p is not None), key=_index):
                    self._take(data)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.failure = exc

    def _take(self, data: dict[str, Any]) -> None:
        report = _report_from_payload(data)
        if self.ctx.is_main:
            item = self.sources[data["index"]][1]
            if isinstance(item, Graph):
                self.writer.write(item, report, self.options)
        self.out.reports.append(report)
        self.on_report(report)


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
                payload = _report_to_payload(index, report)
            exchange.outbox.put(payload)
        handed_all = True
    finally:
        if not handed_all:
            exchange.outbox.put(_Exchange.STOP)
    thread.join()
    if exchange.failure is not None:
        raise exchange.failure
    return out


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
        payload: dict[str, Any] = {"results": [], "error": ""}
        start_ns = time.perf_counter_ns()
        try:
            if isinstance(item, Exception):
                raise item
            report.graph_name = item.name
            item.build_operation_graph(handle)
            report.graph_key = item.key()
            results = _tune_share(item, handle, options, shard_config, ctx)
            payload["results"] = [result_to_dict(r) for r in results]
        except Exception as exc:  # reported per graph; the collective below still runs
            payload["error"] = f"{type(exc).__name__}: {exc}"
        gathered = _gather(ctx, payload, f"candidates of graph {index} ({source})")
        errors = [f"rank {r}: {p['error']}" for r, p in enumerate(gathered) if p["error"]]
        merged = _rank_merged(gathered, config)
        winner = merged[0] if merged and merged[0].succeeded else None
        chosen: list[Any] | None = None
        conf: Confirmation | None = None
        if winner is not None:
            chosen = [winner.engine_id, [[s.knob_id, s.value] for s in winner.knob_settings]]
            if ctx.is_main and isinstance(item, Graph):
                chosen, conf = _confirm_merged(item, handle, options, config, chosen)
        decision, conf_data = ctx.broadcast([chosen, _confirmation_to_dict(conf)])
        report.confirmation = _confirmation_from_dict(conf_data)
        if report.confirmation is not None and report.confirmation.kept_default:
            merged, report.write_winner = _heuristic_first(merged, decision)
        built = ""
        if decision is not None and not isinstance(item, Exception):
            try:
                built = choose_plan(item, handle, engine=decision[0], knobs=dict(decision[1])).name
            except DnnTuneError as exc:
                built = f"<failed: {exc}>"
        names = _gather(ctx, built, f"building the winner of graph {index}")
        out.decisions.append([n for n in names])
        report.results = merged
        report.tuning_time_ms = (time.perf_counter_ns() - start_ns) / 1e6
        report.error = (
            "; ".join(errors)
            if winner is None and errors
            else ("" if winner is not None else "no candidate succeeded")
        )
        if len(set(names)) > 1:
            report.error = f"ranks built different plans: {names}"
        if ctx.is_main and isinstance(item, Graph):
            writer.write(item, report, options)
        out.reports.append(report)
        on_report(report)
    return out


def _tune_share(
    graph: Graph, handle: Any, options: TuneOptions, config: AutotuneConfig, ctx: DistContext
) -> list[AutotuneResult]:
    """This rank's share of ``graph``'s candidates, autotuned: every ``world_size``-th of the
    candidates an undistributed tune has (the graph's own plan set holds them all afterwards,
    as after ``tune_graph``), in a plan set of its own beside the graph's."""
    graph.add_all_engines()
    add_suggested_variants(graph)  # the same candidates as an undistributed tune
    if options.sweep_knobs:
        add_knob_variants(graph)
    mine = graph.plan_specs[ctx.rank :: ctx.world_size]
    if not mine:
        return []
    share = PlanSet.for_specs(graph, handle, mine)
    assert share.specs is not None
    pack = reference.make_inputs(
        graph, handle.device, seed=options.seed, max_bytes=options.max_input_bytes
    )
    ws = share.specs.estimated_max_workspace_size()
    workspace = allocate_workspace(ws, handle.device)
    try:
        return run_autotune(graph, share, handle, pack, workspace, ws, config).results
    except AutotuneError as exc:
        return list(exc.results)


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
) -> tuple[list[Any], Confirmation | None]:
    """Rank 0: confirm the merged winner against the heuristic plan; the decision to broadcast
    (the heuristic plan's engine and knobs when it is kept) and the confirmation."""

    try:
        heuristic = heuristic_plan(item, handle, options.heuristic_mode)
        tuned = choose_plan(item, handle, engine=chosen[0], knobs=dict(chosen[1]))
        if tuned.name == heuristic.name:
            name = heuristic.name
            return chosen, Confirmation(WINNER_IS_DEFAULT, name, name, speedup=1.0)
        pack = reference.make_inputs(
            item, handle.device, seed=options.seed, max_bytes=options.max_input_bytes
        )
        conf = confirm_plans(tuned, heuristic, handle, pack, config)
    except DnnTuneError as exc:
        _log.info("distributed: %s: no confirmation against the heuristic plan: %s", item.name, exc)
        return chosen, None
    if not conf.kept_default:
        return chosen, conf
    plan = heuristic.plan
    return [plan.engine.id, [[s.knob_id, s.value] for s in plan.knob_settings]], conf


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

    Every rank calls this with the same graph list. Rank 0 alone writes ``output``. Each rank
    returns the same LibraryReport (reports of every graph, in input order).

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
