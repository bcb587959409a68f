"""Engine discovery and plan-spec collection (RFC 0013 sections 6.2.3 to 6.2.5).

A plan spec is an engine id with knob settings, stored without compiling anything. Every
``add_*`` call appends to one list deduplicated by (engine id, knob settings); knob order does
not matter. ``global.benchmarking`` is stripped with a warning because autotune() owns it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from dnntune.autotune.sweep import (
    MAX_SPECS_PER_SWEEP,
    WARN_SPECS_PER_SWEEP,
    cartesian_product,
    product_size,
)
from dnntune.backend.engine import Engine, engine_id_hex, engine_name_or_id
from dnntune.backend.heuristics import HeuristicMode, order_engines
from dnntune.backend.knobs import BENCHMARKING, KnobSetting, KnobValue, settings_from_mapping
from dnntune.backend.registry import get_registry
from dnntune.errors import BadStateError, InvalidValueError
from dnntune.rfc import EngineConfigInfo, EngineSweepSpec, EngineVariant, PlanSpec

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["PlanSpecCollection", "engine_configs", "engine_label"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
KnobInput = Sequence[KnobSetting] | Mapping[str, KnobValue]


def engine_label(engine_id: int) -> str:
    """The name of a registered engine, else its id as 64-bit hex (as hipDNN prints plugin ids)."""
    engine = get_registry().find(engine_id)
    return engine.name if engine is not None else engine_id_hex(engine_id)


def engine_configs(
    graph: OpGraph, handle: Handle, modes: Sequence[HeuristicMode] = (HeuristicMode.FALLBACK,)
) -> list[EngineConfigInfo]:
    """Applicable engines for ``graph`` on ``handle``'s device, ordered by the heuristics.

    Nothing is compiled. With several modes, engines come in the first mode's order, then any
    the later modes add. An empty list means no engine applies (see ``dnntune engines``).
    """
    registry = get_registry()
    applicable = registry.applicable(graph, handle)
    if not applicable:
        _log.info("autotune: no engine applies to graph %r on %s", graph.name, handle.device)
        return []
    ordered: list[Engine] = []
    for mode in modes or [HeuristicMode.FALLBACK]:
        decision = order_engines(graph, handle, applicable, mode)
        ordered.extend(e for e in decision.engines if e not in ordered)
    return [
        EngineConfigInfo(
            engine_id=e.id,
            engine_name=e.name,
            knobs=tuple(e.knobs(graph)),
            supports_exhaustive=e.supports_exhaustive(graph),
            estimated_workspace_size=int(e.estimate_workspace_size(graph, ())),
        )
        for e in ordered
    ]


class PlanSpecCollection:
    """The plan specs stored on one graph: ordered, deduplicated, validated at add time."""

    def __init__(self, graph: OpGraph, handle: Handle) -> None:
        self.graph = graph
        self.handle = handle
        self._specs: list[PlanSpec] = []
        self._seen: set[PlanSpec] = set()

    # ---- container ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[PlanSpec]:
        return iter(list(self._specs))

    def __repr__(self) -> str:
        return f"<PlanSpecCollection {len(self._specs)} spec(s)>"

    def estimated_max_workspace_size(self) -> int:
        """Largest pre-compile workspace estimate over the specs (not guaranteed >= actual)."""
        if not self._specs:
            raise BadStateError(
                "get_estimated_max_workspace_size: no plan specs; call add_all_engines() or "
                "another add_engine_*() first"
            )
        return max(s.estimated_workspace_size for s in self._specs)

    # ---- add_* (RFC 6.2.3) ---------------------------------------------------------------
    def add_engine_configs(self, configs: Sequence[EngineConfigInfo]) -> None:
        """One default-knob spec per config; ids are trusted (bad ones fail in autotune)."""
        configs = _non_empty(configs, "add_engine_configs", "engine configs")
        for config in configs:
            eid = getattr(config, "engine_id", None)
            if isinstance(eid, bool) or not isinstance(eid, int):
                raise InvalidValueError(
                    f"add_engine_configs: expected EngineConfigInfo entries, got {config!r}"
                )
            estimate = int(getattr(config, "estimated_workspace_size", 0))
            self._store(PlanSpec(eid, (), estimate))

    def add_engines(self, engine_ids: Sequence[int | str]) -> None:
        """add_engine(id) for each id; stops at the first error (earlier ids stay added)."""
        engine_ids = _non_empty(engine_ids, "add_engines", "engine ids")
        for eid in engine_ids:
            self.add_engine(eid)

    def add_engine(self, engine_id: int | str, knob_settings: KnobInput = ()) -> None:
        """One spec. An unknown engine id or a bad knob is an error."""
        engine = self._engine_or_none(engine_id)
        if engine is None:
            known = ", ".join(e.name for e in get_registry().engines()) or "none"
            raise InvalidValueError(
                f"add_engine: unknown engine {engine_id!r}; known engines: {known}"
            )
        settings = _strip_benchmarking(settings_from_mapping(knob_settings), "add_engine")
        self._store(self._validated_spec(engine, settings))

    def add_engine_variants(self, variants: Sequence[EngineVariant]) -> None:
        """One spec per variant. Unknown ids are skipped with a warning; a bad knob is an
        error that keeps the variants added before it (partial application, RFC 6.2.5)."""
        variants = _of_type(
            _non_empty(variants, "add_engine_variants", "variants"),
            EngineVariant,
            "add_engine_variants",
        )
        self._build_ahead(variants)
        for i, variant in enumerate(variants):
            engine = self._engine_or_none(variant.engine_id)
            if engine is None:
                _log.warning(
                    "autotune: add_engine_variants: variant %d: unknown engine id %r; skipped",
                    i,
                    variant.engine_id,
                )
                continue
            settings = _strip_benchmarking(
                settings_from_mapping(variant.knob_settings), "add_engine_variants"
            )
            self._store(self._validated_spec(engine, settings, f"variant {i}: "))

    def add_engine_sweep(self, specs: Sequence[EngineSweepSpec]) -> None:
        """The Cartesian product of each spec's axes merged with its fixed settings.

        ``global.benchmarking`` axes and fixed settings are stripped, empty axes dropped (both
        with a warning). A spec expanding to more than 10,000 plan specs is an error (a
        warning above 1,000). Each spec is validated whole before any of its combinations is
        stored; earlier specs stay added when a later one fails.
        """
        specs = _of_type(
            _non_empty(specs, "add_engine_sweep", "sweep specs"),
            EngineSweepSpec,
            "add_engine_sweep",
        )
        for i, spec in enumerate(specs):
            engine = self._engine_or_none(spec.engine_id)
            if engine is None:
                _log.warning(
                    "autotune: add_engine_sweep: spec %d: unknown engine id %r; skipped",
                    i,
                    spec.engine_id,
                )
                continue
            where = f"add_engine_sweep: spec {i} ({engine.name})"
            axes: list[tuple[str, Sequence[KnobValue]]] = []
            for axis in spec.axes:
                if axis.knob_id == BENCHMARKING:
                    _warn_strip("add_engine_sweep")
                    continue
                if not axis.values:
                    _log.warning(
                        "autotune: %s: axis %r has no values; dropped (the knob keeps its "
                        "engine default)",
                        where,
                        axis.knob_id,
                    )
                    continue
                axes.append((axis.knob_id, list(axis.values)))
            fixed = dict(spec.fixed_settings)
            if BENCHMARKING in fixed:
                _warn_strip("add_engine_sweep")
                del fixed[BENCHMARKING]
            size = product_size(axes)
            if size > MAX_SPECS_PER_SWEEP:
                raise InvalidValueError(
                    f"{where}: {size} combinations exceeds the limit of {MAX_SPECS_PER_SWEEP} "
                    "plan specs per EngineSweepSpec; split the sweep or drop values"
                )
            if size > WARN_SPECS_PER_SWEEP:
                _log.warning(
                    "autotune: %s expands to %d plan specs (more than %d); autotune() will "
                    "compile and time every one",
                    where,
                    size,
                    WARN_SPECS_PER_SWEEP,
                )
            # Validate every value once, then expand: the product of valid values is valid.
            probe = [KnobSetting(k, v) for k, v in fixed.items()]
            probe += [KnobSetting(k, v) for k, values in axes for v in values]
            try:
                engine.validate_knobs(probe, self.graph)
            except InvalidValueError as exc:
                raise InvalidValueError(f"{where}: {exc}") from None
            new = [
                self._spec(engine, combo)
                for combo in cartesian_product(axes, fixed, limit=MAX_SPECS_PER_SWEEP)
            ]
            for s in new:
                self._store(s)

    # ---- internals ----------------------------------------------------------------------
    def _engine_or_none(self, engine_id: int | str) -> Engine | None:
        try:
            return get_registry().find(engine_name_or_id(engine_id))
        except InvalidValueError:
            return None

    def _build_ahead(self, variants: Sequence[EngineVariant]) -> None:
        """``Engine.estimate_ahead`` of each engine's variants, before their specs are made one
        by one (each spec's workspace estimate builds its plan: cuDNN builds the plans of a
        norm's engine configs in worker processes there). Best effort: a variant that fails
        here is reported by its own spec below."""
        groups: dict[int, tuple[Engine, list[Sequence[KnobSetting]]]] = {}
        for variant in variants:
            engine = self._engine_or_none(variant.engine_id)
            if engine is None:
                continue
            try:
                settings = settings_from_mapping(variant.knob_settings)
            except Exception:  # reported (and named) by the loop of add_engine_variants
                continue
            groups.setdefault(engine.id, (engine, []))[1].append(settings)
        for engine, knob_sets in groups.values():
            if len(knob_sets) < 2:
                continue
            try:
                engine.estimate_ahead(self.graph, knob_sets, self.handle)
            except Exception as exc:  # it never raises; a third-party engine's might
                _log.info("autotune: %s: no build ahead (%s)", engine.name, exc)

    def _spec(self, engine: Engine, settings: Sequence[KnobSetting]) -> PlanSpec:
        estimate = int(engine.estimate_workspace_size(self.graph, settings))
        return PlanSpec(engine.id, settings, estimate)

    def _validated_spec(
        self, engine: Engine, settings: Sequence[KnobSetting], where: str = ""
    ) -> PlanSpec:
        try:
            engine.validate_knobs(settings, self.graph)
        except InvalidValueError as exc:
            raise InvalidValueError(f"{where}{exc}") from None
        return self._spec(engine, settings)

    def _store(self, spec: PlanSpec) -> bool:
        if spec in self._seen:
            _log.debug("autotune: plan spec %s already added; skipped", spec)
            return False
        self._seen.add(spec)
        self._specs.append(spec)
        return True


def _non_empty(items: Sequence[T] | None, caller: str, what: str) -> list[T]:
    if items is None or isinstance(items, str | bytes) or len(items) == 0:
        raise InvalidValueError(f"{caller}: no {what} given; pass at least one")
    return list(items)


def _of_type(items: list[T], kind: type, caller: str) -> list[T]:
    """``items`` when each is a ``kind``; else InvalidValueError naming the first that is not."""
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise InvalidValueError(
                f"{caller}: entry {i} must be an {kind.__name__}, got "
                f"{type(item).__name__} {item!r}"
            )
    return items


def _warn_strip(caller: str) -> None:
    _log.warning(
        "autotune: stripping internal knob '%s' from %s call. This knob is managed by "
        "autotune() in EXHAUSTIVE mode.",
        BENCHMARKING,
        caller,
    )


def _strip_benchmarking(settings: list[KnobSetting], caller: str) -> list[KnobSetting]:
    if any(s.knob_id == BENCHMARKING for s in settings):
        _warn_strip(caller)
        return [s for s in settings if s.knob_id != BENCHMARKING]
    return settings
