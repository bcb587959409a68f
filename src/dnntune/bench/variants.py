"""Knob variants of one engine for the oracle sweep: every plan the engine can offer, bounded."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

from dnntune.backend.engine import Engine
from dnntune.backend.knobs import (
    BENCHMARKING,
    FloatConstraint,
    IntConstraint,
    Knob,
    KnobValue,
    StringConstraint,
)
from dnntune.graph.ir import OpGraph

__all__ = ["knob_values", "knob_variants"]

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


def knob_variants(engine: Engine, graph: OpGraph, cap: int = 64) -> list[dict[str, KnobValue]]:
    """Knob settings covering the engine's enumerable knobs (``global.*`` excluded).

    The full Cartesian product when it has at most ``cap`` entries; otherwise each knob is
    varied alone around the defaults (one-at-a-time), which keeps the sweep bounded.
    """
    axes: list[tuple[str, Sequence[KnobValue]]] = []
    for knob in engine.knobs(graph):
        if knob.knob_id.startswith("global."):
            continue
        values = knob_values(knob)
        if len(values) > 1:
            axes.append((knob.knob_id, values))
    if not axes:
        return []
    total = 1
    for _, axis_values in axes:
        total *= len(axis_values)
    if total <= cap:
        return [
            dict(zip([a[0] for a in axes], combo, strict=True))
            for combo in itertools.product(*(a[1] for a in axes))
        ]
    _log.info(
        "oracle: %s has %d knob combinations; sweeping one knob at a time", engine.name, total
    )
    out: list[dict[str, KnobValue]] = []
    for knob_id, axis_values in axes:
        out.extend({knob_id: v} for v in axis_values)
    return out[:cap]


def strip_benchmarking(settings: dict[str, KnobValue]) -> dict[str, KnobValue]:
    return {k: v for k, v in settings.items() if k != BENCHMARKING}
