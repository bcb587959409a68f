"""The shipped JSON Schema: current, in agreement with the op specs, and met by every document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.graph.json_format import SCHEMA_PATH, load_schema
from dnntune.graph.ops import ALL_SPECS
from dnntune.graph.schema import schema_text

HERE = Path(__file__).parent
DOCUMENTS = sorted((HERE / "data").glob("hipdnn_*.json")) + sorted(
    (HERE.parents[1] / "examples" / "graphs").glob("*.json")
)


def test_schema_file_is_current() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), (
        "regenerate: python -m dnntune.graph.schema > src/dnntune/graph/graph.schema.json"
    )


def schema_locations(node_def: dict[str, Any]) -> set[tuple[str, str]]:
    """Every (section, key) a node type's schema names; section "" is the node object."""
    out: set[tuple[str, str]] = set()
    for key, prop in node_def["properties"].items():
        if key in ("type",):
            continue
        if prop.get("type") == "object" and "properties" in prop:
            out |= {(key, inner) for inner in prop["properties"]}
        else:
            out.add(("", key))
    return out


def test_schema_agrees_with_op_specs() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    defs = schema["$defs"]
    assert defs["node"]["properties"]["type"]["enum"] == [s.json_type for s in ALL_SPECS]
    for spec in ALL_SPECS:
        node_def = defs[spec.json_type]
        assert node_def["properties"]["type"] == {"const": spec.json_type}
        expected = {spec.location(f) for f in (*spec.all_inputs, *spec.all_outputs)}
        expected |= {spec.location(p.name) for p in spec.params}
        expected |= {(d.rpartition(".")[0], d.rpartition(".")[2]) for d in spec.json_constants}
        assert schema_locations(node_def) == expected, spec.json_type
        required_fields = {spec.location(f) for f in (*spec.inputs, *spec.outputs)}
        for section, key in required_fields:
            box = node_def if section == "" else node_def["properties"][section]
            assert key in box["required"], (spec.json_type, key)


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_documents_meet_the_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(path.read_text()), load_schema())


def every_op_graph() -> list[dt.Graph]:
    """One builder graph per op kind, so every writer layout is checked against the schema."""
    f32 = dt.DataType.FLOAT

    def new(name: str) -> dt.Graph:
        return dt.Graph(name=name, io_data_type=f32, compute_data_type=f32)

    graphs = []
    g = new("bn_training")
    x = g.tensor("X", [2, 4, 3, 3])
    ch = [g.tensor(n, [1, 4, 1, 1]) for n in ("S", "B", "RM", "RV")]
    for t in g.batchnorm(
        x, ch[0], ch[1], prev_running_mean=ch[2], prev_running_variance=ch[3], momentum=0.1
    ):
        t.set_output(True)
    graphs.append(g)
    g = new("bn_backward")
    x, dy = g.tensor("X", [2, 4, 3, 3]), g.tensor("DY", [2, 4, 3, 3])
    ch = [g.tensor(n, [1, 4, 1, 1]) for n in ("M", "IV", "S")]
    for t in g.batchnorm_backward(dy, x, *ch):
        t.set_output(True)
    graphs.append(g)
    g = new("sdpa_stats_mask")
    q = g.tensor("Q", [1, 2, 4, 8])
    mask = g.tensor("M", [1, 1, 4, 4], data_type=dt.DataType.BOOLEAN)
    for t in g.sdpa(q, q, q, attn_mask=mask, generate_stats=True):
        t.set_output(True)
    graphs.append(g)
    g = new("norms_training")
    x, s = g.tensor("X", [2, 8]), g.tensor("S", [1, 8])
    y, *stats = g.layernorm(x, s, s, forward_phase=dt.NormFwdPhase.TRAINING)
    z, inv_rms = g.rmsnorm(y, s, bias=s, forward_phase=dt.NormFwdPhase.TRAINING)
    for t in (*stats, z, inv_rms):
        t.set_output(True)
    graphs.append(g)
    g = new("conv_grads")
    x, dy = g.tensor("X", [1, 4, 6, 6]), g.tensor("DY", [1, 8, 6, 6])
    dw = g.conv_wgrad(dy, x, padding=1)
    g.conv_dgrad(dy, dw, padding=1, dx_dims=[1, 4, 6, 6]).set_output(True)
    graphs.append(g)
    return graphs


@pytest.mark.parametrize("g", every_op_graph(), ids=lambda g: g.name)
def test_builder_documents_meet_the_schema(g: dt.Graph) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    g.validate()
    doc = g.to_dict()
    jsonschema.validate(doc, load_schema())
    assert dt.Graph.from_json(doc).to_dict() == doc


def test_schema_rejects_a_broken_document() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(DOCUMENTS[0].read_text())
    doc["tensors"][0]["dims"] = [0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema())
    doc = json.loads((HERE / "data" / "hipdnn_conv_fwd.json").read_text())
    del doc["nodes"][0]["parameters"]["stride"]
    with pytest.raises(jsonschema.ValidationError, match=r"'stride' is a required property"):
        jsonschema.validate(doc, load_schema())
