"""Autotuning candidates and their dispositions (RFC 0013 section 6.3.1).

A candidate is one plan spec (plan-spec path) or one entry of the compiled-plan collection
(compiled-plan path). Every candidate owns exactly one :class:`AutotuneResult` from the start,
so a candidate can never be dropped: each stage either leaves it in play or records why not.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dnntune.autotune.plan_specs import engine_label
from dnntune.backend.engine import Engine, Plan, engine_name_or_id
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.rfc import AutotuneConfig, AutotuneResult, PlanSpec

if TYPE_CHECKING:
    from dnntune.backend.plans import DeselectCriteria, PlanCollection
    from dnntune.graph.ir import OpGraph

__all__ = [
    "BARRED",
    "Candidate",
    "EXCEEDS_LIMIT",
    "FAILED_COMPILE",
    "FAILED_FINALIZE",
    "FILTERED",
    "SKIPPED_BUDGET",
    "SKIPPED_FLOOR",
    "apply_deselect_engines",
    "apply_engine_id_filter",
    "exclusion_summary",
    "from_plan_collection",
    "from_plan_specs",
]

_log = logging.getLogger(__name__)

# Dispositions of candidates that were not benchmarked (the RFC's error-message fragments).
BARRED = "Plan barred"
FILTERED = "engineIdFilter"
EXCEEDS_LIMIT = "exceeds limit"
FAILED_COMPILE = "failed compile"
FAILED_FINALIZE = "failed finalize"
SKIPPED_BUDGET = "skipped (time budget)"
SKIPPED_FLOOR = "skipped (call floor)"


@dataclass
class Candidate:
    """One autotuning candidate with its result, in candidate order."""

    index: int
    engine_id: int
    engine: Engine | None
    knob_settings: tuple[KnobSetting, ...]
    result: AutotuneResult
    plan: Plan | None = None
    #: index into the compiled-plan collection (compiled-plan path), else -1
    collection_index: int = -1
    #: why it left the running (one of the disposition constants), None while in play
    disposition: str | None = None
    #: False for the unprimed copy of the default plan that EXHAUSTIVE mode adds
    #: (:mod:`dnntune.autotune.unprimed`): never primed, never capped, compiled before any priming
    prime: bool = True

    @property
    def in_play(self) -> bool:
        return self.disposition is None

    @property
    def name(self) -> str:
        return self._name if self.prime else f"{self._name} (unprimed default)"

    @property
    def _name(self) -> str:
        if self.plan is not None:
            return self.plan.name
        shown = ",".join(str(s) for s in self.knob_settings)
        base = self.result.engine_name
        return f"{base}[{shown}]" if shown else base

    def exclude(
        self, disposition: str, message: str, *, by_caller: bool, workspace_size: int | None = None
    ) -> None:
        """Take the candidate out before benchmarking (succeeded False, rank -1, index -1)."""
        self.disposition = disposition
        r = self.result
        r.succeeded = False
        r.rank = -1
        r.compiled_plan_index = -1
        r.error_message = message
        r.excluded_by_caller = by_caller
        if workspace_size is not None:
            r.workspace_size = workspace_size

    def fail(self, message: str) -> None:
        """The candidate was benchmarked (or verified) and failed."""
        self.disposition = "failed"
        self.result.succeeded = False
        self.result.rank = -1
        self.result.error_message = message


def _result(
    engine_id: int,
    engine: Engine | None,
    settings: Sequence[KnobSetting],
    graph: OpGraph,
    config: AutotuneConfig,
    estimate: int,
) -> AutotuneResult:
    supports = False
    if engine is not None:
        try:
            supports = engine.supports_exhaustive(graph)
        except Exception as exc:  # a provider bug must not stop the session
            _log.warning("autotune: %s: supports_exhaustive raised %s", engine.name, exc)
    return AutotuneResult(
        engine_id=engine_id,
        engine_name=engine.name if engine is not None else engine_label(engine_id),
        knob_settings=list(settings),
        workspace_size=-1,
        estimated_workspace_size=estimate,
        mode_used=config.mode,
        supports_exhaustive=supports,
        strategy_used=config.strategy,
        cache_mode=config.cache_mode,
    )


def from_plan_specs(
    graph: OpGraph, specs: Sequence[PlanSpec], config: AutotuneConfig
) -> list[Candidate]:
    """One candidate per plan spec (nothing compiled yet: workspace_size -1)."""
    registry = get_registry()
    out: list[Candidate] = []
    for i, spec in enumerate(specs):
        engine = registry.find(spec.engine_id)
        result = _result(
            spec.engine_id, engine, spec.knob_settings, graph, config, spec.estimated_workspace_size
        )
        out.append(Candidate(i, spec.engine_id, engine, spec.knob_settings, result))
    return out


def from_plan_collection(
    graph: OpGraph, plans: PlanCollection, config: AutotuneConfig
) -> list[Candidate]:
    """One candidate per entry of the compiled-plan collection, with its build disposition."""
    out: list[Candidate] = []
    for i, entry in enumerate(plans.entries):
        engine = entry.engine
        estimate = 0
        try:
            estimate = int(engine.estimate_workspace_size(graph, entry.knob_settings))
        except Exception as exc:
            _log.debug("autotune: %s: estimate_workspace_size raised %s", engine.name, exc)
        result = _result(engine.id, engine, entry.knob_settings, graph, config, estimate)
        result.compile_time_ms = entry.compile_time_ms
        cand = Candidate(i, engine.id, engine, entry.knob_settings, result, entry.plan, i)
        if entry.plan is not None:
            result.workspace_size = entry.plan.workspace_size
            result.plan_name = entry.plan.name
        if entry.barred:
            ws = entry.plan.workspace_size if entry.plan is not None else -1
            cand.exclude(BARRED, entry.barred, by_caller=True, workspace_size=ws)
        elif entry.plan is None:
            why = entry.build_error or (
                f"not supported: {entry.support_error}" if entry.support_error else None
            )
            if why is None:
                why = (
                    "never built (build_plans(HEURISTICS_CHOICE) builds only the first "
                    "supported plan; use BuildPlanPolicy.ALL to tune every plan)"
                )
            cand.exclude(FAILED_FINALIZE, f"Plan {FAILED_FINALIZE}: {why}", by_caller=False)
        out.append(cand)
    return out


def apply_deselect_engines(candidates: Sequence[Candidate], deselect: DeselectCriteria) -> None:
    """Plan-spec path: bar candidates whose engine was deselected (before compiling)."""
    for c in candidates:
        if not c.in_play:
            continue
        if c.engine_id in deselect.engine_ids:
            c.exclude(
                BARRED,
                f"{BARRED} (engine ID or workspace deselect filter): engine "
                f"{c.result.engine_name} deselected by deselect_engines()",
                by_caller=True,
                workspace_size=-1,
            )


def apply_engine_id_filter(candidates: Sequence[Candidate], config: AutotuneConfig) -> None:
    """Keep only candidates whose engine id is in ``engine_id_filter`` (empty keeps all).

    Filter ids that match no candidate are ignored silently (RFC 6.3).
    """
    if not config.engine_id_filter:
        return
    wanted = {engine_name_or_id(e) for e in config.engine_id_filter}
    for c in candidates:
        if c.in_play and c.engine_id not in wanted:
            ws = c.plan.workspace_size if c.plan is not None else -1
            c.exclude(FILTERED, f"Plan excluded by {FILTERED}.", by_caller=True, workspace_size=ws)


def exclusion_summary(candidates: Sequence[Candidate]) -> str:
    """E.g. "2 barred by deselect_*(), 1 excluded by engineIdFilter" (non-zero categories only)."""
    labels = {
        BARRED: "barred by deselect_*()",
        FILTERED: "excluded by engineIdFilter",
        EXCEEDS_LIMIT: "skipped (compiled workspace exceeds limit)",
        FAILED_COMPILE: "failed compile",
        FAILED_FINALIZE: "failed finalize",
        SKIPPED_BUDGET: "skipped (time budget)",
        SKIPPED_FLOOR: "skipped (cannot beat the best: call floor)",
        "failed": "failed benchmarking",
    }
    counts: dict[str, int] = {}
    for c in candidates:
        if c.disposition is not None:
            counts[c.disposition] = counts.get(c.disposition, 0) + 1
    return ", ".join(f"{n} {labels.get(d, d)}" for d, n in counts.items() if n)
