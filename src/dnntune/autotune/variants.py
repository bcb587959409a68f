"""Knob variants of one engine: the plans it can offer beyond its defaults, bounded.

Used by ``dnntune bench --oracle`` (every enumerable variant of one engine), by
``dnntune tune --sweep-knobs`` (a few variants of every engine, one knob at a time) and, in
every tuning run, by :func:`add_suggested_variants` (the few each engine names for the graph).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dnntune.backend.engine import Engine
from dnntune.backend.estimates import estimates_without_builds
from dnntune.backend.knobs import (
    FloatConstraint,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValue,
    StringConstraint,
)
from dnntune.backend.registry import get_registry
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.rfc import EngineVariant

__all__ = [
    "add_knob_variants",
    "add_suggested_variants",
    "add_tuning_variants",
    "distinct_variants",
    "knob_values",
    "knob_variants",
    "sweep_variants",
    "valid_variants",
]

_log = logging.getLogger(__name__)

#: an int knob with at most this many values in its range is swept over all of them
MAX_RANGE_VALUES = 64


def knob_values(knob: Knob) -> list[KnobValue]:
    """The values worth sweeping for one knob (empty when it cannot be enumerated)."""
    c = knob.constraint
    if isinstance(c, IntConstraint):
        if c.valid_values:
            return sorted(c.valid_values)
        count = (c.max_value - c.min_value) // max(c.step, 1) + 1
        if 1 < count <= MAX_RANGE_VALUES:
            return list(range(c.min_value, c.max_value + 1, max(c.step, 1)))
        return []
    if isinstance(c, StringConstraint):
        return sorted(c.valid_values)
    if isinstance(c, FloatConstraint):
        return []
    return []


def valid_variants(
    engine: Engine, graph: OpGraph, variants: Iterable[dict[str, KnobValue]]
) -> list[dict[str, KnobValue]]:
    """The ``variants`` that ``engine``'s own knob validation accepts for ``graph``.

    A variant the engine would reject at build time (a Triton ``num_warps`` that leaves threads
    without work for this row width, a cuDNN ``engine_config`` past the plans it offers) is not
    a candidate: it is dropped here, before it reaches a sweep, so no engine ever puts in front
    of a user a variant that its own validation refuses. Dropped variants are logged at debug.
    """
    out: list[dict[str, KnobValue]] = []
    for variant in variants:
        try:
            engine.validate_knobs([KnobSetting(k, v) for k, v in variant.items()], graph)
        except (InvalidValueError, NotSupportedError) as exc:
            _log.debug(
                "autotune: %s: variant %s is not valid for this graph: %s",
                engine.name,
                variant,
                exc,
            )
            continue
        out.append(variant)
    return out


def knob_variants(
    engine: Engine,
    graph: OpGraph,
    cap: int = 64,
    max_values_per_knob: int | None = None,
    one_at_a_time: bool = False,
    ranked_values: int = 0,
    distinct: bool = False,
    device_clock: bool = False,
) -> list[dict[str, KnobValue]]:
    """Knob settings covering the engine's enumerable knobs (``global.*`` excluded).

    The full Cartesian product when it has at most ``cap`` entries (and ``one_at_a_time`` is
    False); otherwise each knob is varied alone around the defaults, which keeps the sweep
    bounded. Knobs with more than ``max_values_per_knob`` values are left at their default (an
    engine's own search covers those better: ``global.benchmarking``), except ``ranked``
    knobs, which keep their first ``ranked_values`` values (for a ranked plan index such as
    ``cudnn.engine_config``, the engine's best-ranked plans). A knob's ``search_values`` (a
    provider's own search, such as ``torch.compile``'s max-autotune) are never enumerated:
    EXHAUSTIVE mode's priming (``global.benchmarking``) runs that search. Nor are values that
    write or delete the engine's persistent records (``Knob.persistent_values``: Triton's
    perf-db policies), which would change what later builds read.

    ``distinct`` (unprimed sweeps: the STANDARD oracle) also leaves out what provably builds a
    plan already offered (:func:`distinct_variants`): a single-knob variant of a
    ``Knob.default_plan_values`` value (the default's plan), and a variant whose
    ``Knob.plan_key`` identity is the default's or an earlier variant's; with ``device_clock``
    (a sweep ranked on device time), also a single-knob variant of a ``Knob.same_kernel_values``
    value, which launches the default's kernels.
    """
    knobs = engine.knobs(graph)
    axes: list[tuple[str, Sequence[KnobValue]]] = []
    for knob in knobs:
        if knob.knob_id.startswith("global."):
            continue
        every = knob_values(knob)
        # a provider's own search (Knob.search_values) is EXHAUSTIVE mode's priming, not a
        # variant: enumerating it would put a search of tens of seconds into every sweep;
        # a value that writes or deletes the engine's records (Knob.persistent_values) would
        # change the plans of the rest of the run (and of later runs)
        values = [
            v
            for v in every
            if v != knob.default_value
            and v not in knob.search_values
            and v not in knob.persistent_values
        ]
        if knob.ranked and ranked_values > 0:
            values = values[:ranked_values]
        elif max_values_per_knob is not None and len(every) > max_values_per_knob:
            continue
        if values:
            axes.append((knob.knob_id, values))
    if not axes:
        return []
    total = 1
    for _, axis_values in axes:
        total *= len(axis_values) + 1
    if total <= cap and not one_at_a_time:
        # each axis with its default (None = leave the knob unset) so the product also holds
        # every partial variant; the all-default combination is the engine's own spec
        combos = itertools.product(*([None, *a[1]] for a in axes))
        out_all = []
        for combo in combos:
            variant = {a[0]: v for a, v in zip(axes, combo, strict=True) if v is not None}
            if variant:
                out_all.append(variant)
        valid = valid_variants(engine, graph, out_all)
        return distinct_variants(knobs, valid, device_clock) if distinct else valid
    _log.debug(
        "autotune: %s: %d knob combinations; sweeping one knob at a time", engine.name, total
    )
    out: list[dict[str, KnobValue]] = []
    for knob_id, axis_values in axes:
        out.extend({knob_id: v} for v in axis_values)
    valid = valid_variants(engine, graph, out)
    return (distinct_variants(knobs, valid, device_clock) if distinct else valid)[:cap]


def distinct_variants(
    knobs: Sequence[Knob], variants: Iterable[dict[str, KnobValue]], device_clock: bool = False
) -> list[dict[str, KnobValue]]:
    """``variants`` less those that provably build the default's plan or an earlier variant's.

    Provably, from the knobs' declarations, without building anything: a single-knob variant
    whose value is one of the knob's ``default_plan_values``; a variant whose plan identity
    (every ``Knob.plan_key`` of ``knobs``, over the knob values the variant resolves to) is
    known and equals the default's or an earlier variant's. A variant whose identity is not
    known (a key returned None) is kept. With ``device_clock``, also a single-knob variant whose
    value is one of the knob's ``same_kernel_values`` (the default's kernels, submitted another
    way: the same device time). Order is kept; dropped variants are logged at debug.
    """
    by_id = {k.knob_id: k for k in knobs}
    keyed = [k for k in knobs if k.plan_key is not None]
    defaults = {k.knob_id: k.default_value for k in knobs}

    def identity(variant: Mapping[str, KnobValue]) -> tuple[Any, ...] | None:
        if not keyed:
            return None
        values = {**defaults, **variant}
        keys = tuple(k.plan_key(values) for k in keyed if k.plan_key is not None)
        return None if any(key is None for key in keys) else keys

    seen: set[tuple[Any, ...]] = set()
    default_identity = identity({})
    if default_identity is not None:
        seen.add(default_identity)
    out: list[dict[str, KnobValue]] = []
    for variant in variants:
        if len(variant) == 1:
            ((knob_id, value),) = variant.items()
            knob = by_id.get(knob_id)
            if knob is not None and value in knob.default_plan_values:
                _log.debug("autotune: variant %s builds the default's plan: left out", variant)
                continue
            if knob is not None and device_clock and value in knob.same_kernel_values:
                _log.debug("autotune: variant %s launches the default's kernels: left out", variant)
                continue
        key = identity(variant)
        if key is not None:
            if key in seen:
                _log.debug(
                    "autotune: variant %s builds a plan already in the sweep: left out", variant
                )
                continue
            seen.add(key)
        out.append(variant)
    return out


#: ``add_knob_variants``: per engine, at most SWEEP_CAP extra candidates from its knobs, and only
#: knobs with at most SWEEP_MAX_VALUES values (larger spaces, such as Triton's tile sizes, are
#: the engines' own searches: exhaustive mode), except ranked knobs (cuDNN's plan list), whose
#: first SWEEP_RANKED values are tried
SWEEP_CAP = 12
SWEEP_MAX_VALUES = 6
SWEEP_RANKED = 8


def _add_variants(
    graph: Any,
    exclude: frozenset[str],
    variants_of: Callable[[Engine], Iterable[dict[str, KnobValue]]],
) -> int:
    """Add ``variants_of(engine)`` for each candidate engine of ``graph`` (a
    :class:`dnntune.Graph` after ``add_all_engines``) as plan specs, leaving out those that set
    a knob in ``exclude``; how many were added."""

    registry = get_registry()
    variants: list[EngineVariant] = []
    for engine_id in dict.fromkeys(spec.engine_id for spec in graph.plan_specs):
        engine = registry.find(engine_id)
        if engine is None:
            continue
        for knobs in valid_variants(engine, graph, variants_of(engine)):
            if not exclude.intersection(knobs):
                variants.append(EngineVariant(engine_id, knobs))
    if variants:
        graph.add_engine_variants(variants)
    return len(variants)


def add_knob_variants(graph: Any, exclude: frozenset[str] = frozenset()) -> int:
    """Add each candidate engine's small and ranked knob spaces, one knob at a time (see
    :func:`_add_variants`); ``dnntune tune --sweep-knobs`` and ``dnntune.torch``'s
    ``configure(sweep=True)``. Returns how many were added."""
    return _add_variants(graph, exclude, lambda engine: sweep_variants(engine, graph))


def sweep_variants(engine: Engine, graph: OpGraph) -> list[dict[str, KnobValue]]:
    """The variants ``--sweep-knobs`` adds for ``engine``: small and ranked knob spaces, one
    knob at a time (see the SWEEP_* bounds)."""
    return knob_variants(
        engine,
        graph,
        cap=SWEEP_CAP,
        max_values_per_knob=SWEEP_MAX_VALUES,
        one_at_a_time=True,
        ranked_values=SWEEP_RANKED,
    )


def add_suggested_variants(graph: Any, exclude: frozenset[str] = frozenset()) -> int:
    """Add the variants each candidate engine suggests for ``graph`` (``Engine.
    suggested_variants``: a handful, such as TORCH_ENGINE's io-typed intermediates; see
    :func:`_add_variants`). Returns how many were added."""
    return _add_variants(graph, exclude, lambda engine: engine.suggested_variants(graph))


def add_tuning_variants(
    graph: Any, *, sweep: bool, budgeted: bool, exclude: frozenset[str] = frozenset()
) -> int:
    """What a tuning run adds after ``add_all_engines``: :func:`add_suggested_variants`, and
    :func:`add_knob_variants` with ``sweep``. ``budgeted`` (the tune has a
    ``time_budget_s``): the variants' plans are not built for their workspace estimates
    (:func:`~dnntune.backend.estimates.estimates_without_builds`), the search builds each
    when it reaches it; give such a tune :func:`~dnntune.backend.estimates.
    deferred_workspace_size`. Returns how many variants were added."""
    with estimates_without_builds(budgeted):
        added = add_suggested_variants(graph, exclude=exclude)
        if sweep:
            added += add_knob_variants(graph, exclude=exclude)
    return added
