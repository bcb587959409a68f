"""Keys of a graph document that dnntune does not read are listed (``unknown_fields``).

The reader keeps such keys for the round trip, and ignoring them was silent: an SDPA node's
``casual_mask`` (for ``causal_mask``) ran non-causal attention, an RMS norm's
``forwad_phase`` ran inference and a conv's ``strides`` ran stride 1, and ``dnntune
validate`` said ok (CLI audit). Every key the writer writes must be known, so that no file
dnntune writes is reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_graph_schema import every_op_graph

import dnntune as dt
from dnntune.graph.json_format import graph_from_dict, graph_to_dict
from dnntune.graph.json_unknown import UnknownField, unknown_fields, unknown_fields_note

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "graphs").glob("*.json"))
HIPDNN_FILES = sorted((Path(__file__).parent / "data").glob("*.json"))
SUITE = sorted((ROOT / "benchmarks" / "suite").glob("*.json"))


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "examples" / "graphs" / name).read_text())
    return doc


def _rename(box: dict[str, Any], old: str, new: str) -> None:
    """Rename a key in place, keeping its position (as an editor's typo would)."""
    items = [(new if k == old else k, v) for k, v in box.items()]
    box.clear()
    box.update(items)


def _node(doc: dict[str, Any], json_type: str) -> dict[str, Any]:
    node: dict[str, Any] = next(n for n in doc["nodes"] if n["type"] == json_type)
    return node


@pytest.mark.parametrize("path", EXAMPLES + HIPDNN_FILES, ids=lambda p: p.name)
def test_what_dnntune_writes_and_hipdnn_files_hold_is_known(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert unknown_fields(doc) == []
    written = graph_to_dict(graph_from_dict(doc, dt.Graph))
    assert unknown_fields(written) == []
    # written fresh (as the builder's graphs are), every key hipDNN's reader requires included
    fresh = dt.Graph.from_json(json.dumps(doc))
    for node in fresh.nodes:
        node.json_source = None
    for t in fresh.tensors:
        t._json_source = None
    fresh.json_source = None
    assert unknown_fields(graph_to_dict(fresh)) == []


def test_the_benchmark_suites_comments_are_known() -> None:
    """Each suite graph says where its shape comes from in a top-level ``comment``: reported
    as unknown, `dnntune validate -g benchmarks/suite` said "0 valid, 46 invalid" and every
    bench of the suite warned once per graph."""
    assert len(SUITE) > 40
    commented = [p for p in SUITE if "comment" in json.loads(p.read_text())]
    assert len(commented) > 40
    for path in SUITE:
        assert unknown_fields(json.loads(path.read_text())) == [], path.name
    doc = _doc("llama_rmsnorm.json")
    doc["comment"] = "a note"
    doc["coment"] = "a misspelled one is still reported"
    assert [u.json_path for u in unknown_fields(doc)] == ["coment"]
    assert graph_to_dict(graph_from_dict(doc, dt.Graph))["comment"] == "a note"


@pytest.mark.parametrize("g", every_op_graph(), ids=lambda g: g.name)
def test_what_the_builder_writes_is_known(g: dt.Graph) -> None:
    """Every op's fresh layout (batch-norm backward is in no example file), with the optional
    tensors and parameters set that the examples leave out."""
    g.validate()
    assert unknown_fields(g.to_dict()) == []


def test_a_misspelled_sdpa_causal_mask_is_named_with_the_key_meant() -> None:
    doc = _doc("llama3_gqa_sdpa_causal.json")
    node = _node(doc, "SdpaAttributes")
    _rename(node["attributes"], "causal_mask", "casual_mask")
    index = doc["nodes"].index(node)
    (found,) = unknown_fields(doc)
    assert found == UnknownField(
        json_path=f"nodes[{index}].attributes.casual_mask",
        key="casual_mask",
        owner=f"node {node['name']!r} (SdpaAttributes)",
        suggestion="causal_mask",
    )
    assert str(found) == (
        f"nodes[{index}].attributes.casual_mask: unknown field of node {node['name']!r} "
        "(SdpaAttributes), ignored; did you mean 'causal_mask'?"
    )
    # what it silently meant: the graph still loads, non-causal
    graph = graph_from_dict(doc, dt.Graph)
    assert not graph.nodes[index].params["causal_mask"]


def test_misspelled_norm_phase_and_conv_stride() -> None:
    norm = _doc("llama_rmsnorm.json")
    _rename(_node(norm, "RMSNormAttributes"), "forward_phase", "forwad_phase")
    assert [(u.key, u.suggestion) for u in unknown_fields(norm)] == [
        ("forwad_phase", "forward_phase")
    ]
    conv = _doc("resnet50_conv3x3_bias_relu_nchw.json")
    _rename(_node(conv, "ConvolutionFwdAttributes")["parameters"], "stride", "strides")
    (found,) = unknown_fields(conv)
    assert found.json_path == "nodes[0].parameters.strides"
    assert found.suggestion == "stride"


def test_document_and_tensor_keys_and_a_misspelled_section() -> None:
    doc = _doc("resnet50_conv3x3_bias_relu_nchw.json")
    _rename(doc, "io_data_type", "io_datatype")
    _rename(doc["tensors"][1], "virtual", "virtul")
    doc["tensors"][1]["note"] = "mine"
    doc["nodes"][0]["parametrs"] = {"stride": [2, 2]}
    found = [(u.json_path, u.owner, u.suggestion) for u in unknown_fields(doc)]
    tensor = f"tensor {doc['tensors'][1]['name']!r}"
    assert found == [
        ("io_datatype", "the graph", "io_data_type"),
        ("tensors[1].virtul", tensor, "virtual"),
        ("tensors[1].note", tensor, None),
        (
            "nodes[0].parametrs",
            f"node {doc['nodes'][0]['name']!r} (ConvolutionFwdAttributes)",
            "parameters",
        ),
    ]
    assert str(unknown_fields(doc)[2]) == f"tensors[1].note: unknown field of {tensor}, ignored"


def test_keys_the_reader_takes_anywhere_are_not_reported() -> None:
    """The reader finds a parameter outside its own section (the older everything-under-
    ``parameters`` layout, the node object itself): such a key is read, so it is known."""
    doc = _doc("llama3_gqa_sdpa_causal.json")
    node = _node(doc, "SdpaAttributes")
    node["parameters"] = {"causal_mask": node["attributes"].pop("causal_mask")}
    assert unknown_fields(doc) == []
    assert graph_from_dict(doc, dt.Graph).nodes[doc["nodes"].index(node)].params["causal_mask"]


def test_parts_the_reader_refuses_are_left_to_their_own_problem() -> None:
    doc = _doc("resnet50_conv3x3_bias_relu_nchw.json")
    doc["tensors"].append(7)
    doc["nodes"].append({"type": "NoSuchAttributes", "name": "x", "wat": 1})
    doc["nodes"].append("not a node")
    assert unknown_fields(doc) == []
    assert unknown_fields([1, 2]) == []


def test_the_note_is_one_line_for_one_field_and_a_line_each_for_more() -> None:
    doc = _doc("resnet50_conv3x3_bias_relu_nchw.json")
    doc["nme"] = "x"
    one = unknown_fields(doc)
    assert unknown_fields_note("g.json", one) == (
        "g.json: nme: unknown field of the graph, ignored; did you mean 'name'?"
    )
    doc["tensors"][0]["dim"] = [1]
    two = unknown_fields(doc)
    assert unknown_fields_note("g.json", two).splitlines() == [
        "g.json: 2 unknown fields:",
        "  nme: unknown field of the graph, ignored; did you mean 'name'?",
        f"  tensors[0].dim: unknown field of tensor {doc['tensors'][0]['name']!r}, ignored; "
        "did you mean 'dims'?",
    ]
