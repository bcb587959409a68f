"""Which cuDNN plan a CUDNN_ENGINE build uses: explicit index, search, find-db record or heuristic.

Pure logic over a :class:`PlanSource` (cuDNN's plan list for one problem), a search function
and a find db, so it is tested on CPU with fakes:

- ``cudnn.engine_config = i >= 0``: the i-th plan of cuDNN's (deduplicated) list, nothing else;
- ``global.benchmarking = 1``: build every plan within the workspace limit, time them (the
  search function), keep the fastest (within 2%, the one cuDNN ranks higher) and append it to
  the find db;
- otherwise: the find-db record for this problem if there is one and it still builds within
  the limit ("hit", MIOpen's find-db behaviour), else cuDNN's heuristic order: the first plan
  that builds within the limit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord, parse_engine_tag

__all__ = ["PlanSource", "PlanTiming", "SearchFn", "Selection", "select_plan"]

_log = logging.getLogger(__name__)

#: plans whose median is within 2% of the fastest count as equally fast
TIE_RATIO = 1.02


class PlanSource(Protocol):
    """cuDNN's plans for one problem, in heuristic order."""

    @property
    def candidates(self) -> Sequence[int]:
        """cuDNN plan indices, one per distinct plan name, heuristic order first."""
        ...

    def build(self, index: int) -> int:
        """Build plan ``index`` (once); return its workspace bytes. Raises NotSupportedError."""
        ...

    def name_at(self, index: int) -> str:
        """cuDNN's engine tag of plan ``index``."""
        ...


@dataclass
class PlanTiming:
    """One plan's result in a search: median of its samples, or the error that stopped it."""

    index: int
    name: str
    workspace_bytes: int
    median_ms: float = math.inf
    samples_ms: list[float] = field(default_factory=list)
    error: str = ""
    #: the search round that produced ``median_ms`` (a final round re-times the best few)
    round: int = 1

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.median_ms)


#: times the given (plan index, workspace bytes) candidates; one PlanTiming each
SearchFn = Callable[[Sequence[tuple[int, int]]], list[PlanTiming]]


@dataclass
class Selection:
    """The chosen plan and how it was chosen (recorded in the plan's metadata)."""

    index: int
    workspace_bytes: int
    #: "engine_config" | "search" | "find_db" | "heuristic"
    how: str
    #: "not_used" | "written" | "write_failed" | "hit" | "miss" | "stale" | "disabled"
    find_db: str
    median_time_ms: float | None = None
    timings: list[PlanTiming] = field(default_factory=list)


def _limit_reason(name: str, ws: int, limit: int) -> str:
    return (
        f"cuDNN plan {name} needs a workspace of {ws} bytes, more than "
        f"global.workspace_size_limit={limit}"
    )


def _winner(ok: Sequence[PlanTiming]) -> PlanTiming:
    """The fastest plan of the last search round; within TIE_RATIO of it, the plan cuDNN's
    heuristics rank higher wins (a tie is noise, and cuDNN's order is the better tie-break)."""
    last = max(t.round for t in ok)
    pool = [t for t in ok if t.round == last]
    fastest = min(t.median_ms for t in pool)
    return next(t for t in pool if t.median_ms <= fastest * TIE_RATIO)


def _first_within(source: PlanSource, limit: int) -> tuple[int, int]:
    reasons: list[str] = []
    for index in source.candidates:
        try:
            ws = source.build(index)
        except NotSupportedError as exc:
            reasons.append(f"{source.name_at(index)}: {exc}")
            continue
        if ws <= limit:
            return index, ws
        reasons.append(_limit_reason(source.name_at(index), ws, limit))
    shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
    raise NotSupportedError(f"no cuDNN plan builds within the limits: {shown or 'no plans'}")


def _index_of(source: PlanSource, name: str) -> int | None:
    for index in source.candidates:
        if source.name_at(index) == name:
            return index
    return None


def select_plan(
    source: PlanSource,
    *,
    engine_config: int,
    benchmarking: bool,
    workspace_limit: int,
    db: FindDb | None,
    key: FindDbKey | None,
    search: SearchFn,
    build_ahead: Callable[[Sequence[int]], object] | None = None,
) -> Selection:
    """Choose a plan (see the module docstring). Raises NotSupportedError or InvalidValueError.

    ``build_ahead``: called with every candidate before a search builds them one by one (cuDNN
    builds them in worker processes there: :mod:`~dnntune.providers.cudnn.parallel_build`)."""
    candidates = list(source.candidates)
    if engine_config >= 0:
        if engine_config >= len(candidates):
            raise InvalidValueError(
                f"engine CUDNN_ENGINE: knob cudnn.engine_config: value {engine_config} is "
                f"invalid; cuDNN offers {len(candidates)} plan(s) for this graph "
                f"(0..{len(candidates) - 1}, or -1 for its heuristic choice)"
            )
        index = candidates[engine_config]
        ws = source.build(index)
        if ws > workspace_limit:
            raise NotSupportedError(_limit_reason(source.name_at(index), ws, workspace_limit))
        return Selection(index, ws, "engine_config", "not_used")

    if benchmarking:
        if build_ahead is not None:
            build_ahead(candidates)
        buildable: list[tuple[int, int]] = []
        for index in candidates:
            try:
                ws = source.build(index)
            except NotSupportedError:
                continue
            if ws <= workspace_limit:
                buildable.append((index, ws))
        if not buildable:
            _first_within(source, workspace_limit)  # raises with the reasons
        timings = search(buildable)
        ok = [t for t in timings if t.ok]
        if not ok:
            errors = "; ".join(f"{t.name}: {t.error}" for t in timings[:5])
            raise NotSupportedError(f"every cuDNN plan failed during the search: {errors}")
        best = _winner(ok)
        status = "disabled"
        if db is not None and key is not None:
            engine, knobs = parse_engine_tag(best.name)
            written = db.record(
                key,
                FindDbRecord(
                    plan_name=best.name,
                    plan_index=best.index,
                    workspace_bytes=best.workspace_bytes,
                    median_time_ms=best.median_ms,
                    cudnn_engine_id=engine,
                    cudnn_knobs=knobs,
                    plans_timed=len(ok),
                ),
            )
            status = "written" if written else "write_failed"
        return Selection(
            best.index, best.workspace_bytes, "search", status, best.median_ms, timings
        )

    status = "disabled"
    if db is not None and key is not None:
        record = db.lookup(key)
        status = "miss"
        if record is not None:
            found = _index_of(source, record.plan_name)
            if found is None:
                status = "stale"
                _log.info(
                    "cudnn find db: plan %s is no longer offered; using the heuristic",
                    record.plan_name,
                )
            else:
                try:
                    ws = source.build(found)
                except NotSupportedError as exc:
                    status = "stale"
                    _log.info("cudnn find db: plan %s no longer builds (%s)", record.plan_name, exc)
                else:
                    if ws <= workspace_limit:
                        return Selection(found, ws, "find_db", "hit", record.median_time_ms)
                    status = "stale"
    index, ws = _first_within(source, workspace_limit)
    return Selection(index, ws, "heuristic", status)
