"""A pass-by-value scalar's value must be a number its data type holds, as the JSON loader
requires. The builder took g.scalar(2.7, data_type=INT32) (engines multiplied by 2.7, and the
file it saved did not load back: 'expected a number for Int32Value, got 2.7'), a string or a
bool value (computed as float("2"), 1.0; neither loaded back), and g.scalar(1e6,
data_type=HALF) or 1e39 as a float, which no half or float holds (new-user audit, session 58)."""

from __future__ import annotations

from typing import Any

import pytest

import dnntune as dt

F = dt.DataType.FLOAT


def _graph(value: Any, data_type: dt.DataType) -> dt.Graph:
    g = dt.Graph("g", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[2], data_type=F)
    s = g.scalar(value, name="s", data_type=data_type)
    g.pointwise(x, s, mode=dt.PointwiseMode.MUL).set_output(True)
    return g


@pytest.mark.parametrize(
    ("value", "data_type", "says"),
    [
        (2.7, dt.DataType.INT32, "an int32 scalar takes an integer, got 2.7"),
        (2.0, dt.DataType.INT64, "an int64 scalar takes an integer, got 2.0"),
        ("2", F, "must be a Python int or float, got '2' \\(str\\)"),
        (True, F, "must be a Python int or float, got True \\(bool\\)"),
        (
            1e6,
            dt.DataType.HALF,
            "scalar of 1000000.0 does not fit its data type half",
        ),
        (-65520.0, dt.DataType.HALF, "of -65520.0 does not fit its data type half"),
        (3.4e38, dt.DataType.BFLOAT16, "does not fit its data type bfloat16"),
        (1e39, F, "of 1e\\+39 does not fit its data type float"),
    ],
)
def test_a_value_its_type_cannot_hold_is_refused(
    value: Any, data_type: dt.DataType, says: str
) -> None:
    with pytest.raises(dt.InvalidValueError, match=f"tensor 's' \\(uid 1\\): .*{says}"):
        _graph(value, data_type).validate()


@pytest.mark.parametrize(
    ("value", "data_type"),
    [
        (2, dt.DataType.INT32),
        (65504.0, dt.DataType.HALF),
        (65519.0, dt.DataType.HALF),  # rounds to 65504
        (1e300, dt.DataType.DOUBLE),
        (float("inf"), dt.DataType.HALF),  # a clamp bound: inf is a value of every float type
        (3, F),
    ],
)
def test_values_the_type_holds_validate_and_round_trip(value: Any, data_type: dt.DataType) -> None:
    g = _graph(value, data_type)
    g.validate()
    assert dt.Graph.from_json(g.to_json()).to_json() == g.to_json()
