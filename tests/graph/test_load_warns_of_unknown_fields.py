"""``Graph.load`` and ``Graph.from_json`` warn of keys dnntune does not read, as ``dnntune run``
does: the Python API took a misspelled key without a word (the causal SDPA example with
``casual_mask`` loaded as non-causal attention), where ``dnntune validate`` refused the file
and ``run``, ``tune`` and ``bench`` warned of it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.errors import GraphFormatError

ROOT = Path(__file__).resolve().parents[2]
CAUSAL = ROOT / "examples" / "graphs" / "llama3_gqa_sdpa_causal.json"


def _casual(tmp_path: Path) -> tuple[Path, dict[str, Any], str]:
    """The causal SDPA example with ``causal_mask`` misspelled: its path, document and the
    warning's text after the source."""
    doc = json.loads(CAUSAL.read_text())
    index = next(i for i, n in enumerate(doc["nodes"]) if n["type"] == "SdpaAttributes")
    attrs = doc["nodes"][index]["attributes"]
    items = [("casual_mask" if k == "causal_mask" else k, v) for k, v in attrs.items()]
    attrs.clear()
    attrs.update(items)
    path = tmp_path / "casual.json"
    path.write_text(json.dumps(doc, indent=2))
    name = doc["nodes"][index]["name"]
    note = (
        f"nodes[{index}].attributes.casual_mask: unknown field of node {name!r} "
        "(SdpaAttributes), ignored; did you mean 'causal_mask'?"
    )
    return path, doc, note


def test_load_warns_naming_the_file_and_the_key(tmp_path: Path) -> None:
    path, _, note = _casual(tmp_path)
    with pytest.warns(dt.UnknownFieldWarning) as caught:
        g = dt.Graph.load(path)
    (w,) = caught
    assert str(w.message) == f"{path}: {note}"
    assert w.filename == __file__  # the caller's line, not dnntune's
    assert len(g.nodes) == 1  # a warning: the graph loads, as `dnntune run` runs it


def test_from_json_warns_for_text_and_for_a_document(tmp_path: Path) -> None:
    _, doc, note = _casual(tmp_path)
    for given in (json.dumps(doc), doc):
        with pytest.warns(dt.UnknownFieldWarning) as caught:
            dt.Graph.from_json(given)
        assert [str(w.message) for w in caught] == [f"Graph.from_json: {note}"]


def test_the_warning_can_be_made_an_error(tmp_path: Path) -> None:
    path, _, _ = _casual(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=dt.UnknownFieldWarning)
        with pytest.raises(dt.UnknownFieldWarning, match="did you mean 'causal_mask'"):
            dt.Graph.load(path)


def test_another_dnntune_file_is_refused_without_a_warning(tmp_path: Path) -> None:
    """Its keys are no graph's: the error says enough (pytest makes a warning an error)."""
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": []}))
    with pytest.raises(GraphFormatError):
        dt.Graph.load(path)


def test_a_file_with_only_known_keys_loads_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt.Graph.load(CAUSAL)
