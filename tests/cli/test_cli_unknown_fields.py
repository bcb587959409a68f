"""A graph file's keys that dnntune does not read: ``validate`` refuses the file, naming each
key and the one it likely meant; ``run``, ``tune`` and ``bench`` warn once per file and go on.

Before, such a key was kept for the round trip and silently ignored: an SDPA node's
``casual_mask`` ran non-causal attention, ``validate`` printed ok and ``run`` said PASS (CLI
audit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_helpers import REPO, matmul_bias_relu

from dnntune import testing

EXAMPLES = REPO / "examples" / "graphs"
FAST = ("--iters", "2", "--warmup", "0")


def _rename(box: dict[str, Any], old: str, new: str) -> None:
    items = [(new if k == old else k, v) for k, v in box.items()]
    box.clear()
    box.update(items)


def _casual_sdpa(tmp_path: Path) -> tuple[Path, int]:
    """The causal SDPA example with ``causal_mask`` misspelled; and the SDPA node's index."""
    doc = json.loads((EXAMPLES / "llama3_gqa_sdpa_causal.json").read_text())
    index = next(i for i, n in enumerate(doc["nodes"]) if n["type"] == "SdpaAttributes")
    _rename(doc["nodes"][index]["attributes"], "causal_mask", "casual_mask")
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(doc, indent=2))
    return path, index


def _clipped_relu(tmp_path: Path, name: str = "clip.json") -> Path:
    """A matmul + bias + relu graph whose relu clip is misspelled (``relu_uper_clip``)."""
    doc = json.loads(matmul_bias_relu().to_json())
    relu = doc["nodes"][2]["inputs"]
    _rename(relu, "relu_upper_clip", "relu_uper_clip")
    relu["relu_uper_clip"] = 0.5
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return path


CLIP = (
    "nodes[2].inputs.relu_uper_clip: unknown field of node 'pointwise_2' (PointwiseAttributes), "
    "ignored; did you mean 'relu_upper_clip'?"
)


def test_validate_refuses_a_misspelled_causal_mask(cli, tmp_path: Path) -> None:
    path, index = _casual_sdpa(tmp_path)
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1, result.output
    assert f"invalid  {path}: nodes[{index}].attributes.casual_mask: unknown field of node" in (
        result.stderr
    )
    assert "ignored; did you mean 'causal_mask'?" in result.stderr
    assert "0 valid, 1 invalid (1 graph)" in result.stderr
    assert "ok" not in result.stdout


def test_validate_allow_unknown_fields_passes_the_file_with_a_warning(cli, tmp_path: Path) -> None:
    path, _ = _casual_sdpa(tmp_path)
    result = cli("validate", "--allow-unknown-fields", "-g", str(path))
    assert result.exit_code == 0, result.output
    assert f"ok       {path}" in result.stdout
    assert "warning:" in result.stderr and "did you mean 'causal_mask'?" in result.stderr


def test_validate_names_every_unknown_key_first_then_what_it_broke(cli, tmp_path: Path) -> None:
    """A misspelled required key is also a missing one: the unknown key, which says what was
    meant, comes first."""
    doc = json.loads(matmul_bias_relu().to_json())
    _rename(doc["tensors"][0], "dims", "dim")
    doc["nmae"] = "x"
    path = tmp_path / "dim.json"
    path.write_text(json.dumps(doc))
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("invalid")]
    assert lines == [
        f"invalid  {path}: nmae: unknown field of the graph, ignored; did you mean 'name'?",
        f"invalid  {path}: tensors[0].dim: unknown field of tensor 'A', ignored; "
        "did you mean 'dims'?",
        f"invalid  {path}: tensors[0].dims: required field missing (a list of integers)",
    ]
    assert "0 valid, 1 invalid (1 graph), 3 problems" in result.stderr


def test_every_example_graph_validates(cli) -> None:
    result = cli("validate", "-g", str(EXAMPLES))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_run_warns_once_and_runs(cli, fakes, tmp_path: Path, graph_dir: Path) -> None:
    path = _clipped_relu(tmp_path)
    result = cli("run", "-g", str(path), str(graph_dir), *FAST)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning:") == 1
    assert f"warning: {path}: {CLIP}" in result.stderr
    assert "relu_uper_clip" not in result.stdout  # a warning, not a result
    assert "ran and matched the reference" in result.stdout
    quiet = cli("run", "-q", "-g", str(path), *FAST)
    assert quiet.exit_code == 0 and "relu_uper_clip" not in quiet.output


def test_tune_warns_once_and_tunes(cli, fakes, tmp_path: Path) -> None:
    path = _clipped_relu(tmp_path)
    out = tmp_path / "overrides.json"
    result = cli("tune", "-g", str(path), "-o", str(out), "--strategy", "fixed_average", *FAST)
    assert result.exit_code == 0, result.output
    assert result.stderr.count(CLIP) == 1
    assert json.loads(out.read_text())["engine_overrides"]


def test_bench_warns_and_records_it_in_the_results(cli, tmp_path: Path) -> None:
    path = _clipped_relu(tmp_path)
    doc = json.loads(path.read_text())
    doc["tensors"][0]["dim"] = [1]  # a second unknown key: one warning, a line for each
    path.write_text(json.dumps(doc))
    out = tmp_path / "results.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = cli("bench", "-g", str(path), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output
    note = (
        f"{path}: 2 unknown fields:\n  tensors[0].dim: unknown field of tensor 'A', ignored; "
        f"did you mean 'dims'?\n  {CLIP}"
    )
    assert result.stderr.count("warning:") == 1
    assert f"warning: {note}" in result.stderr
    assert json.loads(out.read_text())["run"]["warnings"] == [note]
