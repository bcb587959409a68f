"""A key named twice in one object of a graph file is refused, as override files refuse it.

Python's ``json`` kept the last value without a word: the causal SDPA example with a second
``"causal_mask": false`` line ran non-causal attention, and ``Graph.load`` and ``dnntune
validate`` took the file. The error names the file, the object's JSON path, the key and the
line, and says to delete the one not meant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import causal_mask_twice

import dnntune as dt
from dnntune.errors import GraphFormatError
from dnntune.graph.json_format import graph_problems

ROOT = Path(__file__).resolve().parents[2]
CAUSAL = ROOT / "examples" / "graphs" / "llama3_gqa_sdpa_causal.json"


def test_graph_load_refuses_a_key_named_twice(tmp_path: Path) -> None:
    path, where, line = causal_mask_twice(tmp_path)
    with pytest.raises(GraphFormatError) as caught:
        dt.Graph.load(path)
    assert caught.value.json_path == where
    assert str(caught.value) == (
        f'{where}: the key "causal_mask" appears twice (again on line {line}); a reader would '
        f"keep only the last value: delete the one you do not mean (in {path})"
    )


def test_from_json_and_graph_problems_refuse_it_too(tmp_path: Path) -> None:
    path, where, _ = causal_mask_twice(tmp_path)
    text = path.read_text()
    with pytest.raises(GraphFormatError, match='the key "causal_mask" appears twice') as caught:
        dt.Graph.from_json(text)
    assert "(in " not in str(caught.value)  # text given in Python names no file
    (problem,) = graph_problems(text)
    assert problem.json_path == where


def test_a_top_level_key_named_twice_has_no_path_but_its_name() -> None:
    doc = dt.Graph.load(CAUSAL).to_dict()
    text = '{"name": "first",' + json.dumps(doc)[1:]
    with pytest.raises(GraphFormatError) as caught:
        dt.Graph.from_json(text)
    assert caught.value.json_path == ""
    assert str(caught.value).startswith('the key "name" appears twice (again on line 1)')


def test_the_same_key_in_two_objects_is_no_problem() -> None:
    """Every node names ``name``, ``inputs`` and ``outputs``: one each is what the check
    must let through."""
    g = dt.Graph.from_json(CAUSAL.read_text())
    assert any(n.kind.name == "SDPA" for n in g.nodes)
