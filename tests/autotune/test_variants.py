"""knob_variants: bounded knob spaces, and the first N values of an ordered knob."""

from __future__ import annotations

from typing import Any, cast

from dnntune.autotune.variants import knob_variants
from dnntune.backend.engine import Engine
from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType, StringConstraint


class _Engine:
    name = "X_ENGINE"

    def __init__(self, knobs: list[Knob]) -> None:
        self._knobs = knobs

    def knobs(self, graph: Any = None) -> list[Knob]:
        return self._knobs


PLANS = Knob("x.config", "plan index", KnobValueType.INT64, -1, IntConstraint(-1, 20), ranked=True)
MODE = Knob("x.mode", "mode", KnobValueType.STRING, "a", StringConstraint(frozenset({"a", "b"})))


def _variants(**kwargs: Any) -> list[dict[str, Any]]:
    engine = cast(Engine, _Engine([PLANS, MODE]))
    return knob_variants(engine, cast(Any, None), one_at_a_time=True, **kwargs)


def test_a_large_knob_is_left_to_the_engine_unless_it_is_ranked() -> None:
    assert _variants(max_values_per_knob=6) == [{"x.mode": "b"}]
    assert _variants(max_values_per_knob=6, ranked_values=3) == [
        {"x.config": 0},
        {"x.config": 1},
        {"x.config": 2},
        {"x.mode": "b"},
    ]


def test_the_default_value_is_never_a_variant() -> None:
    swept = _variants(ranked_values=50)
    assert {"x.config": -1} not in swept
    assert len(swept) == 21 + 1  # 0..20 and mode b
