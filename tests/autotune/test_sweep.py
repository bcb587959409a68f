"""CartesianProduct (RFC 6.2.5, 10.2): correctness across axis counts and the limits."""

from __future__ import annotations

import pytest

from dnntune.autotune.sweep import MAX_SPECS_PER_SWEEP, cartesian_product, product_size
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import InvalidValueError


def _as_dicts(axes, fixed=None, limit=MAX_SPECS_PER_SWEEP):
    return [{s.knob_id: s.value for s in combo} for combo in cartesian_product(axes, fixed, limit)]


def test_rfc_example_table() -> None:
    rows = _as_dicts([("SPLIT_K", [1, 2, 4]), ("TILE_SIZE", [0, 1])], {"REDUCTION_MODE": 1})
    assert rows == [
        {"REDUCTION_MODE": 1, "SPLIT_K": 1, "TILE_SIZE": 0},
        {"REDUCTION_MODE": 1, "SPLIT_K": 1, "TILE_SIZE": 1},
        {"REDUCTION_MODE": 1, "SPLIT_K": 2, "TILE_SIZE": 0},
        {"REDUCTION_MODE": 1, "SPLIT_K": 2, "TILE_SIZE": 1},
        {"REDUCTION_MODE": 1, "SPLIT_K": 4, "TILE_SIZE": 0},
        {"REDUCTION_MODE": 1, "SPLIT_K": 4, "TILE_SIZE": 1},
    ]


def test_no_axes_gives_fixed_settings_only() -> None:
    assert _as_dicts([], {"a": 1}) == [{"a": 1}]
    assert _as_dicts([]) == [{}]
    assert product_size([]) == 1


@pytest.mark.parametrize("sizes", [[1], [3], [2, 2], [2, 3, 4], [1, 5, 1, 2]])
def test_product_size_and_uniqueness(sizes: list[int]) -> None:
    axes = [(f"k{i}", list(range(n))) for i, n in enumerate(sizes)]
    combos = _as_dicts(axes)
    assert len(combos) == product_size(axes)
    assert len({tuple(sorted(c.items())) for c in combos}) == len(combos)
    assert all(len(c) == len(sizes) for c in combos)


def test_mixed_value_types() -> None:
    combos = list(cartesian_product([("i", [1]), ("f", [0.5]), ("s", ["x", "y"])]))
    assert combos[1] == [KnobSetting("i", 1), KnobSetting("f", 0.5), KnobSetting("s", "y")]


def test_limit_enforced_before_generating() -> None:
    axes = [("a", list(range(101))), ("b", list(range(100)))]
    with pytest.raises(InvalidValueError, match="10100 combinations exceeds the limit of 10000"):
        next(cartesian_product(axes))
    exactly = [("a", list(range(100))), ("b", list(range(100)))]
    assert sum(1 for _ in cartesian_product(exactly)) == 10_000


def test_duplicate_knobs_rejected() -> None:
    with pytest.raises(InvalidValueError, match="appears in an axis and in fixed_settings"):
        next(cartesian_product([("a", [1])], {"a": 2}))
    with pytest.raises(InvalidValueError, match="another axis"):
        next(cartesian_product([("a", [1]), ("a", [2])]))


def test_empty_axis_rejected() -> None:
    with pytest.raises(InvalidValueError, match="no values"):
        next(cartesian_product([("a", [])]))
