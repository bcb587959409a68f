"""The graph key: stable under names and uid numbering, different for any change of problem."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.graph import channels_last_strides

F32, F16 = dt.DataType.FLOAT, dt.DataType.HALF
DATA = Path(__file__).parent / "data"


def conv_bias_relu(
    *,
    names: tuple[str, ...] = ("X", "W", "B", "conv", "bias", "relu"),
    uids: tuple[int, int, int] | None = None,
    x_dims: tuple[int, ...] = (2, 16, 8, 8),
    nhwc: bool = False,
    io: dt.DataType = F32,
    stride: int = 1,
    padding: int = 1,
    act: dt.PointwiseMode = dt.PointwiseMode.RELU_FWD,
    bias_strides: list[int] | None = None,
) -> dt.Graph:
    g = dt.Graph(name="any", io_data_type=io, compute_data_type=F32, intermediate_data_type=F32)
    xs = list(x_dims)
    x = g.tensor(names[0], xs, channels_last_strides(xs) if nhwc else None)
    w = g.tensor(names[1], [32, 16, 3, 3])
    b = g.tensor(names[2], [1, 32, 1, 1], bias_strides)
    if uids is not None:
        for t, uid in zip((x, w, b), uids, strict=True):
            t.set_uid(uid)
    y = g.conv_fprop(x, w, padding=padding, stride=stride, name=names[3])
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD, name=names[4])
    y = g.pointwise(y, mode=act, name=names[5])
    y.set_output(True)
    return g


BASE = conv_bias_relu().key()


def test_key_format_and_determinism() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", BASE)
    assert conv_bias_relu().key() == BASE


@pytest.mark.parametrize(
    "variant",
    [
        lambda: conv_bias_relu(names=("in", "filter", "b0", "c", "add", "act")),
        lambda: conv_bias_relu(uids=(100, 7, 42)),
        lambda: conv_bias_relu(uids=(0, 1, 2)),
        lambda: conv_bias_relu(bias_strides=[1, 1, 1, 1]),  # size-1 dims: stride irrelevant
    ],
)
def test_same_problem_same_key(variant: Callable[[], dt.Graph]) -> None:
    assert variant().key() == BASE


@pytest.mark.parametrize(
    "variant",
    [
        lambda: conv_bias_relu(x_dims=(4, 16, 8, 8)),  # dims
        lambda: conv_bias_relu(nhwc=True),  # strides
        lambda: conv_bias_relu(io=F16),  # data type
        lambda: conv_bias_relu(stride=2),  # a parameter
        lambda: conv_bias_relu(padding=0),
        lambda: conv_bias_relu(act=dt.PointwiseMode.GELU_FWD),
    ],
)
def test_changed_problem_changed_key(variant: Callable[[], dt.Graph]) -> None:
    assert variant().key() != BASE


def test_all_variants_distinct() -> None:
    keys = {
        conv_bias_relu(x_dims=(4, 16, 8, 8)).key(),
        conv_bias_relu(nhwc=True).key(),
        conv_bias_relu(io=F16).key(),
        conv_bias_relu(stride=2).key(),
        BASE,
    }
    assert len(keys) == 5


def test_key_survives_json_round_trip(tmp_path: Path) -> None:
    g = conv_bias_relu()
    g.save(tmp_path / "g.json")
    assert dt.Graph.load(tmp_path / "g.json").key() == BASE


def edited(path: str, edit: Callable[[dict[str, Any]], None]) -> str:
    doc = json.loads((DATA / path).read_text())
    edit(doc)
    return dt.Graph.from_json(doc).key()


def test_key_ignores_spelling_of_loaded_documents() -> None:
    base = edited("hipdnn_conv_fwd.json", lambda d: None)

    def explicit_compute(d: dict[str, Any]) -> None:
        d["nodes"][0]["compute_data_type"] = "float"  # "unset" resolves to the graph's

    def unset_tensor_type(d: dict[str, Any]) -> None:
        d["tensors"][1]["data_type"] = "unset"  # resolves to io_data_type "float"

    def default_conv_mode_left_out(d: dict[str, Any]) -> None:
        del d["nodes"][0]["parameters"]["conv_mode"]

    def renumbered(d: dict[str, Any]) -> None:
        for t in d["tensors"]:
            t["uid"] += 10
        node = d["nodes"][0]
        node["inputs"] = {k: v + 10 for k, v in node["inputs"].items()}
        node["outputs"] = {k: v + 10 for k, v in node["outputs"].items()}

    for edit in (explicit_compute, unset_tensor_type, default_conv_mode_left_out, renumbered):
        assert edited("hipdnn_conv_fwd.json", edit) == base, edit.__name__
    assert edited("hipdnn_conv_fwd.json", lambda d: d.update(compute_data_type="half")) != base


def test_sdpa_hints_are_not_part_of_the_key() -> None:
    base = edited("hipdnn_sdpa_causal_band.json", lambda d: None)

    def attrs(**kw: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: d["nodes"][0]["attributes"].update(kw)

    assert edited("hipdnn_sdpa_causal_band.json", attrs(implementation="COMPOSITE")) == base
    assert edited("hipdnn_sdpa_causal_band.json", attrs(mma_core_mode="unset")) == base
    assert edited("hipdnn_sdpa_causal_band.json", attrs(max_seq_len_kv=4096)) == base
    flag = {"causal_mask": True, "left_bound": None, "right_bound": None}
    causal_flag = attrs(**flag)
    assert edited("hipdnn_sdpa_causal_band.json", causal_flag) == base
    assert edited("hipdnn_sdpa_causal_band.json", attrs(right_bound=None)) != base  # not causal
    assert edited("hipdnn_sdpa_causal_band.json", attrs(attn_scale_value=0.5)) != base
    # the diagonal's alignment moves the mask (when Sq != Skv): another problem, another key
    top_left = edited("hipdnn_sdpa_causal_band.json", attrs(diagonal_alignment="TOP_LEFT", **flag))
    bottom = edited(
        "hipdnn_sdpa_causal_band.json", attrs(diagonal_alignment="BOTTOM_RIGHT", **flag)
    )
    assert top_left != bottom
    explicit = edited(
        "hipdnn_sdpa_causal_band.json",
        attrs(causal_mask=False, causal_mask_bottom_right=True, left_bound=None, right_bound=None),
    )
    assert explicit == bottom  # one mask, two spellings: one key


def test_key_of_an_unvalidated_graph_validates_it() -> None:
    g = conv_bias_relu()
    assert not g.is_validated
    g.key()
    assert g.is_validated
    with pytest.raises(dt.InvalidValueError, match=r"has no nodes"):
        dt.Graph(name="empty").key()
