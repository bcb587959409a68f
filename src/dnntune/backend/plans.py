"""The compiled-plan path (cuDNN parity): heuristic candidates, support, builds, stable indices.

Deselected plans are never removed: the count includes them and their indices stay valid;
executing one raises InvalidValueError ("Plan barred"), as cuDNN marks plans barred.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dnntune.backend.engine import Engine, Plan, engine_name_or_id
from dnntune.backend.heuristics import HeuristicMode, PolicyDecision, order_engines
from dnntune.backend.knobs import KnobSetting, KnobValue, normalize_settings, settings_from_mapping
from dnntune.backend.registry import get_registry
from dnntune.errors import BadStateError, DnnTuneError, InvalidValueError, NotSupportedError

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "BuildPlanPolicy",
    "DeselectCriteria",
    "PlanCollection",
    "PlanEntry",
    "allocate_workspace",
    "check_workspace",
    "no_engine_error",
]

_log = logging.getLogger(__name__)


class BuildPlanPolicy(enum.Enum):
    HEURISTICS_CHOICE = "heuristics_choice"
    ALL = "all"


@dataclass
class DeselectCriteria:
    """deselect_workspace_greater_than (last write wins) and deselect_engines (union)."""

    workspace_limit: int | None = None
    engine_ids: set[int] = field(default_factory=set)

    def set_workspace_limit(self, workspace: int) -> None:
        if isinstance(workspace, bool) or not isinstance(workspace, int) or workspace < 0:
            raise InvalidValueError(
                f"deselect_workspace_greater_than: expected bytes >= 0, got {workspace!r}"
            )
        self.workspace_limit = workspace

    def add_engines(self, engines: Sequence[str | int]) -> None:
        if isinstance(engines, str | int):
            engines = [engines]
        for e in engines:
            self.engine_ids.add(engine_name_or_id(e))

    def engine_reason(self, engine: Engine) -> str | None:
        if engine.id in self.engine_ids:
            return f"Plan barred: engine {engine.name} deselected by deselect_engines()"
        return None

    def workspace_reason(self, workspace_size: int) -> str | None:
        if self.workspace_limit is not None and workspace_size > self.workspace_limit:
            return (
                f"Plan barred: workspace {workspace_size} bytes is greater than the "
                f"deselect_workspace_greater_than limit {self.workspace_limit}"
            )
        return None


@dataclass
class PlanEntry:
    """One candidate plan of the collection (compiled or not)."""

    engine: Engine
    knob_settings: tuple[KnobSetting, ...]
    plan: Plan | None = None
    support_error: str | None = None
    build_error: str | None = None
    barred: str | None = None
    compile_time_ms: float = 0.0
    #: where ``knob_settings`` came from when a policy stored them (an override-file entry,
    #: the exact-match cache): if they cannot build here, the engine's default knobs are
    #: built instead, as for stored knobs that do not validate (None: the collection's own)
    stored_from: str | None = None
    #: the stored plan that could not be built here and why, when its engine's default knobs
    #: were built instead (None: none was dropped)
    stored_failure: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        if self.plan is not None:
            return self.plan.name
        shown = ",".join(str(s) for s in self.knob_settings)
        return f"{self.engine.name}[{shown}]" if shown else self.engine.name


def _stored_knobs(
    decision: PolicyDecision, engine: Engine, graph: OpGraph
) -> tuple[KnobSetting, ...]:
    """The tuned knobs a policy matched for ``engine`` (override file, exact cache), if valid.

    The RFC applies no knobs on load; dnntune does when they are valid for the engine, so a
    tuned non-default variant is what a later run gets. Invalid stored knobs (a misspelled
    knob id, a value out of range: a hand-edited entry) are ignored with a warning, once per
    entry and problem, and the engine runs with its default knobs.
    """
    if decision.matched.get("engine_id") != engine.id:
        return ()
    raw = decision.matched.get("knob_settings")
    items: list[object] = list(raw) if isinstance(raw, list | tuple) else []
    stored = [s for s in items if isinstance(s, KnobSetting)]
    stored = [s for s in stored if not s.knob_id.startswith("global.benchmarking")]
    if not stored:
        return ()
    try:
        engine.validate_knobs(stored, graph)
    except InvalidValueError as exc:
        where, fix = _stored_where(decision.matched)
        # a file is re-read on every query (several per graph): one warning per entry and problem
        seen = (where, str(exc))
        level = logging.DEBUG if seen in _WARNED_KNOBS else logging.WARNING
        _WARNED_KNOBS.add(seen)
        _log.log(
            level,
            "heuristics: %s: its knobs are ignored (%s); %s runs with its default knobs (%s)",
            where,
            exc,
            engine.name,
            fix,
        )
        return ()
    return normalize_settings(stored)


#: (stored decision, problem) pairs whose invalid knobs were warned about
_WARNED_KNOBS: set[tuple[str, str]] = set()


def _stored_where(matched: Mapping[str, Any]) -> tuple[str, str]:
    """Where a policy's stored knobs came from, and how to fix them there."""
    if matched.get("source") == "override_file":
        index = matched.get("entry_index")
        where = f"override file {matched.get('path')}: engine_overrides[{index}]"
        return where, "fix or remove them in its autotune_metadata.knobs"
    if matched.get("source") == "exact_cache":
        return f"exact-match cache entry {matched.get('key')}", "tune the graph again"
    return f"{matched.get('source') or 'stored'} decision", "tune the graph again"


def allocate_workspace(size_bytes: int, device: torch.device) -> torch.Tensor | None:
    """A workspace buffer of ``size_bytes`` (uint8) on ``device``, or None for zero bytes."""
    if size_bytes <= 0:
        return None
    import torch

    return torch.empty(size_bytes, dtype=torch.uint8, device=device)


def check_workspace(plan: Plan, workspace: torch.Tensor | None) -> None:
    """Raise InvalidValueError if ``workspace`` is smaller than the plan needs."""
    if plan.workspace_size <= 0:
        return
    have = 0 if workspace is None else workspace.numel() * workspace.element_size()
    if have < plan.workspace_size:
        raise InvalidValueError(
            f"plan {plan.name} needs a workspace of {plan.workspace_size} bytes, got {have}; "
            "allocate get_workspace_size() bytes (torch.uint8)"
        )


class PlanCollection:
    """Execution plans of one graph with cuDNN's stable-index semantics."""

    def __init__(
        self,
        graph: OpGraph,
        handle: Handle,
        entries: list[PlanEntry],
        deselect: DeselectCriteria,
        decision: PolicyDecision | None = None,
    ) -> None:
        self.graph = graph
        self.handle = handle
        self.entries = entries
        self.deselect = deselect
        self.decision = decision
        #: the graph's revision these plans were made for (:meth:`check_current`)
        self.revision = graph.revision

    def check_current(self) -> None:
        """Raise BadStateError when the graph changed since these plans were made: a plan
        compiled for the old graph would leave a new output unwritten, or read a tensor the
        pack no longer holds."""
        if self.graph.revision != self.revision:
            raise BadStateError(
                f"graph {self.graph.name!r} changed (a node or tensor was added, or a tensor "
                "edited) since its execution plans were created; call "
                "create_execution_plans() again, then build_plans() or autotune()"
            )

    # ---- creation -------------------------------------------------------------------------
    @classmethod
    def from_heuristics(
        cls,
        graph: OpGraph,
        handle: Handle,
        modes: Sequence[HeuristicMode],
        deselect: DeselectCriteria,
    ) -> PlanCollection:
        registry = get_registry()
        applicable = registry.applicable(graph, handle)
        if not applicable:
            raise no_engine_error(graph, handle)
        ordered: list[Engine] = []
        decision: PolicyDecision | None = None
        for mode in modes or [HeuristicMode.FALLBACK]:
            d = order_engines(graph, handle, applicable, mode)
            decision = decision or d
            ordered.extend(e for e in d.engines if e not in ordered)
        entries = [PlanEntry(e, ()) for e in ordered]
        if decision is not None and entries:
            stored = _stored_knobs(decision, entries[0].engine, graph)
            where = _stored_where(decision.matched)[0] if stored else None
            entries[0] = PlanEntry(entries[0].engine, stored, stored_from=where)
        return cls(graph, handle, entries, deselect, decision)

    @classmethod
    def from_engine(
        cls,
        graph: OpGraph,
        handle: Handle,
        engine: int | str,
        knob_settings: Sequence[KnobSetting] | Mapping[str, KnobValue],
        deselect: DeselectCriteria,
    ) -> PlanCollection:
        eng = get_registry().get(engine)
        settings = settings_from_mapping(knob_settings)
        eng.validate_knobs(settings, graph)
        return cls(graph, handle, [PlanEntry(eng, normalize_settings(settings))], deselect)

    # ---- queries --------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return len(self.entries)

    def entry(self, index: int) -> PlanEntry:
        if isinstance(index, bool) or not isinstance(index, int):
            raise InvalidValueError(f"plan index must be an int, got {index!r}")
        if index < 0 or index >= len(self.entries):
            raise InvalidValueError(
                f"plan index {index} is out of range; the graph has {len(self.entries)} plan(s)"
            )
        return self.entries[index]

    def first_built(self) -> Plan | None:
        for e in self.entries:
            if e.plan is not None and e.barred is None:
                return e.plan
        return None

    def built_indices(self) -> list[int]:
        return [i for i, e in enumerate(self.entries) if e.plan is not None and e.barred is None]

    def max_workspace_size(self) -> int:
        sizes = [
            e.plan.workspace_size for e in self.entries if e.plan is not None and e.barred is None
        ]
        if not sizes:
            raise BadStateError("no compiled plans: call build_plans() first")
        return max(sizes)

    def workspace_size_at(self, index: int) -> int:
        e = self.entry(index)
        if e.plan is None:
            return e.engine.estimate_workspace_size(self.graph, e.knob_settings)
        return e.plan.workspace_size

    def name_at(self, index: int) -> str:
        return self.entry(index).name

    # ---- support and building -------------------------------------------------------------
    def check_support(self) -> None:
        registry = get_registry()
        for e in self.entries:
            e.support_error = registry.why_not(e.engine, self.graph, self.handle)
        if all(e.support_error for e in self.entries):
            reasons = "; ".join(_named(e.engine.name, e.support_error) for e in self.entries)
            raise NotSupportedError(f"no plan supports graph {self.graph.name!r}: {reasons}")

    def _compile(self, e: PlanEntry) -> bool:
        import time

        if e.plan is not None:
            return True
        if e.support_error is None:
            e.support_error = get_registry().why_not(e.engine, self.graph, self.handle)
        if e.support_error is not None:
            return False
        start = time.perf_counter()
        try:
            e.plan = e.engine.compile(self.graph, e.knob_settings, self.handle)
        except DnnTuneError as exc:
            if e.stored_from is not None and e.knob_settings:
                # valid knobs that cannot build here (torch.cuda_graph=1 on the CPU, a cuDNN
                # engine config another cuDNN lacks): the file chose this engine, so its
                # default knobs, not the next engine (session 22: a CPU run fell through to
                # TORCH_COMPILE_ENGINE, which the graph would not get without the file)
                seen = (e.stored_from, str(exc))
                level = logging.DEBUG if seen in _WARNED_KNOBS else logging.WARNING
                _WARNED_KNOBS.add(seen)
                _log.log(
                    level,
                    "heuristics: %s: its plan %s cannot be built here (%s); %s runs with its "
                    "default knobs",
                    e.stored_from,
                    e.name,
                    exc,
                    e.engine.name,
                )
                e.stored_failure = (e.name, str(exc))
                e.knob_settings, e.stored_from = (), None
                return self._compile(e)
            e.build_error = str(exc)
            _log.info("plan %s failed to build: %s", e.name, exc)
            return False
        except Exception as exc:  # a provider bug fails its plan, not the caller
            e.build_error = f"{type(exc).__name__}: {exc}"
            _log.warning("plan %s failed to build: %s", e.name, e.build_error)
            return False
        finally:
            e.compile_time_ms = (time.perf_counter() - start) * 1e3
        e.barred = self.deselect.workspace_reason(e.plan.workspace_size)
        return True

    def build(self, policy: BuildPlanPolicy) -> None:
        """Compile plans; engine-deselected ones are barred without compiling.

        A plan barred earlier stays barred: criteria only ever add exclusions (engines are a
        union), and a workspace verdict, once made on a compiled plan, is not revisited.
        """
        for e in self.entries:
            e.barred = e.barred or self.deselect.engine_reason(e.engine)
        for e in self.entries:
            if e.barred is not None:
                continue
            ok = self._compile(e)
            if ok and e.barred is None and policy is BuildPlanPolicy.HEURISTICS_CHOICE:
                break
        if self.first_built() is None:
            reasons = "; ".join(
                _named(e.name, e.barred or e.support_error or e.build_error or "not built")
                for e in self.entries
            )
            raise NotSupportedError(
                f"no plan could be built for graph {self.graph.name!r}: {reasons}"
            )

    def build_at(self, index: int) -> Plan:
        e = self.entry(index)
        e.barred = e.barred or self.deselect.engine_reason(e.engine)
        if e.barred:
            raise InvalidValueError(f"plan {index} ({e.name}): {e.barred}")
        if not self._compile(e):
            raise NotSupportedError(
                f"plan {index} ({e.name}) cannot be built: {e.support_error or e.build_error}"
            )
        if e.barred:
            raise InvalidValueError(f"plan {index} ({e.name}): {e.barred}")
        assert e.plan is not None
        return e.plan

    def execute_at(
        self,
        index: int,
        pack: Mapping[int, Any],
        workspace: torch.Tensor | None,
        handle: Handle,
    ) -> None:
        e = self.entry(index)
        if e.barred:
            raise InvalidValueError(f"plan {index} ({e.name}): {e.barred}")
        if e.plan is None and (e.support_error or e.build_error):
            # tried and failed (build_plans(ALL) logs and skips it): "call build_plans(ALL)
            # first" sent a caller who had done so back to it, without the reason
            raise NotSupportedError(
                f"plan {index} ({e.name}) could not be built: {e.support_error or e.build_error}"
                "; execute another plan index, or build_plans() to pick one that builds"
            )
        if e.plan is None:
            raise BadStateError(
                f"plan {index} ({e.name}) is not compiled: call build_plans(ALL) or "
                f"build_plan_at_index({index}) first"
            )
        check_workspace(e.plan, workspace)
        with handle.stream_context():
            e.plan.execute(pack, workspace, handle.stream)

    def bar_deselected_engines(self) -> None:
        """Bar the plans of engines deselected now (``deselect_engines`` after the plans were
        made): from then on they are barred, built or not, as if deselected before. (A
        workspace limit set after a plan was compiled does not touch it: cuDNN checks it when
        building.)"""
        for e in self.entries:
            e.barred = e.barred or self.deselect.engine_reason(e.engine)

    def check_not_barred(self, plan: Plan) -> None:
        for e in self.entries:
            if e.plan is plan and e.barred:
                raise InvalidValueError(f"plan {e.name}: {e.barred}")


def _named(name: str, why: str | None) -> str:
    """``why`` introduced by ``name`` once: an engine's reason may begin with its name."""
    return why if why and why.startswith(f"{name}: ") else f"{name}: {why}"


def no_engine_error(graph: OpGraph, handle: Handle) -> NotSupportedError:
    """The error for a graph no registered engine runs on ``handle``'s device: each engine's
    reason (named once: a reason may begin with its engine's name), and what to try where it
    says."""
    reasons = "; ".join(
        _named(e.name, why) for e, why in get_registry().applicability(graph, handle) if why
    )
    return NotSupportedError(
        f"no engine supports graph {graph.name!r} on {handle.device}: {reasons}"
    )
