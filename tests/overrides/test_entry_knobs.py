"""An override entry's knobs apply to the graph they were verified on, not to every graph that
shares its core node (an independent audit: a 16-bit-intermediate knob tuned on matmul+ReLU
was applied to matmul+2048-2048 and gave a max abs error of 0.98)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dnntune as dt
from dnntune import reference
from dnntune.backend.engine import engine_id
from dnntune.graph.signature import graph_key
from dnntune.overrides.format import parse_document
from dnntune.overrides.policy import entry_knobs, match_override_file
from dnntune.testing import make_pack

D, P = dt.DataType, dt.PointwiseMode
IO = {"torch.intermediate_type": "io"}


def _graph(offset: float) -> dt.Graph:
    """A half matmul; then ReLU (offset 0) or ``+ offset - offset``, which a 16-bit
    intermediate rounds away (the graph asks for float intermediates)."""
    g = dt.Graph(
        "mm", io_data_type=D.HALF, compute_data_type=D.FLOAT, intermediate_data_type=D.FLOAT
    )
    a = g.tensor("a", [1, 64, 64], data_type=D.HALF)
    b = g.tensor("b", [1, 64, 64], data_type=D.HALF)
    c = g.matmul(a, b)
    if offset:
        c = g.pointwise(g.pointwise(c, offset, mode=P.ADD), offset, mode=P.SUB)
    else:
        c = g.pointwise(c, mode=P.RELU_FWD)
    c.set_output(True)
    return g


@pytest.fixture
def tuned_file(tmp_path: Path) -> Path:
    """Graph A tuned to TORCH_ENGINE with the 16-bit intermediate knob (it passes there)."""
    path = tmp_path / "overrides.json"
    handle = dt.create_handle("cpu")
    g = _graph(0.0)
    g.build_operation_graph(handle)
    g.add_engine_variants([dt.EngineVariant(engine_id("TORCH_ENGINE"), IO)])
    config = dt.AutotuneConfig(ranking_fn=lambda rs: sorted(rs, key=lambda r: not r.knob_settings))
    results = g.autotune(
        handle, make_pack(g), None, 0, config, dt.AutotuneStorageConfig(file_path=str(path))
    )
    assert results[0].engine_name == "TORCH_ENGINE" and results[0].verified
    assert {s.knob_id: s.value for s in results[0].knob_settings} == IO
    return path


def test_the_writer_records_the_graph_the_knobs_were_verified_on(tuned_file: Path) -> None:
    meta = json.loads(tuned_file.read_text())["engine_overrides"][0]["autotune_metadata"]
    assert meta["graph_key"] == graph_key(_graph(0.0))


def test_knobs_apply_to_their_own_graph_only(
    tuned_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(tuned_file))
    handle = dt.create_handle("cpu")
    same = _graph(0.0)
    same.build(handle, [dt.HeuristicMode.A])
    assert same.get_plan_name() == "TORCH_ENGINE[torch.intermediate_type=io]"

    other = _graph(2048.0)  # same core node (the matmul), another epilogue
    other.build(handle, [dt.HeuristicMode.A])
    assert other.get_plan_name() == "TORCH_ENGINE"  # the engine, with its default knobs
    pack = make_pack(other)
    other.execute(handle, pack, None)
    check = reference.check_outputs(other, pack, reference.run(other, pack))
    assert not check.failed, check.message


def test_a_hand_written_entry_without_a_graph_key_keeps_its_knobs() -> None:
    doc = {
        "version": 2,
        "engine_overrides": [
            {
                "op": "matmul",
                "engine_name": "TORCH_ENGINE",
                "tensors": [],
                "autotune_metadata": {
                    "knobs": [
                        {"knob_id": "torch.intermediate_type", "type": "string", "value": "io"}
                    ]
                },
            }
        ],
    }
    entry = parse_document(doc).entries[0]
    assert [s.value for s in entry_knobs(entry, _graph(2048.0))] == ["io"]


def test_two_graphs_sharing_a_core_node_keep_an_entry_each(tmp_path: Path) -> None:
    """Two layers with the same matmul but different epilogues: the second write replaced the
    first's entry (same match key), so each new process took the other's and tuned again."""
    path = tmp_path / "overrides.json"
    handle = dt.create_handle("cpu")
    graphs = {0.0: _graph(0.0), 2048.0: _graph(2048.0)}
    for g in graphs.values():
        g.build_operation_graph(handle)
        g.add_engine(engine_id("TORCH_ENGINE"))
        g.autotune(
            handle, make_pack(g), None, 0, storage_config=dt.AutotuneStorageConfig(str(path))
        )
    entries = json.loads(path.read_text())["engine_overrides"]
    assert sorted(e["autotune_metadata"]["graph_key"] for e in entries) == sorted(
        graph_key(g) for g in graphs.values()
    )
    for g in graphs.values():
        found = match_override_file(g, path)
        assert found is not None
        assert found[0].entry.metadata is not None
        assert found[0].entry.metadata["graph_key"] == graph_key(g)  # its own entry
    again = _graph(0.0)
    again.build_operation_graph(handle)
    again.add_engine(engine_id("TORCH_ENGINE"))
    again.autotune(
        handle, make_pack(again), None, 0, storage_config=dt.AutotuneStorageConfig(str(path))
    )
    assert len(json.loads(path.read_text())["engine_overrides"]) == 2  # replaced, not added
