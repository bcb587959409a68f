"""Hypothesis: corrupted graph documents fail cleanly, and whatever loads round-trips exactly.

Each case takes an example or hipDNN document and applies a few random corruptions (delete a
key, change a value's type, change a number, point a uid elsewhere). Loading (which validates)
must either succeed or raise GraphFormatError (an InvalidValueError naming the JSON path);
anything else is a bug. A document that still loads must be written back unchanged and keep
a computable key.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dnntune as dt

HERE = Path(__file__).parent
DOCS = [
    json.loads(p.read_text())
    for p in sorted((HERE / "data").glob("hipdnn_*.json"))
    + sorted((HERE.parents[1] / "examples" / "graphs").glob("*.json"))
]

Path_ = tuple[Any, ...]

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
    st.sampled_from(["float", "half", "unset", "relu_fwd", "add", "maxpool", "TOP_LEFT", "max_op"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(value: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path to a value inside ``value`` (the root excluded)."""
    out: list[Path_] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(paths(child, (*prefix, key)))
    return out


def parent_of(doc: Any, path: Path_) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def uids(doc: dict[str, Any]) -> list[Any]:
    tensors = doc.get("tensors")
    if not isinstance(tensors, list):
        return []
    return [t["uid"] for t in tensors if isinstance(t, dict) and "uid" in t]


@st.composite
def corrupted(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(DOCS)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        all_paths = paths(doc)
        if not all_paths:
            break
        path = draw(st.sampled_from(all_paths))
        parent = parent_of(doc, path)
        key = path[-1]
        old = parent[key]
        action = draw(st.sampled_from(["delete", "replace", "number", "uid", "uid"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(JSON_VALUES)
        elif action == "number" and isinstance(old, int | float) and not isinstance(old, bool):
            parent[key] = draw(
                st.sampled_from([0, -1, 1, 2, 3, -old, old + 1, old * 2, 2**63, 0.5, float(old)])
            )
        elif action == "uid":
            # point some *_tensor_uid (or a tensor's uid) at another tensor, or at nothing
            uid_paths = [
                p
                for p in all_paths
                if isinstance(p[-1], str) and (p[-1] == "uid" or p[-1].endswith("_tensor_uid"))
            ]
            if uid_paths:
                target = draw(st.sampled_from(uid_paths))
                choices = [*uids(doc), 999, None]
                parent_of(doc, target)[target[-1]] = draw(st.sampled_from(choices))
    return doc


# a corruption may rename a key: Graph.from_json warns of it (tests/graph/test_unknown_fields.py)
@pytest.mark.filterwarnings("ignore::dnntune.UnknownFieldWarning")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted())
def test_corrupted_documents_fail_cleanly_or_round_trip(doc: dict[str, Any]) -> None:
    original = copy.deepcopy(doc)
    try:
        g = dt.Graph.from_json(doc)
    except dt.GraphFormatError as exc:  # loading validates: every problem has a JSON path
        assert isinstance(exc.json_path, str)
        return
    assert doc == original  # loading never mutates the caller's document
    assert g.to_dict() == original
    assert len(g.key()) == 32
    again = dt.Graph.from_json(g.to_json())
    assert again.key() == g.key()


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(DOCS), st.data())
def test_renumbered_uids_keep_the_key(doc: dict[str, Any], data: st.DataObject) -> None:
    """Any injective renumbering of uids (0-based or not) gives the same graph key."""
    old = uids(doc)
    new = data.draw(
        st.lists(
            st.integers(min_value=0, max_value=10_000),
            min_size=len(old),
            max_size=len(old),
            unique=True,
        )
    )
    mapping = dict(zip(old, new, strict=True))
    renamed = copy.deepcopy(doc)
    for t in renamed["tensors"]:
        t["uid"] = mapping[t["uid"]]
        t["name"] = f"t{t['uid']}"

    def remap(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: mapping.get(v, v)
                if k.endswith("_tensor_uid") and isinstance(v, int)
                else remap(v)
                for k, v in value.items()
            }
        return value

    renamed["nodes"] = [remap(n) for n in renamed["nodes"]]
    assert dt.Graph.from_json(renamed).key() == dt.Graph.from_json(doc).key()
