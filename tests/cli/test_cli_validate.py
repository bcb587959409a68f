"""``dnntune validate``: files, directories, globs; every problem named with its JSON path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import matmul_bias_relu


def test_valid_directory(cli, graph_dir: Path) -> None:
    result = cli("validate", "-g", str(graph_dir))
    assert result.exit_code == 0, result.output
    assert "a_mm_bias_relu.json" in result.stdout
    assert "b_pw_mul.json" in result.stdout
    assert "2 valid, 0 invalid (2 graphs)" in result.stdout


def test_invalid_graph_reports_json_path(cli, bad_graph: Path) -> None:
    result = cli("validate", "-g", str(bad_graph))
    assert result.exit_code == 1
    assert "nodes[1].inputs.in_1_tensor_uid: tensor uid 777 not defined" in result.stderr
    assert str(bad_graph) in result.stderr
    assert "Traceback" not in result.output


def test_every_invalid_graph_is_reported(
    cli, graph_dir: Path, bad_graph: Path, tmp_path: Path
) -> None:
    syntax = tmp_path / "syntax.json"
    syntax.write_text('{"name": "x",\n  "tensors": [}')
    result = cli("validate", "-g", str(graph_dir), str(bad_graph), "-g", str(syntax))
    assert result.exit_code == 1
    assert "tensor uid 777 not defined" in result.stderr
    assert "invalid JSON at line 2" in result.stderr
    assert "2 valid, 2 invalid (4 graphs)" in result.stderr


def test_semantic_error_names_the_node(cli, tmp_path: Path) -> None:
    doc = json.loads(matmul_bias_relu().to_json())
    doc["tensors"][1]["dims"] = [1, 15, 8]  # B no longer matches A's inner dimension
    doc["tensors"][1]["strides"] = [120, 8, 1]
    path = tmp_path / "mismatch.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    assert "nodes[0]" in result.stderr


def test_missing_file_is_usage_error(cli, tmp_path: Path) -> None:
    result = cli("validate", "-g", str(tmp_path / "nope.json"))
    assert result.exit_code == 2
    assert "no such file or directory" in result.output


def test_no_graph_given_is_usage_error(cli) -> None:
    result = cli("validate")
    assert result.exit_code == 2
    assert "give at least one graph path" in result.output


def test_glob_and_duplicates_once(cli, graph_dir: Path) -> None:
    one = graph_dir / "a_mm_bias_relu.json"
    result = cli("validate", "-g", str(graph_dir / "*.json"), str(one), "-g", str(graph_dir))
    assert result.exit_code == 0, result.output
    assert "2 valid, 0 invalid (2 graphs)" in result.stdout
    assert result.stdout.count("a_mm_bias_relu.json") == 1


def test_glob_matching_nothing_is_usage_error(cli, tmp_path: Path) -> None:
    result = cli("validate", "-g", str(tmp_path / "*.json"))
    assert result.exit_code == 2
    assert "no file matches" in result.output


def test_empty_directory_is_usage_error(cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("validate", "-g", str(empty))
    assert result.exit_code == 2
    assert "no *.json graph files" in result.output


def test_binary_file_is_one_invalid_line(cli, graph_dir: Path, tmp_path: Path) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"name": "\xff\xfe\x00\x01')
    result = cli("validate", "-g", str(binary), str(graph_dir))
    assert result.exit_code == 1
    assert "internal error" not in result.output and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if "binary.json" in line]
    assert lines == [
        f"invalid  {binary}: not a UTF-8 text file (byte 0xff at offset 10); "
        "a graph file is JSON text"
    ]
    assert "2 valid, 1 invalid (3 graphs)" in result.stderr


def test_every_problem_of_one_file_is_reported(cli, tmp_path: Path) -> None:
    """Three independent mistakes in the document: three lines, each with its JSON path."""
    doc = json.loads(matmul_bias_relu().to_json())
    doc["tensors"][0]["dims"] = "x"
    doc["tensors"][2]["data_type"] = "quux"
    doc["nodes"][1]["inputs"]["in_1_tensor_uid"] = 777
    path = tmp_path / "three.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("invalid")]
    assert lines == [
        f"invalid  {path}: tensors[0].dims: expected a list of integers, got 'x'",
        f"invalid  {path}: tensors[2].data_type: unknown data type 'quux'; expected one of: "
        "float, half, bfloat16, double, int8, uint8, int32, int64, boolean, fp8_e4m3, "
        "fp8_e5m2, fp8_e8m0",
        f"invalid  {path}: nodes[1].inputs.in_1_tensor_uid: tensor uid 777 not defined "
        "(its tensors have uids 0-5)",
    ]
    assert "0 valid, 1 invalid (1 graph), 3 problems" in result.stderr


def test_every_validation_problem_is_reported_without_repeats(cli, tmp_path: Path) -> None:
    """A shape mismatch and an unused tensor: both reported; what follows from the mismatch
    (the nodes downstream of the bad matmul) is not reported again."""
    doc = json.loads(matmul_bias_relu().to_json())
    doc["tensors"][1]["dims"] = [1, 15, 8]  # B no longer matches A's inner dimension
    doc["tensors"][1]["strides"] = [120, 8, 1]
    doc["tensors"].append(
        {
            "uid": 99,
            "name": "unused",
            "dims": [1],
            "strides": [1],
            "data_type": "float",
            "virtual": False,
        }
    )
    path = tmp_path / "two.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("invalid")]
    assert len(lines) == 2, result.stderr
    assert "nodes[0].inputs.b_tensor_uid" in lines[0] and "inner dims differ" in lines[0]
    assert lines[1].endswith(
        "tensors[6]: tensor 'unused' (uid 99): is not used by any node; remove it"
    )
    assert "2 problems" in result.stderr


def test_one_problem_keeps_the_one_line_summary(cli, bad_graph: Path) -> None:
    result = cli("validate", "-g", str(bad_graph))
    assert "0 valid, 1 invalid (1 graph)\n" in result.stderr


@pytest.mark.parametrize(
    ("doc", "what", "reader"),
    [
        (
            {"version": 2, "engine_overrides": []},
            "an engine-override file",
            "`dnntune overrides show FILE` checks it",
        ),
        (
            {"format": "dnntune-heuristics-model", "format_version": 2},
            "a learned heuristics model",
            "`dnntune heuristics show FILE` reads it",
        ),
        (
            {"schema_version": 1, "graphs": []},
            "a `dnntune bench` results file",
            "`dnntune bench compare A B` reads it",
        ),
    ],
)
def test_another_dnntune_file_is_named_for_what_it_is(
    cli, tmp_path: Path, doc: dict, what: str, reader: str
) -> None:
    """An override file given as a graph printed six 'required field missing' lines, none
    saying that it is no graph at all (new-user audit)."""
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("invalid")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"invalid  {path}: {what}") and "not a graph" in lines[0]
    assert reader in lines[0]  # what to do with it: the model and results lines said nothing
    engines = cli("engines", "-g", str(path), "--device", "cpu")
    assert engines.exit_code == 1
    assert f"{path}: {what}" in engines.stderr and "not a graph" in engines.stderr


def test_a_graph_missing_its_nodes_still_lists_every_problem(cli, tmp_path: Path) -> None:
    doc = json.loads(matmul_bias_relu().to_json())
    del doc["nodes"]
    doc["engine_overrides"] = []  # not taken for an override file: it has tensors
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    assert "nodes: required field missing" in result.stderr
