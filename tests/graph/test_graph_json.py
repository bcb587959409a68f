"""hipDNN JSON: exact round trips, hipDNN-written documents, and errors that name the path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict

DATA = Path(__file__).parent / "data"
HIPDNN_DOCS = sorted(DATA.glob("hipdnn_*.json"))
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "graphs").glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def key_order(value: Any) -> Any:
    """The document with every object turned into a list of (key, value) pairs, in order."""
    if isinstance(value, dict):
        return [(k, key_order(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [key_order(v) for v in value]
    return value


def format_error(doc: Any) -> dt.GraphFormatError:
    with pytest.raises(dt.GraphFormatError) as info:
        dt.Graph.from_json(doc)
    return info.value


# ---- round trips ----------------------------------------------------------------------------
def test_there_are_examples_and_fixtures() -> None:
    assert len(EXAMPLES) >= 14
    assert len(HIPDNN_DOCS) >= 5


@pytest.mark.parametrize("path", EXAMPLES + HIPDNN_DOCS, ids=lambda p: p.name)
def test_round_trip_is_exact(path: Path) -> None:
    doc = load(path)
    g = dt.Graph.load(path)
    out = g.to_dict()
    assert out == doc
    assert key_order(out) == key_order(doc)
    # ... and stays exact after a save/load cycle of our own
    again = dt.Graph.from_json(g.to_json())
    assert again.to_dict() == doc
    assert again.key() == g.key()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_files_are_what_to_json_writes(path: Path) -> None:
    g = dt.Graph.load(path)
    assert g.to_json() + "\n" == path.read_text()


@pytest.mark.parametrize("path", EXAMPLES + HIPDNN_DOCS, ids=lambda p: p.name)
def test_loaded_graph_validates_again(path: Path) -> None:
    g = dt.Graph.load(path)
    assert g.is_validated
    g.validate()
    assert g.nodes and all(t.data_type is not None for t in g.tensors)


def test_builder_graph_round_trip_and_key() -> None:
    g = dt.Graph(name="mm", io_data_type=dt.DataType.HALF, compute_data_type=dt.DataType.FLOAT)
    a = g.tensor("A", [2, 4, 8])
    b = g.tensor("B", [2, 8, 16], [128, 1, 8])
    c = g.matmul(a, b, name="mm")
    c = g.pointwise(c, 0.5, mode=dt.PointwiseMode.MUL, name="scale")
    c.set_output(True)
    g.validate()
    doc = g.to_dict()
    h = dt.Graph.from_json(json.loads(json.dumps(doc)))
    assert h.to_dict() == doc and h.key() == g.key()
    # the scalar became a pass-by-value tensor
    scalar = next(t for t in doc["tensors"] if "value" in t)
    assert scalar["value_type"] == "Float32Value" and scalar["value"] == 0.5


# ---- hipDNN documents -----------------------------------------------------------------------
def test_conv_fixture_details() -> None:
    g = dt.Graph.load(DATA / "hipdnn_conv_fwd.json")
    node = g.nodes[0]
    assert node.compute_data_type is None  # "unset" on the node: the graph type applies
    assert [t.uid for t in g.tensors] == [0, 1, 2]  # uids may start at 0
    assert node.outputs["y_tensor_uid"] is g.tensors[0] and g.tensors[0].is_output
    assert g.to_dict()["nodes"][0]["compute_data_type"] == "unset"


def test_sdpa_fixture_causal_band() -> None:
    g = dt.Graph.load(DATA / "hipdnn_sdpa_causal_band.json")
    node = g.nodes[0]
    assert node.params["causal_mask"] is True  # right_bound 0 means causal
    assert node.params["implementation"] == "AUTO" and node.params["mma_core_mode"] == "float"
    written = g.to_dict()["nodes"][0]["attributes"]
    assert written["causal_mask"] is False and written["right_bound"] == 0  # as loaded


def test_sdpa_band_and_flag_share_a_key() -> None:
    band = dt.Graph.load(DATA / "hipdnn_sdpa_causal_band.json")
    g = dt.Graph(
        name="x",
        io_data_type=dt.DataType.BFLOAT16,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    q, k, v = (g.tensor(n, [1, 1, 16, 128]) for n in "qkv")
    (o,) = g.sdpa(q, k, v, causal_mask=True, attn_scale=0.08838834764831845)
    o.set_output(True)
    assert g.key() == band.key()


def test_sorted_hipdnn_serializer_output() -> None:
    path = DATA / "hipdnn_conv_bias_relu_sorted.json"
    g = dt.Graph.load(path)
    assert [n.kind.value for n in g.nodes] == ["conv_fprop", "pointwise", "pointwise"]
    assert g.nodes[2].params["relu_lower_clip"] == 0.0
    bias_out = g.tensor_by_uid(4)
    assert bias_out.data_type is dt.DataType.FLOAT  # "unset" virtual -> intermediate type
    out = g.to_dict()
    assert out["preferred_engine_id"] == 123456789 and out["is_override_shape_enabled"] is False
    assert out["tensors"][4]["data_type"] == "unset"


def test_reduction_and_resample_flat_layout() -> None:
    g = dt.Graph.load(DATA / "hipdnn_resample_reduction.json")
    pool, red = g.nodes
    assert pool.params["mode"] is dt.ResampleMode.MAXPOOL
    assert red.params["mode"] is dt.ReductionMode.MAX  # older upper-case spelling
    assert red.inputs["x_tensor_uid"] is g.tensor_by_uid(1)
    assert red.json_locations["x_tensor_uid"] == ("", "in_tensor_uid")


def test_layernorm_and_batchnorm_fixtures() -> None:
    ln = dt.Graph.load(DATA / "hipdnn_layernorm_training.json").nodes[0]
    assert ln.params["forward_phase"] is dt.NormFwdPhase.TRAINING  # written as 2
    assert ln.params["normalized_dim_count"] == 2
    bn = dt.Graph.load(DATA / "hipdnn_batchnorm_training.json")
    eps = bn.tensor_by_uid(13)
    assert eps.is_scalar and eps.data_type is dt.DataType.FLOAT and eps.value == 1e-05
    assert bn.to_dict()["tensors"][3]["data_type"] == "unset"


def test_builder_output_uses_hipdnn_layouts() -> None:
    g = dt.Graph(name="x", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [1, 4, 8, 8])
    y = g.resample(x, mode=dt.ResampleMode.MAXPOOL, window=2)
    y = g.reduction(y, mode=dt.ReductionMode.MAX, axes=[1])
    y = g.pointwise(y, mode=dt.PointwiseMode.MAX.__class__.RELU_FWD)
    y.set_output(True)
    pool, red, relu = g.to_dict()["nodes"]
    assert pool["resample_mode"] == "maxpool" and pool["padding_mode"] == "neg_inf_pad"
    assert pool["x_tensor_uid"] == 0 and "inputs" not in pool
    assert red["mode"] == "max" and red["in_tensor_uid"] == pool["y_tensor_uid"]
    assert relu["inputs"]["operation"] == "relu_fwd" and relu["inputs"]["relu_upper_clip"] is None
    assert relu["inputs"]["axis_tensor_uid"] is None and relu["inputs"]["in_1_tensor_uid"] is None


def test_norm_layouts_written() -> None:
    g = dt.Graph(name="x", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 8])
    s = g.tensor("S", [1, 8])
    (y,) = g.layernorm(x, s, s)
    (z,) = g.rmsnorm(y, s)
    z.set_output(True)
    ln, rms = g.to_dict()["nodes"]
    assert ln["forward_phase"] == 1 and ln["normalized_dim_count"] == 1
    assert ln["outputs"] == {
        "y_tensor_uid": y.uid,
        "mean_tensor_uid": None,
        "inv_variance_tensor_uid": None,
    }
    assert rms["forward_phase"] == "INFERENCE" and "normalized_dim_count" not in rms
    assert rms["outputs"] == {"y_tensor_uid": z.uid}


def test_older_dnntune_layout_still_loads() -> None:
    """Parameters in a "parameters" object (dnntune 0.0's writer) are found and kept there."""
    doc = {
        "name": "old",
        "compute_data_type": "float",
        "io_data_type": "float",
        "intermediate_data_type": "float",
        "tensors": [
            {
                "uid": 1,
                "name": "x",
                "dims": [4],
                "strides": [1],
                "data_type": "float",
                "virtual": False,
            },
            {
                "uid": 2,
                "name": "y",
                "dims": [4],
                "strides": [1],
                "data_type": "float",
                "virtual": False,
            },
        ],
        "nodes": [
            {
                "name": "relu",
                "type": "PointwiseAttributes",
                "inputs": {"in_0_tensor_uid": 1},
                "outputs": {"out_0_tensor_uid": 2},
                "parameters": {"operation": "RELU_FWD", "relu_upper_clip": 6},
            }
        ],
    }
    g = dt.Graph.from_json(copy.deepcopy(doc))
    assert g.nodes[0].params["relu_upper_clip"] == 6.0
    assert g.to_dict() == doc


def test_edits_after_load_are_written() -> None:
    g = dt.Graph.load(DATA / "hipdnn_conv_fwd.json")
    g.tensors[1].set_name("renamed")
    g.nodes[0].params["stride"] = [2, 2]
    g.nodes[0].compute_data_type = dt.DataType.FLOAT
    g.tensors[0].set_dims([16, 16, 8, 8]).set_strides([1024, 64, 8, 1])
    g.validate()
    out = g.to_dict()
    assert out["tensors"][1]["name"] == "renamed"
    assert out["nodes"][0]["parameters"]["stride"] == [2, 2]
    assert out["nodes"][0]["compute_data_type"] == "float"
    assert dt.Graph.from_json(out).key() == g.key()


def test_pass_by_value_types() -> None:
    doc = load(DATA / "hipdnn_layernorm_training.json")
    doc["tensors"][3].update(value_type="Float16Value", data_type="unset")
    g = dt.Graph.from_json(copy.deepcopy(doc))
    assert g.tensor_by_uid(3).data_type is dt.DataType.HALF
    assert g.to_dict() == doc
    doc["tensors"][3]["value_type"] = "Float8Value"
    assert format_error(doc).json_path == "tensors[3].value_type"
    doc["tensors"][3].update(value_type="Int32Value", value=1.5)
    assert format_error(doc).json_path == "tensors[3].value"
    del doc["tensors"][3]["value_type"]
    assert "tensors[3].value_type: required field missing" in str(format_error(doc))


def test_validate_false_defers_checks() -> None:
    doc = load(DATA / "hipdnn_conv_fwd.json")
    doc["tensors"][2]["dims"] = [16, 5, 3, 3]  # 16 channels are not a multiple of 5
    g = graph_from_dict(copy.deepcopy(doc), OpGraph, validate=False)
    with pytest.raises(
        dt.InvalidValueError, match=r"input channels 16 are not a multiple of filter channels 5"
    ):
        g.validate()


# ---- errors ---------------------------------------------------------------------------------
def three_node_doc() -> dict[str, Any]:
    doc = load(DATA / "hipdnn_conv_bias_relu_sorted.json")
    doc["nodes"] = [doc["nodes"][1], doc["nodes"][2], doc["nodes"][0]]
    return doc


def test_undefined_uid_names_the_path(tmp_path: Path) -> None:
    doc = three_node_doc()
    doc["nodes"][2]["inputs"]["w_tensor_uid"] = 7
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(dt.GraphFormatError) as info:
        dt.Graph.load(path)
    assert info.value.json_path == "nodes[2].inputs.w_tensor_uid"
    assert str(info.value).startswith("nodes[2].inputs.w_tensor_uid: tensor uid 7 not defined")
    assert str(path) in str(info.value)
    uids = sorted(t["uid"] for t in doc["tensors"])
    assert uids == list(range(uids[0], uids[-1] + 1))  # what the next line says, as a range
    assert f"(its tensors have uids {uids[0]}-{uids[-1]})" in str(info.value)


def test_the_defined_uids_are_listed_as_ranges() -> None:
    from dnntune.graph.json_nodes import _defined_uids

    assert _defined_uids({}) == "the graph has no tensors"
    assert _defined_uids({3: None}) == "its tensors have uid 3"
    listed = _defined_uids(dict.fromkeys([0, 1, 2, 5, 7, 8, 100]))
    assert listed == "its tensors have uids 0-2, 5, 7-8, 100"
    assert _defined_uids(dict.fromkeys(range(0, 200, 2))).endswith(", 46, ...")


def test_graph_load_is_validated_with_paths() -> None:
    doc = load(DATA / "hipdnn_conv_fwd.json")
    doc["tensors"][2]["dims"] = [16, 5, 3, 3]
    err = format_error(doc)
    assert err.json_path == "nodes[0].inputs.w_tensor_uid"
    assert "node 'conv_fprop_node' (conv_fprop): w_tensor_uid" in str(err)


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (lambda d: d.pop("nodes"), "nodes", "required field missing"),
        (lambda d: d.update(tensors={}), "tensors", "expected a list of tensors"),
        (lambda d: d.update(io_data_type="float17"), "io_data_type", "unknown data type"),
        (
            lambda d: d["tensors"][1]["dims"].__setitem__(2, "16"),
            "tensors[1].dims[2]",
            "expected an integer >= 1",
        ),
        (
            lambda d: d["tensors"][1]["dims"].__setitem__(0, -16),
            "tensors[1].dims[0]",
            "an integer >= 1 must be between 1",
        ),
        (lambda d: d["tensors"][1]["dims"].__setitem__(0, 0), "tensors[1].dims[0]", ">= 1"),
        (lambda d: d["tensors"][1].update(dims=[]), "tensors[1].dims", "at least one dim"),
        (lambda d: d["tensors"][1]["strides"].pop(), "tensors[1].strides", "3 strides for 4"),
        (
            lambda d: d["tensors"][1]["strides"].__setitem__(0, -1),
            "tensors[1].strides[0]",
            "integer >= 0",
        ),
        (lambda d: d["tensors"][1].update(virtual="no"), "tensors[1].virtual", "true or false"),
        (lambda d: d["tensors"][1].update(uid=True), "tensors[1].uid", "integer uid"),
        (lambda d: d["tensors"][1].update(uid=2), "tensors[2].uid", "duplicate tensor uid 2"),
        (lambda d: d["tensors"][1].pop("name"), "tensors[1].name", "required field missing"),
        (lambda d: d["tensors"].append(7), "tensors[3]", "expected a tensor object, got int"),
        (
            lambda d: d["nodes"][0].update(type="FooAttributes"),
            "nodes[0].type",
            "unsupported node type 'FooAttributes'",
        ),
        (lambda d: d["nodes"][0].pop("name"), "nodes[0].name", "required field missing"),
        (lambda d: d["nodes"][0].update(inputs=[1, 2]), "nodes[0].inputs", "expected an object"),
        (
            lambda d: d["nodes"][0]["inputs"].update(x_tensor_uid="1"),
            "nodes[0].inputs.x_tensor_uid",
            "expected a tensor uid",
        ),
        (
            lambda d: d["nodes"][0]["parameters"].update(conv_mode="SIDEWAYS"),
            "nodes[0].parameters.conv_mode",
            "unknown ConvMode 'SIDEWAYS'",
        ),
        (
            lambda d: d["nodes"][0]["parameters"].update(stride=[1, "1"]),
            "nodes[0].parameters.stride",
            "expected a list of integers",
        ),
        (
            lambda d: d["nodes"][0]["parameters"].update(stride=[1, 0]),
            "nodes[0].parameters.stride",
            "every value must be >= 1",
        ),
        (
            lambda d: d["nodes"][0]["parameters"].update(pre_padding=[1]),
            "nodes[0].parameters.pre_padding",
            "expected 2 values",
        ),
        (
            lambda d: d["nodes"][0]["inputs"].update(z_tensor_uid=1),
            "nodes[0].inputs.z_tensor_uid",
            "unsupported field",
        ),
        (
            lambda d: d["nodes"][0]["inputs"].pop("x_tensor_uid"),
            "nodes[0].inputs.x_tensor_uid",
            "required input missing",
        ),
        (
            lambda d: d["nodes"][0].update(compute_data_type=3),
            "nodes[0].compute_data_type",
            "expected a data type string",
        ),
        (
            lambda d: d["nodes"].append(d["nodes"][0]),
            "nodes[1].outputs.y_tensor_uid",
            "already written by node",
        ),
        (lambda d: d["tensors"][0].update(strides=[0, 0, 0, 0]), "tensors[0].strides", "overlap"),
        (
            lambda d: d["tensors"][1].update(data_type="int32"),
            "nodes[0].inputs.x_tensor_uid",
            "must be floating point",
        ),
        (lambda d: d["tensors"][0].update(virtual=True), "tensors[0].virtual", "never read"),
    ],
)
def test_format_errors_name_the_path(edit, path: str, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = load(DATA / "hipdnn_conv_fwd.json")
    edit(doc)
    err = format_error(doc)
    assert err.json_path == path, str(err)
    assert message in str(err)


def test_document_level_errors() -> None:
    assert "must be a JSON object, got list" in str(format_error([1, 2]))
    with pytest.raises(dt.GraphFormatError, match=r"invalid JSON at line 1 column 2"):
        dt.Graph.from_json("{nope")
    # the decoder's "Unterminated string starting at" dangled (new-user audit, session 55)
    with pytest.raises(
        dt.GraphFormatError, match=r"column 10: Unterminated string starting there$"
    ):
        dt.Graph.from_json('{"name": "cut off')
    with pytest.raises(dt.GraphFormatError, match=r"has no nodes"):
        dt.Graph.from_json(
            {
                "name": "",
                "compute_data_type": "float",
                "io_data_type": "float",
                "intermediate_data_type": "float",
                "tensors": [],
                "nodes": [],
            }
        )


def test_unmodeled_hipdnn_fields_must_be_unset() -> None:
    doc = load(DATA / "hipdnn_sdpa_causal_band.json")
    doc["nodes"][0]["inputs"]["scale_tensor_uid"] = 0
    err = format_error(doc)
    assert err.json_path == "nodes[0].inputs.scale_tensor_uid"
    assert "dnntune does not support scale_tensor_uid" in str(err)
    doc = load(DATA / "hipdnn_batchnorm_training.json")
    doc["nodes"][0]["inputs"]["peer_stats_tensor_uid"] = [10]
    assert format_error(doc).json_path == "nodes[0].inputs.peer_stats_tensor_uid"


def test_sdpa_attribute_errors_have_paths() -> None:
    doc = load(DATA / "hipdnn_sdpa_causal_band.json")
    doc["nodes"][0]["attributes"]["left_bound"] = 32
    err = format_error(doc)
    assert err.json_path == "nodes[0].attributes.left_bound"
    assert "sliding-window" in str(err)


def test_missing_file_is_invalid_value(tmp_path: Path) -> None:
    with pytest.raises(dt.InvalidValueError, match=r"cannot read graph file"):
        dt.Graph.load(tmp_path / "missing.json")


def test_save_and_load(tmp_path: Path) -> None:
    g = dt.Graph.load(EXAMPLES[0])
    g.save(tmp_path / "g.json")
    assert (tmp_path / "g.json").read_text() == EXAMPLES[0].read_text()
