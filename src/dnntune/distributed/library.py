"""Tune a library of graphs across the ranks of a torchrun job; rank 0 writes the override file.

Two ways to split the work:

* ``shard="graphs"`` (default): graphs are dealt round-robin, one per rank per round. After
  each round the ranks gather their reports and rank 0 appends the winners to the override file
  in the graphs' order, so the file grows as the job runs and ends identical (modulo timings)
  to a one-process run. The gathers run on a thread beside the tuning, so a rank goes on to its
  next graph instead of waiting for the round's slowest graph.
* ``shard="candidates"`` (``candidates.py``): every rank takes the same graph and benchmarks
  its share of the candidates; rank 0 ranks the merged results as one ``autotune()`` call
  ranks its own, confirms the best against the heuristic plan on its own GPU and broadcasts
  the decision, and every rank builds exactly that plan (ranks never disagree on a winner).
  Timings from different GPUs are compared, so use it on identical GPUs.

Either way a graph's entry is written only after its confirmation (graph mode: inside each
rank's ``tune_graph``), and what rank 0's write did (written, or why not) is broadcast, so every
rank returns the same reports. The entry records the device of the rank that tuned the graph.

A rank whose graph fails reports the failure in its payload (candidate mode: also a rank that
cannot build the decided plan, and an exception in rank 0's confirmation); a rank that dies
makes the others fail at the next collective after ``timeout_s`` with a message naming the
round. One process joins one tuning job: call :func:`tune_library` once per process.

Beside this module: ``collectives.py`` (gather, broadcast, DistributedTuneError),
``payload.py`` (reports as plain data), ``writer.py`` (rank 0's override-file writer) and
``report.py`` (LibraryReport).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import dnntune as dt
from dnntune.distributed.candidates import tune_candidate_sharded
from dnntune.distributed.collectives import DistributedTuneError, broadcast, gather
from dnntune.distributed.env import DistContext, init_distributed
from dnntune.distributed.payload import report_from_payload, report_to_payload
from dnntune.distributed.report import GraphSource, LibraryReport
from dnntune.distributed.writer import Writer
from dnntune.errors import InvalidValueError
from dnntune.frontend import Graph
from dnntune.graph.json_writer import graph_to_dict
from dnntune.workflows.tuning import GraphTuneReport, TuneOptions, tune_graph

__all__ = ["DistributedTuneError", "LibraryReport", "tune_library"]

_log = logging.getLogger(__name__)


def _device_name(handle: Any) -> str | None:
    """The name of ``handle``'s device, as the writer records it (``autotune_metadata.device``)."""
    try:
        name = handle.device_signature().get("name")
    except Exception:  # no signature (a test's stand-in handle): nothing to record
        return None
    return str(name) if name else None


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
        writer: Writer,
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
                gathered = gather(self.ctx, payload, where)
                taken = [
                    self._take(data)
                    for data in sorted((p for p in gathered if p is not None), key=_index)
                ]
                # rank 0's writes, on every rank: the same reports (and exit code) everywhere
                mine = [[r.written_to, r.error] for r in taken] if self.ctx.is_main else None
                outcomes = broadcast(self.ctx, mine, f"writing {where}")
                for report, (written_to, error) in zip(taken, outcomes, strict=True):
                    report.written_to, report.error = written_to, error
                    self.out.reports.append(report)
                    self.on_report(report)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.failure = exc

    def _take(self, data: dict[str, Any]) -> GraphTuneReport:
        report = report_from_payload(data)
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
    writer: Writer,
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
                payload = report_to_payload(index, report, device_name)
            exchange.outbox.put(payload)
        handed_all = True
    finally:
        if not handed_all:
            exchange.outbox.put(_Exchange.STOP)
    thread.join()
    if exchange.failure is not None:
        raise exchange.failure
    return out


def _fingerprint(item: Graph | Exception) -> str:
    """What a graph computes (a hash of its JSON document; a load error: "error")."""
    if isinstance(item, Exception):
        return "error"
    text = json.dumps(graph_to_dict(item), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _options_digest(options: TuneOptions) -> dict[str, str]:
    """Every tuning option as text, to compare between ranks (a sequence by its items)."""
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        out[f.name] = repr(list(value) if isinstance(value, list | tuple) else value)
    return out


def _check_same_job(
    graphs: Sequence[GraphSource], shard: str, options: TuneOptions, ctx: DistContext
) -> None:
    """Every rank must run the same job: the same split (``shard``), the same tuning options
    (they decide each graph's candidates, which candidate mode deals out by position) and the
    same graphs in the same order (rounds and candidates are matched by position). Otherwise
    every rank raises the same error, before any tuning."""
    if ctx.world_size == 1:
        return
    mine = {
        "shard": shard,
        "options": _options_digest(options),
        "graphs": [_fingerprint(item) for _, item in graphs],
    }
    jobs = gather(ctx, mine, "checking the graph lists")
    for rank, other in enumerate(jobs):
        if other["shard"] != jobs[0]["shard"]:
            raise InvalidValueError(
                "distributed tune: the ranks were given different ways to split the work: "
                f"shard {jobs[0]['shard']!r} on rank 0, {other['shard']!r} on rank {rank}; "
                "give every rank the same command (the same --shard)"
            )
        changed = [k for k, v in jobs[0]["options"].items() if other["options"].get(k) != v]
        if changed:
            name = changed[0]
            raise InvalidValueError(
                "distributed tune: the ranks were given different tuning options: "
                f"{name} is {jobs[0]['options'][name]} on rank 0, "
                f"{other['options'].get(name)} on rank {rank}; give every rank the same "
                "command (the same tune options)"
            )
    lists = [job["graphs"] for job in jobs]
    names = [source for source, _ in graphs]
    for rank, other in enumerate(lists):
        if other == lists[0]:
            continue
        if len(other) != len(lists[0]):
            what = f"rank 0 has {len(lists[0])} graph(s), rank {rank} {len(other)}"
        else:
            i = next(i for i, (a, b) in enumerate(zip(lists[0], other, strict=True)) if a != b)
            what = f"graph {i + 1} differs between rank 0 and rank {rank}"
            if ctx.rank in (0, rank):
                what += f" (here: {names[i]})"
        raise InvalidValueError(
            f"distributed tune: the ranks were given different graphs: {what}; give every rank "
            "the same graph files in the same order"
        )


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

    Every rank calls this with the same graph list, ``options`` and ``shard`` (checked before
    any tuning). Rank 0 alone writes ``output``, and what its writes did (``written_to``, a
    write's ``error``) is shared, so each rank returns the same LibraryReport (reports of
    every graph, in input order; only ``wall_time_s`` is the rank's own) and ``on_report``
    sees the same reports on every rank. One process joins one tuning job: call this once
    per process.

    Raises:
        InvalidValueError: on every rank, when the ranks were given other graphs, options or
            ``shard`` (nothing is tuned or written).
        DistributedTuneError: a collective failed (a rank died or timed out).
    """

    own_ctx = ctx is None
    context = ctx or init_distributed(device, timeout_s)
    finished = False
    try:
        handle = dt.create_handle(context.device)
        opts = options or TuneOptions()
        writer = Writer(output if context.is_main else None, overwrite)
        callback = on_report or (lambda report: None)
        start = time.perf_counter()
        _check_same_job(graphs, shard, opts, context)
        if shard == "graphs":
            result = _tune_graph_sharded(graphs, context, handle, opts, writer, callback)
        elif shard == "candidates":
            result = tune_candidate_sharded(graphs, context, handle, opts, writer, callback)
        else:
            raise ValueError(f"shard must be 'graphs' or 'candidates', got {shard!r}")
        result.wall_time_s = time.perf_counter() - start
        finished = True
        return result
    finally:
        if own_ctx:
            context.close(wait_for_peers=finished)
