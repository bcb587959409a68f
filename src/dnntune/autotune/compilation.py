"""Compiling plan specs inside autotune() and the post-compile workspace checks.

Compilation is where the plan-spec path meets the providers: an unknown id, an engine that
does not support the graph, or a provider error each fail only that candidate ("failed
compile"); a compiled object that is not a usable plan fails it at "finalize". Compiled plans
then face the deselect workspace threshold and the call's workspace ceiling.

Each compile goes through the session's :class:`Watchdog`: with ``candidate_timeout_s`` set, a
compile that does not return in time fails its candidate ("timed out") and the next one is
compiled. A compile that runs out of memory fails its candidate ("out of memory") and the
memory is released before the next.

Plans built before the call (``PlanSet.prebuilt``: a bench row's heuristic plan, on the same
graph and handle) are not built again: a candidate whose engine and resolved knob values equal
one's takes that plan as it is (:func:`take_prebuilt`). Only for candidates compiled before any
priming: a primed build reads the engine's search record and is another plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dnntune.autotune.candidates import (
    BARRED,
    EXCEEDS_LIMIT,
    FAILED_COMPILE,
    FAILED_FINALIZE,
    Candidate,
)
from dnntune.autotune.failures import (
    ERROR,
    OOM,
    TIMEOUT,
    UNSUPPORTED,
    CandidateTimeout,
    describe_failure,
    failure_kind,
    is_out_of_memory,
    release_memory,
)
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.engine import Engine, Plan, engine_id_hex
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.errors import InvalidValueError

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = [
    "CompileError",
    "apply_workspace_ceiling",
    "compile_candidates",
    "compile_plan",
    "take_prebuilt",
    "unsupported_here",
]

_log = logging.getLogger(__name__)


class CompileError(Exception):
    """Why a plan could not be built; ``stage`` is FAILED_COMPILE or FAILED_FINALIZE and
    ``kind`` a ``failures`` kind ("error", "timeout", "oom")."""

    def __init__(self, stage: str, message: str, kind: str = ERROR) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.kind = kind


def compile_plan(
    engine: Engine | None,
    engine_id: int,
    settings: Sequence[KnobSetting],
    graph: OpGraph,
    handle: Handle,
) -> Plan:
    """Build one plan; every failure becomes a CompileError naming the stage."""
    if engine is None:
        raise CompileError(
            FAILED_COMPILE,
            f"unknown engine id {engine_id} ({engine_id_hex(engine_id)}); it is not "
            "registered (take ids from get_engine_configs())",
        )
    why = get_registry().why_not(engine, graph, handle)
    if why is not None:
        raise CompileError(
            FAILED_COMPILE, f"engine {engine.name} does not support the graph: {why}", UNSUPPORTED
        )
    try:
        plan = engine.compile(graph, settings, handle)
    except Exception as exc:  # a provider error fails this candidate, never the session
        if is_out_of_memory(exc):  # no chained cause: its frames would pin the memory
            raise CompileError(FAILED_COMPILE, describe_failure(exc), OOM) from None
        # a knob value the graph rules out (say, a plan index past cuDNN's list) means the
        # variant does not apply here, like a NotSupportedError: an expected sweep outcome
        kind = UNSUPPORTED if isinstance(exc, InvalidValueError) else failure_kind(exc)
        raise CompileError(FAILED_COMPILE, describe_failure(exc), kind) from exc
    if not isinstance(plan, Plan):
        raise CompileError(FAILED_FINALIZE, f"engine {engine.name} returned {plan!r}, not a Plan")
    if isinstance(plan.workspace_size, bool) or plan.workspace_size < 0:
        raise CompileError(
            FAILED_FINALIZE, f"plan {plan.name} reports a bad workspace size {plan.workspace_size}"
        )
    return plan


def guarded_compile(
    c: Candidate,
    graph: OpGraph,
    handle: Handle,
    watchdog: Watchdog | None,
    settings: Sequence[KnobSetting] | None = None,
    what: str = "compile",
) -> Plan:
    """compile_plan for candidate ``c`` through ``watchdog``; a timeout is a CompileError."""
    knobs = c.knob_settings if settings is None else settings

    def build() -> Plan:
        return compile_plan(c.engine, c.engine_id, knobs, graph, handle)

    if watchdog is None:
        return build()
    try:
        return watchdog.call(build, f"{what} of {c.name}")
    except CandidateTimeout as exc:
        raise CompileError(FAILED_COMPILE, str(exc), TIMEOUT) from None


def record_compile_failure(c: Candidate, exc: CompileError) -> None:
    """Take ``c`` out with the compile stage's disposition ("Plan failed compile: ...")."""
    c.exclude(exc.stage, f"Plan {exc.stage}: {exc.message}", by_caller=False, workspace_size=-1)
    c.result.failure_kind = exc.kind
    # a variant the engine cannot run here is an expected outcome: a result, shown with -v
    level = logging.INFO if exc.kind == UNSUPPORTED else logging.WARNING
    _log.log(level, "autotune: %s: %s: %s", c.name, exc.stage, exc.message)


def unsupported_here(c: Candidate, graph: OpGraph, handle: Handle) -> bool:
    """Record ``c`` as its compile would (unsupported) and return True where its engine knows
    without a build that this device cannot run its settings (:meth:`Engine.settings_unsupported`:
    a CUDA graph on the CPU). Under a time budget candidates are built one at a time, and such
    a candidate reached after the budget was spent had been counted as skipped for the budget,
    one a larger budget would try (new-user audit, session 56)."""
    why = (
        None if c.engine is None else c.engine.settings_unsupported(graph, c.knob_settings, handle)
    )
    if why is None:
        return False
    record_compile_failure(
        c, CompileError(FAILED_COMPILE, f"NotSupportedError: {why}", UNSUPPORTED)
    )
    return True


def take_prebuilt(
    graph: OpGraph, handle: Handle, c: Candidate, prebuilt: Sequence[Plan]
) -> Plan | None:
    """The plan of ``prebuilt`` that compiling ``c`` would build again, else None.

    It must be of ``c``'s engine with the same resolved knob values (defaults filled in, so
    ``()`` and the explicit defaults match) and, where it records one, built for this graph and
    handle (``Plan.origin``).
    """
    if c.engine is None or not prebuilt:
        return None
    try:
        wanted = c.engine.resolve_settings(c.knob_settings, graph)
        for plan in prebuilt:
            if plan.engine.id != c.engine_id:
                continue
            origin = plan.origin
            if origin is not None and (origin[0] is not graph or origin[1] is not handle):
                continue
            if plan.engine.resolve_settings(plan.knob_settings, graph) == wanted:
                return plan
    except Exception as exc:  # a knob that does not resolve fails in the candidate's compile
        _log.debug("autotune: %s: knobs not resolved (%s); compiled", c.name, exc)
    return None


def compile_candidates(
    graph: OpGraph,
    handle: Handle,
    candidates: Sequence[Candidate],
    deselect: DeselectCriteria,
    watchdog: Watchdog | None = None,
    prebuilt: Sequence[Plan] = (),
) -> list[Plan]:
    """Compile every candidate still in play; returns the compiled plans in order.

    Each compiled candidate gets ``result.workspace_size``, ``compile_time_ms`` and
    ``plan_name``; the deselect workspace threshold bars plans over it ("Plan barred").
    A candidate that ``prebuilt`` holds the plan of (:func:`take_prebuilt`) takes it instead
    of a compile (its ``compile_time_ms``: the lookup's).
    """
    compiled: list[Plan] = []
    failed = 0
    reused: dict[int, Plan] = {}
    for c in candidates:
        found = take_prebuilt(graph, handle, c, prebuilt) if c.in_play else None
        if found is not None:
            reused[id(c)] = found
    _compile_ahead(graph, handle, [c for c in candidates if id(c) not in reused], watchdog)
    for c in candidates:
        if not c.in_play:
            continue
        start = time.perf_counter()
        oom = False
        try:
            if id(c) in reused:
                plan = reused[id(c)]
                _log.info("autotune: %s: the plan built before this call, not built again", c.name)
            else:
                plan = guarded_compile(c, graph, handle, watchdog)
        except CompileError as exc:
            c.result.compile_time_ms += (time.perf_counter() - start) * 1e3
            record_compile_failure(c, exc)
            oom = exc.kind == OOM
            failed += 1
        if oom:
            release_memory(handle.device)
        if not c.in_play:
            continue
        c.result.compile_time_ms += (time.perf_counter() - start) * 1e3
        c.plan = plan
        c.result.workspace_size = plan.workspace_size
        c.result.plan_name = plan.name
        compiled.append(plan)
        barred = deselect.workspace_reason(plan.workspace_size)
        if barred is not None:
            c.exclude(BARRED, barred, by_caller=True)
    _log.info(
        "autotune: compilation - %d compiled, %d failed, %d not compiled (excluded before)",
        len(compiled),
        failed,
        sum(1 for c in candidates if c.plan is None) - failed,
    )
    return compiled


def _compile_ahead(
    graph: OpGraph, handle: Handle, candidates: Sequence[Candidate], watchdog: Watchdog | None
) -> None:
    """``Engine.precompile`` of each engine's candidates in play, before they are compiled one
    by one; its time is shared out over those candidates' ``compile_time_ms``. Not under a
    per-candidate deadline (``candidate_timeout_s``): a batch has no one candidate to fail."""
    if watchdog is not None and watchdog.timeout_s is not None:
        return
    by_engine: dict[int, tuple[Engine, list[Candidate]]] = {}
    for c in candidates:
        if c.in_play and c.engine is not None:
            by_engine.setdefault(c.engine_id, (c.engine, []))[1].append(c)
    for engine, group in by_engine.values():
        if len(group) < 2:
            continue
        start = time.perf_counter()
        settings = [c.knob_settings for c in group]
        try:
            engine.precompile(graph, settings, handle)
        except Exception as exc:  # best effort: each candidate is compiled below anyway
            _log.info("autotune: %s: no compile ahead (%s)", engine.name, describe_failure(exc))
        share = (time.perf_counter() - start) * 1e3 / len(group)
        for c in group:
            c.result.compile_time_ms += share


def apply_workspace_ceiling(candidates: Sequence[Candidate], limit: int) -> None:
    """Skip compiled plans whose workspace exceeds ``limit`` bytes (not executed).

    A warning is logged only when the pre-compile estimate said the plan would fit.
    """
    for c in candidates:
        if not c.in_play:
            continue
        # an isolated candidate's plan lives in the worker: its result has the size
        ws = c.plan.workspace_size if c.plan is not None else c.result.workspace_size
        if ws < 0 or ws <= limit:
            continue
        c.exclude(
            EXCEEDS_LIMIT,
            f"Workspace size {ws} exceeds limit {limit}",
            by_caller=True,
            workspace_size=ws,
        )
        estimate = c.result.estimated_workspace_size
        if 0 <= estimate <= limit:
            _log.warning(
                "autotune: %s: compiled workspace %d bytes exceeds the %d-byte limit although "
                "the estimate (%d) fit; skipped",
                c.name,
                ws,
                limit,
                estimate,
            )
        else:
            _log.info("autotune: %s: workspace %d exceeds limit %d; skipped", c.name, ws, limit)
