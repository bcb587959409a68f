"""Another dnntune file given as a graph (an override file left in a graph folder by an earlier
``tune -o``) is named for what it is by every command that loads graphs, as ``validate`` and
``engines -g`` named it: ``run`` and ``tune`` said "name: required field missing (a string)"
(audit, session 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

OVERRIDES = {
    "version": 2,
    "engine_overrides": [
        {
            "op": "pointwise",
            "engine_name": "TORCH_ENGINE",
            "tensors": [{"tensor_id": "in_0_tensor_uid", "dim": [4, 8], "stride": [8, 1]}],
        }
    ],
}
SAID = "an engine-override file (what `dnntune tune` writes), not a graph"


@pytest.fixture
def folder(graph_dir: Path) -> Path:
    """The two small graphs and an override file beside them."""
    (graph_dir / "c_overrides.json").write_text(json.dumps(OVERRIDES))
    return graph_dir


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_run_names_an_override_file_among_the_graphs(cli, fakes, folder: Path) -> None:
    result = cli("run", "-g", str(folder), "--warmup", "0", "--iters", "1")
    assert result.exit_code == 1, result.output
    text = _one_line(result.output)
    assert f"c_overrides.json: {SAID}" in text
    assert "required field missing" not in text
    assert "2 of 3 graphs ran" in text  # the others still ran


def test_tune_names_an_override_file_among_the_graphs(
    cli, fakes, folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(folder), "-o", str(out), "--warmup", "0")
    assert result.exit_code == 1, result.output
    text = _one_line(result.output)
    assert f"c_overrides.json: {SAID}" in text
    assert "required field missing" not in text
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2


def test_validate_still_says_it_once(cli, folder: Path) -> None:
    result = cli("validate", "-g", str(folder / "c_overrides.json"))
    assert result.exit_code == 1, result.output
    assert _one_line(result.output).count(SAID) == 1


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (
            [{"graph": "mm", "source": "mm.json", "winner": None, "ok": False}],
            "a `dnntune tune --report` file, not a graph",
        ),
        (
            [{"graph": "mm", "source": "mm.json", "plan": "TORCH_ENGINE", "policy": "static"}],
            "a `dnntune run --json` results file, not a graph",
        ),
    ],
    ids=["tune-report", "run-results"],
)
def test_a_report_or_results_list_in_a_graph_folder_is_named(
    cli, fakes, graph_dir: Path, doc: list[dict[str, object]], said: str
) -> None:
    """A tune report or run results written into the graph folder (a JSON list) read "a graph
    document must be a JSON object, got list"."""
    (graph_dir / "c_results.json").write_text(json.dumps(doc))
    for args in (("validate",), ("run", "--warmup", "0", "--iters", "1")):
        result = cli(args[0], "-g", str(graph_dir), *args[1:])
        assert result.exit_code == 1, result.output
        text = _one_line(result.output)
        assert f"c_results.json: {said}" in text
        assert "must be a JSON object" not in text
