"""Another dnntune file where graphs are read. Named as a graph, it is named for what it is by
every command that loads graphs, as ``validate`` and ``engines -g`` named it: ``run`` and
``tune`` said "name: required field missing (a string)" (audit, session 27). In a folder or a
glob (an override file an earlier ``tune -o`` left beside the graphs) it is left out: the
commands read the graphs beside it, and a second ``tune -g DIR -o DIR/overrides.json`` runs
(new-user audit, session 55: it refused its own override file as "one of the graphs to tune",
and ``run -g DIR`` exited 1 on it every time)."""

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


def test_run_and_tune_leave_an_override_file_in_the_folder_out(
    cli, fakes, folder: Path, tmp_path: Path
) -> None:
    result = cli("run", "-g", str(folder), "--warmup", "0", "--iters", "1")
    assert result.exit_code == 0, result.output
    text = _one_line(result.output)
    assert "c_overrides.json" not in text and "2 of 2 graphs ran" in text
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(folder), "-o", str(out), "--warmup", "0")
    assert result.exit_code == 0, result.output
    assert "c_overrides.json" not in _one_line(result.output)
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2


def test_an_override_file_naming_a_key_twice_is_still_left_out_of_the_folder(
    cli, fakes, graph_dir: Path
) -> None:
    """Since graph files refuse a key named twice, a hand-edited override file with two
    "version" lines in a graph folder was read as a graph and failed the run (helper audit,
    session 61); it is still an override file, left out as a sound one is."""
    text = json.dumps(OVERRIDES)
    (graph_dir / "c_overrides.json").write_text(text.replace("{", '{"version": 2, ', 1))
    result = cli("run", "-g", str(graph_dir), "--warmup", "0", "--iters", "1")
    assert result.exit_code == 0, result.output
    out = _one_line(result.output)
    assert "c_overrides.json" not in out and "2 of 2 graphs ran" in out
    glob = cli("validate", "-g", str(graph_dir / "*.json"))
    assert glob.exit_code == 0, glob.output


def test_tune_into_the_graph_folder_runs_again(cli, fakes, graph_dir: Path) -> None:
    out = graph_dir / "overrides.json"
    for _ in range(2):
        result = cli("tune", "-g", str(graph_dir), "-o", str(out), "--warmup", "0")
        assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2
    result = cli("run", "-g", str(graph_dir), "--warmup", "0", "--iters", "1")
    assert result.exit_code == 0, result.output
    glob = cli("validate", "-g", str(graph_dir / "*.json"))
    assert glob.exit_code == 0, glob.output


def test_run_and_tune_name_an_override_file_given_as_a_graph(
    cli, fakes, folder: Path, tmp_path: Path
) -> None:
    graphs = sorted(str(p) for p in folder.glob("*.json"))
    result = cli("run", *[a for g in graphs for a in ("-g", g)], "--warmup", "0", "--iters", "1")
    assert result.exit_code == 1, result.output
    text = _one_line(result.output)
    assert f"c_overrides.json: {SAID}" in text
    assert "required field missing" not in text
    assert "2 of 3 graphs ran" in text  # the others still ran
    out = tmp_path / "o.json"
    result = cli("tune", *[a for g in graphs for a in ("-g", g)], "-o", str(out), "--warmup", "0")
    assert result.exit_code == 1, result.output
    assert f"c_overrides.json: {SAID}" in _one_line(result.output)
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2


def test_a_folder_of_dnntune_files_alone_has_no_graph(cli, tmp_path: Path) -> None:
    (tmp_path / "overrides.json").write_text(json.dumps(OVERRIDES))
    result = cli("validate", "-g", str(tmp_path))
    assert result.exit_code == 2
    assert "has no *.json graph files" in _one_line(result.output)
    result = cli("validate", "-g", str(tmp_path / "*.json"))
    assert result.exit_code == 2
    assert "dnntune's own" in _one_line(result.output)


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
    """A tune report or run results (a JSON list) read "a graph document must be a JSON
    object, got list"; in the graph folder it is left out."""
    (graph_dir / "c_results.json").write_text(json.dumps(doc))
    named = str(graph_dir / "c_results.json")
    for args in (("validate",), ("run", "--warmup", "0", "--iters", "1")):
        result = cli(args[0], "-g", named, *args[1:])
        assert result.exit_code == 1, result.output
        text = _one_line(result.output)
        assert f"c_results.json: {said}" in text
        assert "must be a JSON object" not in text
        in_folder = cli(args[0], "-g", str(graph_dir), *args[1:])  # left out there
        assert in_folder.exit_code == 0, in_folder.output
        assert "c_results.json" not in _one_line(in_folder.output)
