"""Hypothesis: write -> load -> match round trips, and fuzzed files never crash the policy."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from overrides_helpers import conv_graph, engines, pointwise_graph, write_winner

import dnntune as dt
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.knobs import KnobSetting
from dnntune.overrides.format import load_file
from dnntune.overrides.match import find_match, graph_queries
from dnntune.overrides.policy import ConfigPolicy

CANDIDATES = engines("FAKE_Z", "FAKE_A", "FAKE_B")
HANDLE = dt.create_handle("cpu")
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@contextlib.contextmanager
def _config_path(path: Path) -> Iterator[None]:
    old = os.environ.get("DNNTUNE_HEUR_CONFIG_PATH")
    os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
        else:
            os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = old


shapes = st.integers(1, 5).flatmap(
    lambda rank: st.tuples(
        st.lists(st.integers(1, 64), min_size=rank, max_size=rank),
        st.lists(st.integers(0, 100_000), min_size=rank, max_size=rank),
    )
)
knob_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
knob_lists = st.dictionaries(
    st.from_regex(r"[a-z]{1,6}\.[a-z_]{1,10}", fullmatch=True), knob_values, max_size=5
).map(lambda d: [KnobSetting(k, v) for k, v in d.items()])
modes = st.sampled_from(
    [dt.PointwiseMode.RELU_FWD, dt.PointwiseMode.TANH_FWD, dt.PointwiseMode.EXP]
)


@SETTINGS
@given(shape=shapes, knobs=knob_lists, mode=modes, winner=st.sampled_from(["FAKE_A", "FAKE_B"]))
def test_write_load_match_round_trip(
    tmp_path: Path,
    shape: tuple[list[int], list[int]],
    knobs: list[KnobSetting],
    mode: dt.PointwiseMode,
    winner: str,
) -> None:
    dims, strides = shape
    graph = pointwise_graph(dims, strides, mode)
    path = tmp_path / "round_trip.json"
    write_winner(graph, path, winner, knobs=knobs, delete_all=True)
    with _config_path(path):
        decision = ConfigPolicy().order(graph, HANDLE, CANDIDATES, HeuristicMode.A)
    assert decision is not None
    assert decision.engines[0].name == winner
    assert sorted(e.name for e in decision.engines) == sorted(e.name for e in CANDIDATES)
    got = decision.matched["knob_settings"]
    assert got == knobs
    assert [type(s.value) for s in got] == [type(s.value) for s in knobs]


@SETTINGS
@given(shape=shapes, data=st.data())
def test_wildcards_match_any_value_and_concrete_dims_still_discriminate(
    tmp_path: Path, shape: tuple[list[int], list[int]], data: st.DataObject
) -> None:
    dims, strides = shape
    graph = pointwise_graph(dims, strides)
    path = tmp_path / "wild.json"
    write_winner(graph, path, "FAKE_A", delete_all=True)
    doc = json.loads(path.read_text())
    tensor = doc["engine_overrides"][0]["tensors"][0]
    wild = data.draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
    tensor["dim"] = [-1 if w else d for w, d in zip(wild, dims, strict=True)]
    tensor["stride"] = [-1] * len(dims)
    path.write_text(json.dumps(doc))
    config = load_file(path)
    # any value in a wildcard position still matches
    other = [d + 1 if w else d for w, d in zip(wild, dims, strict=True)]
    assert find_match(config, graph_queries(pointwise_graph(other))) is not None
    # a changed concrete dim does not
    if not all(wild):
        i = wild.index(False)
        changed = list(dims)
        changed[i] += 1
        assert find_match(config, graph_queries(pointwise_graph(changed))) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
entry_keys = st.sampled_from(
    [
        "op",
        "engine_name",
        "criteria",
        "tensors",
        "autotune_metadata",
        "tensor_id",
        "dim",
        "stride",
        "knobs",
        "version",
        "engine_overrides",
    ]
)


def _mutated_document() -> st.SearchStrategy[Any]:
    """A valid v2 document with random values put at random places (the realistic fuzz)."""

    def mutate(base: dict[str, Any], path_choice: int, key: str, value: Any) -> Any:
        entry = base["engine_overrides"][0]
        targets: list[dict[str, Any]] = [
            base,
            entry,
            entry["tensors"][0],
            entry["autotune_metadata"],
        ]
        targets[path_choice % len(targets)][key] = value
        return base

    def base() -> dict[str, Any]:
        return {
            "version": 2,
            "engine_overrides": [
                {
                    "op": "conv_fprop",
                    "engine_name": "FAKE_A",
                    "tensors": [
                        {
                            "tensor_id": "x_tensor_uid",
                            "dim": [2, 8, 8, 8],
                            "stride": [512, 64, 8, 1],
                        },
                        {"tensor_id": "w_tensor_uid", "dim": [16, 8, 3, 3]},
                    ],
                    "autotune_metadata": {"knobs": [{"knob_id": "k", "type": "int", "value": 1}]},
                }
            ],
        }

    return st.builds(
        mutate, st.just(None).map(lambda _: base()), st.integers(0, 3), entry_keys, json_values
    )


@SETTINGS
@given(
    content=st.one_of(
        json_values.map(json.dumps),
        _mutated_document().map(json.dumps),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
        _mutated_document().map(lambda d: json.dumps(d)[: len(json.dumps(d)) // 2]),
    )
)
def test_fuzzed_files_never_crash_the_policy(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fuzz.json"
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    with _config_path(path):
        decision = ConfigPolicy().order(conv_graph(), HANDLE, CANDIDATES, HeuristicMode.A)
    if decision is not None:
        assert sorted(e.name for e in decision.engines) == sorted(e.name for e in CANDIDATES)


def test_binary_garbage_file_declines(tmp_path: Path) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(bytes(range(256)))
    with _config_path(path):
        assert ConfigPolicy().order(conv_graph(), HANDLE, CANDIDATES, HeuristicMode.A) is None


@pytest.mark.parametrize("depth", [5000])
def test_deeply_nested_json_declines(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth)
    with _config_path(path):
        assert ConfigPolicy().order(conv_graph(), HANDLE, CANDIDATES, HeuristicMode.A) is None
