"""A graph file that names a key twice in one object: ``validate`` refuses it, and ``run`` and
``bench`` fail that graph, naming the file, the key, its JSON path and line, and what to do.

Python's ``json`` kept the last value without a word: a second ``"causal_mask": false`` line
in the causal SDPA example ran non-causal attention, and ``validate`` printed ok."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import causal_mask_twice

from dnntune import testing

FAST = ("--iters", "1", "--warmup", "0")


def _causal_mask_twice(tmp_path: Path) -> tuple[Path, str]:
    """The causal SDPA example with a second ``causal_mask`` line; its path and the problem
    every command must print for it."""
    path, where, line = causal_mask_twice(tmp_path)
    said = (
        f'{where}: the key "causal_mask" appears twice (again on line '
        f"{line}); a reader would keep only the last value: delete the one you do not mean"
    )
    return path, said


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_validate_refuses_it(cli, tmp_path: Path) -> None:
    path, said = _causal_mask_twice(tmp_path)
    result = cli("validate", "-g", str(path))
    assert result.exit_code == 1, result.output
    assert f"invalid {path}: {said}" in _one_line(result.stderr)
    assert "0 valid, 1 invalid (1 graph)" in result.stderr


def test_run_fails_that_graph_and_runs_the_others(cli, fakes, tmp_path: Path, graph_dir) -> None:
    path, said = _causal_mask_twice(tmp_path)
    result = cli("run", "-g", str(path), str(graph_dir), *FAST)
    assert result.exit_code == 1, result.output
    text = _one_line(result.output)
    assert said in text and str(path) in text
    assert "2 of 3 graphs ran" in text


def test_bench_records_it_as_that_graphs_error(cli, tmp_path: Path) -> None:
    path, said = _causal_mask_twice(tmp_path)
    out = tmp_path / "results.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = cli("bench", "-g", str(path), "-o", str(out), *FAST)
    (entry,) = json.loads(out.read_text())["graphs"]
    assert (entry["status"], entry["error"]) == ("error", "GraphFormatError"), result.output
    assert entry["message"] == said
