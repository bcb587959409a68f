"""The graph files training records point to are read as every graph reader reads them."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import causal_mask_twice

from dnntune.graph.ir import OpGraph
from dnntune.learning.graph_index import GraphIndex

CAUSAL = Path(__file__).resolve().parents[2] / "examples" / "graphs" / "llama3_gqa_sdpa_causal.json"


def test_a_graph_naming_a_key_twice_is_no_training_data(tmp_path: Path) -> None:
    """It was parsed with Python's json, which keeps the last value: records pointing to the
    causal example with a second "causal_mask": false line were learned as non-causal
    attention (helper audit, session 61)."""
    twice, _, _ = causal_mask_twice(tmp_path)
    index = GraphIndex([tmp_path])
    assert index.load(twice) is None
    assert index.resolve("twice.json", tmp_path) is None
    sound = GraphIndex([CAUSAL])
    assert isinstance(sound.load(CAUSAL), OpGraph)
    assert isinstance(sound.resolve(CAUSAL.name, tmp_path), OpGraph)
