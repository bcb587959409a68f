"""Knob constraints, validation messages and settings normalisation."""

from __future__ import annotations

import pytest

from dnntune.backend.knobs import (
    FloatConstraint,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValueType,
    StringConstraint,
    benchmarking_knob,
    normalize_settings,
    settings_from_mapping,
)
from dnntune.errors import InvalidValueError


def test_int_constraint_range_step_and_set() -> None:
    assert IntConstraint(0, 8, 2).check(4) is None
    assert IntConstraint(0, 8, 2).check(3) == "must be 0 plus a multiple of 2"
    assert IntConstraint(0, 8).check(9) == "allowed range: 0..8"
    assert IntConstraint(valid_values=frozenset({1, 4})).check(2) == "allowed values: [1, 4]"
    assert IntConstraint(1, 4, 1).describe() == "1..4"


def test_float_and_string_constraints() -> None:
    assert FloatConstraint(0.0, 1.0).check(1.5) == "allowed range: 0.0..1.0"
    assert StringConstraint(frozenset({"a", "b"})).check("c") == "allowed values: ['a', 'b']"
    assert StringConstraint(max_length=2).check("abc") == "at most 2 characters"


def test_validate_names_engine_knob_and_allowed_values() -> None:
    knob = benchmarking_knob()
    knob.validate(KnobSetting("global.benchmarking", 1), "E")
    with pytest.raises(
        InvalidValueError,
        match=r"engine E: knob global.benchmarking: value 2 "
        r"is invalid; allowed range: 0..1",
    ):
        knob.validate(KnobSetting("global.benchmarking", 2), "E")
    with pytest.raises(InvalidValueError, match="expected a int value, got 'x'"):
        knob.validate(KnobSetting("global.benchmarking", "x"), "E")


def test_float_knob_accepts_ints() -> None:
    knob = Knob("p.f", "", KnobValueType.FLOAT64, 0.5, FloatConstraint(0.0, 2.0))
    knob.validate(KnobSetting("p.f", 1))


def test_settings_are_normalised_order_independently() -> None:
    a = normalize_settings([KnobSetting("b", 1), KnobSetting("a", 2), KnobSetting("b", 3)])
    assert a == (KnobSetting("a", 2), KnobSetting("b", 3))
    assert settings_from_mapping({"x": 1}) == [KnobSetting("x", 1)]
    assert settings_from_mapping([("y", "v")]) == [KnobSetting("y", "v")]  # type: ignore[list-item]
    assert str(KnobSetting("torch.allow_tf32", 1)) == "torch.allow_tf32=1"
