"""Compiling plan specs inside autotune() and the post-compile workspace checks.

Compilation is where the plan-spec path meets the providers: an unknown id, an engine that
does not support the graph, or a provider error each fail only that candidate ("failed
compile"); a compiled object that is not a usable plan fails it at "finalize". Compiled plans
then face the deselect workspace threshold and the call's workspace ceiling.
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
from dnntune.backend.engine import Engine, Plan
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = ["CompileError", "apply_workspace_ceiling", "compile_candidates", "compile_plan"]

_log = logging.getLogger(__name__)


class CompileError(Exception):
    """Why a plan could not be built; ``stage`` is FAILED_COMPILE or FAILED_FINALIZE."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


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
            f"unknown engine id {engine_id} (0x{engine_id & 0xFFFFFFFFFFFFFFFF:016x}); it is not "
            "registered (take ids from get_engine_configs())",
        )
    why = get_registry().why_not(engine, graph, handle)
    if why is not None:
        raise CompileError(
            FAILED_COMPILE, f"engine {engine.name} does not support the graph: {why}"
        )
    try:
        plan = engine.compile(graph, settings, handle)
    except Exception as exc:  # a provider error fails this candidate, never the session
        raise CompileError(FAILED_COMPILE, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(plan, Plan):
        raise CompileError(FAILED_FINALIZE, f"engine {engine.name} returned {plan!r}, not a Plan")
    if isinstance(plan.workspace_size, bool) or plan.workspace_size < 0:
        raise CompileError(
            FAILED_FINALIZE, f"plan {plan.name} reports a bad workspace size {plan.workspace_size}"
        )
    return plan


def compile_candidates(
    graph: OpGraph,
    handle: Handle,
    candidates: Sequence[Candidate],
    deselect: DeselectCriteria,
) -> list[Plan]:
    """Compile every candidate still in play; returns the compiled plans in order.

    Each compiled candidate gets ``result.workspace_size``, ``compile_time_ms`` and
    ``plan_name``; the deselect workspace threshold bars plans over it ("Plan barred").
    """
    compiled: list[Plan] = []
    failed = 0
    for c in candidates:
        if not c.in_play:
            continue
        start = time.perf_counter()
        try:
            plan = compile_plan(c.engine, c.engine_id, c.knob_settings, graph, handle)
        except CompileError as exc:
            c.result.compile_time_ms = (time.perf_counter() - start) * 1e3
            c.exclude(
                exc.stage, f"Plan {exc.stage}: {exc.message}", by_caller=False, workspace_size=-1
            )
            _log.warning("autotune: %s: %s: %s", c.name, exc.stage, exc.message)
            failed += 1
            continue
        c.result.compile_time_ms = (time.perf_counter() - start) * 1e3
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


def apply_workspace_ceiling(candidates: Sequence[Candidate], limit: int) -> None:
    """Skip compiled plans whose workspace exceeds ``limit`` bytes (not executed).

    A warning is logged only when the pre-compile estimate said the plan would fit.
    """
    for c in candidates:
        if not c.in_play or c.plan is None:
            continue
        ws = c.plan.workspace_size
        if ws <= limit:
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
