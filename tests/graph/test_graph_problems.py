"""``graph_problems`` / ``OpGraph.problems``: every problem of a document, not only the first.

The invariant that keeps the two readers honest: a document has no problems exactly when it
loads, and when it does not load, the first problem listed is the error loading raises.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from test_graph_json_fuzz import DOCS, corrupted

import dnntune as dt
from dnntune.graph.json_format import graph_problems


# a corruption may rename a key: Graph.from_json warns of it (tests/graph/test_unknown_fields.py)
@pytest.mark.filterwarnings("ignore::dnntune.UnknownFieldWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted())
def test_problems_agree_with_loading(doc: dict[str, Any]) -> None:
    original = copy.deepcopy(doc)
    problems = graph_problems(doc, dt.Graph)
    assert doc == original  # listing problems never mutates the document
    try:
        dt.Graph.from_json(doc)
    except dt.GraphFormatError as exc:
        assert problems, "loading failed but no problem was listed"
        assert str(problems[0]) == str(exc)
        assert all(isinstance(p.json_path, str) for p in problems)
        assert len({str(p) for p in problems}) == len(problems)  # nothing said twice
    else:
        assert problems == []


def test_valid_documents_have_no_problems() -> None:
    for doc in DOCS:
        assert graph_problems(json.dumps(doc), dt.Graph) == []


def test_independent_problems_are_all_listed() -> None:
    doc = copy.deepcopy(DOCS[0])
    doc["name"] = 3
    doc["tensors"][0]["virtual"] = "no"
    doc["nodes"][0]["type"] = "NoSuchAttributes"
    paths = [p.json_path for p in graph_problems(doc, dt.Graph)]
    assert paths == ["name", "tensors[0].virtual", "nodes[0].type"]


def test_invalid_json_is_one_problem() -> None:
    (problem,) = graph_problems('{"name": ', dt.Graph)
    assert problem.problem.startswith("invalid JSON at line 1")
