"""``dnntune engines``: the listing, ids in decimal and hex, knobs, applicability with reasons."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import BENCH_FAST, MatmulOnlyEngine, bench_graph_file, pointwise_mul

from dnntune import testing
from dnntune.backend.registry import get_registry


@pytest.fixture
def test_engine() -> Iterator[MatmulOnlyEngine]:
    engine = MatmulOnlyEngine()
    with get_registry().extra_engines([engine]):
        yield engine


def test_lists_engine_with_ids_and_knobs(cli, test_engine: MatmulOnlyEngine) -> None:
    result = cli("engines")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "TEST_CLI_MATMUL_ONLY" in out
    assert str(test_engine.id) in out
    assert f"0x{test_engine.id & 0xFFFFFFFFFFFFFFFF:016X}" in out
    assert "cli_tests.tile: int, 1..8, default 4" in out
    assert "cli_tests.order: string, {ij, ji}, default ij" in out


def test_json_listing(cli, test_engine: MatmulOnlyEngine) -> None:
    result = cli("engines", "--json")
    assert result.exit_code == 0, result.output
    records = {r["name"]: r for r in json.loads(result.stdout)}
    rec = records["TEST_CLI_MATMUL_ONLY"]
    assert rec["id"] == test_engine.id
    assert rec["provider"] == "cli-tests"
    assert rec["devices"] == ["cpu"]
    assert rec["applies"] is True
    assert {k["id"] for k in rec["knobs"]} == {"cli_tests.tile", "cli_tests.order"}


def test_json_id_hex_is_written_as_bench_results_write_it(cli, tmp_path: Path) -> None:
    """``engines --json`` wrote ``id_hex`` in lower case (``0x0583dac6...``) where bench results
    write the documented ``0x%016X`` (``0x0583DAC6...``): one engine, two spellings."""
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]) as fakes:
        listed = cli("engines", "--json")
        assert listed.exit_code == 0, listed.output
        benched = cli("bench", "-g", str(bench_graph_file(tmp_path)), *BENCH_FAST, "-o", str(out))
        assert benched.exit_code == 0, benched.output
        engine_id = fakes.id(testing.FAKE_ENGINE_C)
    id_hex = {r["name"]: r["id_hex"] for r in json.loads(listed.stdout)}[testing.FAKE_ENGINE_C]
    (row,) = json.loads(out.read_text())["graphs"][0]["results"]
    assert row["engine"]["name"] == testing.FAKE_ENGINE_C
    assert id_hex == row["engine"]["id"] == f"0x{engine_id & 0xFFFFFFFFFFFFFFFF:016X}"


def test_with_graph_says_why_not(cli, test_engine: MatmulOnlyEngine, graph_dir: Path) -> None:
    applies = cli(
        "engines", "--json", "-g", str(graph_dir / "a_mm_bias_relu.json"), "--device", "cpu"
    )
    assert applies.exit_code == 0, applies.output
    rec = {r["name"]: r for r in json.loads(applies.stdout)}["TEST_CLI_MATMUL_ONLY"]
    assert rec["applies"] is True

    not_applies = cli("engines", "-g", str(graph_dir / "b_pw_mul.json"), "--device", "cpu")
    assert not_applies.exit_code == 0, not_applies.output
    assert "runs only matmul graphs" in not_applies.stdout
    assert "applies" in not_applies.stdout


def test_builtin_torch_engine_listed(cli) -> None:
    pytest.importorskip("dnntune.providers.torch_eager")
    result = cli("engines", "--json", "--device", "cpu")
    assert result.exit_code == 0, result.output
    names = {r["name"] for r in json.loads(result.stdout)}
    assert "TORCH_ENGINE" in names


def test_invalid_graph_exits_1(cli, bad_graph: Path) -> None:
    result = cli("engines", "-g", str(bad_graph))
    assert result.exit_code == 1
    assert "nodes[1].inputs.in_1_tensor_uid" in result.stderr


def test_bad_device_is_usage_error(cli) -> None:
    result = cli("engines", "--device", "tpu")
    assert result.exit_code == 2
    assert "tpu" in result.output


def test_directory_with_several_graphs_is_usage_error(cli, graph_dir: Path) -> None:
    result = cli("engines", "-g", str(graph_dir))
    assert result.exit_code == 2
    assert "give one graph file" in result.output


def test_a_graph_name_with_brackets_is_printed_as_it_is(
    cli, test_engine: MatmulOnlyEngine, graph_dir: Path, tmp_path: Path
) -> None:
    """The title named the graph with "[v2]" eaten as markup (audit, session 18)."""
    doc = json.loads((graph_dir / "a_mm_bias_relu.json").read_text())
    doc["name"] = "mm[v2]"
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(doc))
    result = cli("engines", "-g", str(graph), "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "engines for graph 'mm[v2]' on cpu" in result.stdout


def test_a_repeated_graph_option_is_a_usage_error(cli, graph_dir: Path) -> None:
    """`-g a.json -g b.json` answered for b.json alone, without a word (new-user audit)."""
    a, b = graph_dir / "a_mm_bias_relu.json", graph_dir / "b_pw_mul.json"
    result = cli("engines", "-g", str(a), "-g", str(b), "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert "names 2 graphs; give one graph file" in result.output
    assert "'-g' / '--graph'" in result.output


def test_a_graph_no_engine_runs_says_so(cli, tmp_path: Path) -> None:
    """Every row said no, and nothing said that the graph cannot run here (new-user audit)."""
    doc = json.loads(pointwise_mul().to_json())
    for key in ("io_data_type", "intermediate_data_type"):
        doc[key] = "fp8_e4m3"
    for tensor in doc["tensors"]:
        tensor["data_type"] = "fp8_e4m3"
    graph = tmp_path / "fp8.json"
    graph.write_text(json.dumps(doc))
    for extra in ((), ("--json",)):
        result = cli("engines", "-g", str(graph), "--device", "cpu", *extra)
        assert result.exit_code == 0, result.output
        assert "no engine applies to graph 'pw_mul' on cpu" in result.stderr
        assert "no engine applies" not in result.stdout
    records = json.loads(result.stdout)
    assert records and not any(r["applies"] for r in records)
    assert any("fp8" in r["reason"] for r in records)


def test_a_graph_some_engine_runs_has_no_such_line(cli, graph_dir: Path) -> None:
    result = cli("engines", "-g", str(graph_dir / "b_pw_mul.json"), "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "no engine applies" not in result.output
