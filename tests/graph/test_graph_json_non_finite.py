"""Non-finite floats in graph JSON: written as "inf"/"-inf"/"nan", strict JSON, old files load.

Graph.save() and to_json() wrote the tokens Infinity and NaN (Python's json), which jq,
JavaScript and Go refuse.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnntune as dt
from dnntune.graph.json_format import graph_from_dict, graph_from_json_text, load_schema

F = dt.DataType.FLOAT
INF = float("inf")


def _strict_loads(text: str) -> Any:
    """``json.loads`` that refuses the tokens NaN, Infinity and -Infinity, as jq and
    JavaScript's JSON.parse do."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _clamped() -> dt.Graph:
    """min(x, +inf), max(., -inf), relu with an infinite upper clip."""
    g = dt.Graph(name="clamp", io_data_type=F, compute_data_type=F)
    x = g.tensor("X", [2, 4])
    y = g.pointwise(x, INF, mode=dt.PointwiseMode.MIN, name="lo")
    y = g.pointwise(y, -INF, mode=dt.PointwiseMode.MAX, name="hi")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu", relu_upper_clip=INF)
    y.set_output(True)
    g.validate()
    return g


def _scalar_values(g: dt.Graph) -> list[float | int | bool]:
    return [t.value for t in g.tensors if t.value is not None]


def test_infinite_scalars_round_trip_as_strict_json(tmp_path: Path) -> None:
    g = _clamped()
    text = g.to_json()
    doc = _strict_loads(text)
    json.dumps(g.to_dict(), allow_nan=False)
    assert [t["value"] for t in doc["tensors"] if "value" in t] == ["inf", "-inf"]
    assert doc["nodes"][2]["inputs"]["relu_upper_clip"] == "inf"
    again = dt.Graph.from_json(text)
    assert _scalar_values(again) == [INF, -INF]
    assert again.nodes[2].params["relu_upper_clip"] == INF
    assert again.key() == g.key()
    assert again.to_json() == text
    path = tmp_path / "clamp.json"
    g.save(path)
    _strict_loads(path.read_text())
    loaded = dt.Graph.load(path)
    assert _scalar_values(loaded) == [INF, -INF] and loaded.key() == g.key()


def test_a_nan_scalar_round_trips_as_strict_json() -> None:
    """Validation refuses a NaN scalar, but a graph that holds one is still written (and
    read without validation) as strict JSON."""
    g = dt.Graph(name="nan", io_data_type=F, compute_data_type=F)
    x = g.tensor("X", [2, 4])
    g.pointwise(x, float("nan"), mode=dt.PointwiseMode.ADD, name="add").set_output(True)
    text = g.to_json()
    doc = _strict_loads(text)
    assert [t["value"] for t in doc["tensors"] if "value" in t] == ["nan"]
    again = graph_from_json_text(text, dt.Graph, validate=False)
    (value,) = _scalar_values(again)
    assert isinstance(value, float) and math.isnan(value)
    with pytest.raises(dt.GraphFormatError, match=r"tensors\[1\]\.value: .*NaN"):
        dt.Graph.from_json(text)  # validation's verdict, as before


@given(value=st.floats(width=32), clip=st.floats())
def test_any_float_is_written_as_strict_json_and_read_back(value: float, clip: float) -> None:
    g = dt.Graph(name="any", io_data_type=F, compute_data_type=F)
    y = g.pointwise(g.tensor("X", [3]), value, mode=dt.PointwiseMode.MUL, name="mul")
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu", relu_upper_clip=clip)
    text = g.to_json()
    _strict_loads(text)
    again = graph_from_json_text(text, dt.Graph, validate=False)
    (read,) = _scalar_values(again)
    read_clip = again.nodes[1].params["relu_upper_clip"]
    for wrote, got in ((value, read), (clip, read_clip)):
        assert isinstance(got, float)
        assert got == wrote or (math.isnan(wrote) and math.isnan(got))


def test_the_strict_document_meets_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = _clamped().to_dict()
    jsonschema.validate(doc, load_schema())
    doc["tensors"][1]["value"] = "Infinity"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema())


def test_a_file_with_bare_infinity_and_nan_tokens_still_loads(tmp_path: Path) -> None:
    """Files written by earlier versions hold Python's tokens; they load, and are written back
    in the strict form."""
    text = _clamped().to_json()
    old = (
        text.replace('"-inf"', "-Infinity")
        .replace('"inf"', "Infinity")
        .replace('"name": "clamp",', '"name": "clamp", "note": NaN,')
    )
    assert "Infinity" in old and '"inf"' not in old
    path = tmp_path / "old.json"
    path.write_text(old)
    with pytest.warns(dt.UnknownFieldWarning, match=r"old.json: note: unknown field of the graph"):
        g = dt.Graph.load(path)
    assert _scalar_values(g) == [INF, -INF]
    assert g.nodes[2].params["relu_upper_clip"] == INF
    assert g.key() == _clamped().key()
    doc = _strict_loads(g.to_json())
    assert doc["note"] == "nan"  # a field dnntune keeps but does not read
    assert [t["value"] for t in doc["tensors"] if "value" in t] == ["inf", "-inf"]
    nan_doc = json.loads(old.replace("-Infinity", "NaN"))
    (_, value) = _scalar_values(graph_from_dict(nan_doc, dt.Graph, validate=False))
    assert isinstance(value, float) and math.isnan(value)


@pytest.mark.parametrize(
    ("edit", "where", "fragment"),
    [
        (lambda d: d["tensors"][1].update(value="infinity"), "tensors[1].value", "Float32Value"),
        (lambda d: d["tensors"][1].update(value="Inf"), "tensors[1].value", "Float32Value"),
        (
            lambda d: d["tensors"][1].update(value="inf", value_type="Int32Value"),
            "tensors[1].value",
            "expected a number for Int32Value, got 'inf'",
        ),
        (
            lambda d: d["nodes"][2]["inputs"].update(relu_upper_clip="big"),
            "nodes[2].inputs.relu_upper_clip",
            "expected a number",
        ),
    ],
    ids=["misspelled", "capitalized", "int-value-type", "float-parameter"],
)
def test_a_bad_string_for_a_number_names_the_field(edit: Any, where: str, fragment: str) -> None:
    doc = _clamped().to_dict()
    edit(doc)
    with pytest.raises(dt.GraphFormatError) as info:
        dt.Graph.from_json(doc)
    assert info.value.json_path == where
    assert fragment in str(info.value)
    if "Int32" not in fragment:
        assert '"inf", "-inf", "nan"' in str(info.value)
