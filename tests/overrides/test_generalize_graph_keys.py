"""Generalizing the batch (``overrides generalize``, ``merge --wildcard batch``) collapses the
entries of one graph at several batch sizes, and only those: two graphs that share a core node
(the same X and W, another stride or another epilogue) keep the entry ``tune`` wrote for each.
Before, the merge key ignored the graph, and one graph's tuned choice was silently lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from overrides_helpers import conv_bias_relu_graph, write_winner
from typer.testing import CliRunner

import dnntune as dt
from dnntune.overrides.batch import BATCH_FREE_KEY_FIELD, batch_free_graph_key, batch_tensors
from dnntune.overrides.merge import merge_files
from dnntune.overrides.policy import match_override_file

F = dt.DataType.FLOAT


def conv(n: int = 1, stride: int = 1) -> dt.Graph:
    g = dt.Graph(name=f"conv_n{n}_s{stride}", io_data_type=F, compute_data_type=F)
    x = g.tensor(name="X", dims=[n, 8, 8, 8])
    w = g.tensor(name="W", dims=[8, 8, 3, 3])
    g.conv_fprop(x, w, padding=1, stride=stride).set_output(True)
    g.validate()
    return g


def _entries(path: Path) -> list[dict]:  # type: ignore[type-arg]
    entries: list[dict] = json.loads(path.read_text())["engine_overrides"]  # type: ignore[type-arg]
    return entries


def _engines(path: Path) -> list[str]:
    return [e["engine_name"] for e in _entries(path)]


def test_the_writer_records_the_batch_free_key() -> None:
    one, eight, stride2 = conv(1), conv(8), conv(1, stride=2)
    assert dt.Graph.key(one) != dt.Graph.key(eight)
    assert batch_free_graph_key(one) == batch_free_graph_key(eight)
    assert batch_free_graph_key(one) != batch_free_graph_key(stride2)
    assert batch_free_graph_key(conv_bias_relu_graph(1)) == batch_free_graph_key(
        conv_bias_relu_graph(8)
    )
    assert batch_free_graph_key(conv_bias_relu_graph(1)) != batch_free_graph_key(one)


def test_the_batch_tensors_follow_the_batch_not_the_size_1_dims() -> None:
    for n in (1, 8):
        g = conv_bias_relu_graph(n)
        names = {t.name for t in batch_tensors(g) or []}
        assert "X" in names and "B" not in names and "W" not in names
        # the conv output and the epilogue's carry it, at batch 1 too
        assert len(names) == 4, names


def test_generalize_keeps_graphs_that_differ_beyond_the_batch_apart(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv(1, stride=1), path, "S1")
    write_winner(conv(1, stride=2), path, "S2")
    assert _engines(path) == ["S1", "S2"]  # tune keeps them apart (graph_key)
    report = merge_files([path], path, wildcard_batch=True)
    assert _engines(path) == ["S1", "S2"]
    assert report.replaced == 0 and not report.conflicts
    assert all(e["tensors"][0]["dim"][0] == -1 for e in _entries(path))
    # each graph, at any batch size, reads its own entry back
    for stride, engine in ((1, "S1"), (2, "S2")):
        for n in (1, 4):
            found = match_override_file(conv(n, stride), path)
            assert found is not None and found[0].entry.engine_name == engine, (n, stride)


def test_generalize_still_collapses_one_graph_at_several_batch_sizes(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv(1), path, "S1_N1")
    write_winner(conv(1, stride=2), path, "S2_N1")
    write_winner(conv(8), path, "S1_N8")
    write_winner(conv(8, stride=2), path, "S2_N8")
    write_winner(conv_bias_relu_graph(1), path, "CBR_N1")
    write_winner(conv_bias_relu_graph(8), path, "CBR_N8")
    report = merge_files([path], path, wildcard_batch=True)
    # a later entry wins on one problem, in the earlier one's place
    assert _engines(path) == ["S1_N8", "S2_N8", "CBR_N8"]
    # entries that really are one problem, with other engines: conflicts, as before
    assert {(c.kept_engine, c.dropped_engine) for c in report.conflicts} == {
        ("S1_N8", "S1_N1"),
        ("S2_N8", "S2_N1"),
        ("CBR_N8", "CBR_N1"),
    }
    assert report.replaced == 3


def test_entries_without_the_batch_free_key_are_never_merged_into_another_graphs(
    tmp_path: Path,
) -> None:
    """A file written before the key was recorded: its entries keep their graph keys, so a
    generalized entry loses no other graph's choice (the same graph's other batch sizes are
    kept too, with their own graph key: the reader takes each graph's own)."""
    path = tmp_path / "o.json"
    write_winner(conv(1, stride=1), path, "S1")
    write_winner(conv(1, stride=2), path, "S2")
    write_winner(conv(8, stride=1), path, "S1_N8")
    doc = json.loads(path.read_text())
    for entry in doc["engine_overrides"]:
        del entry["autotune_metadata"][BATCH_FREE_KEY_FIELD]
    path.write_text(json.dumps(doc))
    report = merge_files([path], path, wildcard_batch=True)
    assert _engines(path) == ["S1", "S2", "S1_N8"] and not report.conflicts
    found = match_override_file(conv(1, stride=2), path)
    assert found is not None and found[0].entry.engine_name == "S2"


def test_hand_written_entries_collapse_as_before(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv(1), path, "N1")
    write_winner(conv(8), path, "N8")
    doc = json.loads(path.read_text())
    for entry in doc["engine_overrides"]:
        del entry["autotune_metadata"]
    path.write_text(json.dumps(doc))
    report = merge_files([path], path, wildcard_batch=True)
    assert _engines(path) == ["N8"] and len(report.conflicts) == 1


def test_generalizing_twice_adds_nothing(tmp_path: Path) -> None:
    src, out = tmp_path / "a.json", tmp_path / "out.json"
    write_winner(conv(1), src, "S1")
    write_winner(conv(1, stride=2), src, "S2")
    merge_files([src], out, wildcard_batch=True)
    merge_files([src], out, wildcard_batch=True)  # out's own generalized entries are kept
    assert _engines(out) == ["S1", "S2"]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_cli_generalize_in_place_loses_no_tuned_entry(runner: CliRunner, tmp_path: Path) -> None:
    from dnntune.cli.app import app

    path = tmp_path / "o.json"
    write_winner(conv(1, stride=1), path, "S1")
    write_winner(conv(1, stride=2), path, "S2")
    res = runner.invoke(app, ["overrides", "generalize", str(path)])
    assert res.exit_code == 0, res.output
    assert "none replaced" in res.output
    assert _engines(path) == ["S1", "S2"]
