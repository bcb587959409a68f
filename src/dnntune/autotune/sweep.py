"""Knob sweeps: the Cartesian product of sweep axes, merged with fixed settings (RFC 6.2.5)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from dnntune.backend.knobs import KnobSetting, KnobValue
from dnntune.errors import InvalidValueError

__all__ = ["MAX_SPECS_PER_SWEEP", "WARN_SPECS_PER_SWEEP", "cartesian_product", "product_size"]

#: one EngineSweepSpec may not expand to more plan specs than this (RFC 6.2.5)
MAX_SPECS_PER_SWEEP = 10_000
#: above this a warning is logged
WARN_SPECS_PER_SWEEP = 1_000

Axis = tuple[str, Sequence[KnobValue]]


def product_size(axes: Sequence[Axis]) -> int:
    """How many combinations ``axes`` produce (1 for no axes: the fixed settings alone)."""
    return math.prod(len(values) for _, values in axes)


def cartesian_product(
    axes: Sequence[Axis],
    fixed: Mapping[str, KnobValue] | None = None,
    limit: int = MAX_SPECS_PER_SWEEP,
) -> Iterator[list[KnobSetting]]:
    """Yield every combination of the axes' values, each merged with ``fixed``.

    The first axis varies slowest, as in the RFC's table (SPLIT_K 1,1,2,2,4,4 against
    TILE_SIZE 0,1,0,1,0,1). No axes yields one combination: the fixed settings alone.

    Raises:
        InvalidValueError: a knob appears twice (in two axes or in an axis and ``fixed``), an
            axis is empty (callers drop empty axes first), or the product exceeds ``limit``.
    """
    fixed = dict(fixed or {})
    seen: set[str] = set(fixed)
    for knob_id, values in axes:
        if knob_id in seen:
            where = "fixed_settings" if knob_id in fixed else "another axis"
            raise InvalidValueError(f"sweep: knob {knob_id!r} appears in an axis and in {where}")
        if not values:
            raise InvalidValueError(f"sweep: axis {knob_id!r} has no values")
        seen.add(knob_id)
    size = product_size(axes)
    if size > limit:
        raise InvalidValueError(
            f"sweep: {' x '.join(str(len(v)) for _, v in axes)} = {size} combinations exceeds "
            f"the limit of {limit} plan specs per EngineSweepSpec; split the sweep or drop values"
        )
    base = [KnobSetting(k, v) for k, v in fixed.items()]
    ids = [knob_id for knob_id, _ in axes]
    for combo in itertools.product(*(values for _, values in axes)):
        yield [*base, *(KnobSetting(k, v) for k, v in zip(ids, combo, strict=True))]
