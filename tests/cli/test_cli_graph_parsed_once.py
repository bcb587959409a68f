"""Each command reads and parses a graph file once.

``load_graph`` parsed a file to load it, again to list its unknown keys, again to tell an
override file from a bad graph and, for ``validate``, again to list every problem; a folder's
files were parsed once more to leave dnntune's other files out. Counted here through the real
entry point: every ``json.loads`` of the file's text (whichever reader calls it) and every
read of the file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import matmul_bias_relu


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each file was read (``read:NAME``) and its text parsed (``parse:NAME``), for
    the files of a ``graphs`` folder."""
    seen: Counter[str] = Counter()
    texts: dict[str, str] = {}
    loads, read_bytes = json.loads, Path.read_bytes

    def counting_loads(s: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(s, str) and s in texts:
            seen[f"parse:{texts[s]}"] += 1
        return loads(s, *args, **kwargs)

    def counting_read_bytes(self: Path) -> bytes:
        data = read_bytes(self)
        if self.parent.name == "graphs":
            seen[f"read:{self.name}"] += 1
            texts[data.decode("utf-8", "replace")] = self.name
        return data

    monkeypatch.setattr(json, "loads", counting_loads)
    monkeypatch.setattr(Path, "read_bytes", counting_read_bytes)
    return seen


def _folder(tmp_path: Path) -> Path:
    """Two graphs, the second with a misspelled key (warned of, or refused by validate)."""
    d = tmp_path / "graphs"
    d.mkdir()
    matmul_bias_relu("first").save(d / "a.json")
    doc = json.loads(matmul_bias_relu("second").to_json())
    doc["nmae"] = "typo"
    (d / "b.json").write_text(json.dumps(doc))
    return d


def _once(counts: Counter[str]) -> None:
    assert counts == Counter(
        {"read:a.json": 1, "parse:a.json": 1, "read:b.json": 1, "parse:b.json": 1}
    )


@pytest.mark.parametrize("by_name", [True, False], ids=["files", "folder"])
def test_validate(cli, counts: Counter[str], tmp_path: Path, by_name: bool) -> None:
    d = _folder(tmp_path)
    args = [str(d / "a.json"), str(d / "b.json")] if by_name else [str(d)]
    result = cli("validate", "-g", *args)
    assert result.exit_code == 1, result.output  # b.json's unknown key
    assert "nmae: unknown field of the graph" in result.stderr
    _once(counts)


def test_validate_of_an_invalid_file_lists_every_problem_from_one_parse(
    cli, counts: Counter[str], tmp_path: Path
) -> None:
    d = _folder(tmp_path)
    doc = json.loads((d / "a.json").read_text())
    del doc["tensors"][0]["dims"], doc["tensors"][1]["dims"]
    (d / "a.json").write_text(json.dumps(doc))
    counts.clear()
    result = cli("validate", "-g", str(d))
    assert result.exit_code == 1
    assert "0 valid, 2 invalid (2 graphs), 3 problems" in result.stderr
    _once(counts)


@pytest.mark.parametrize("command", ["run", "tune"])
def test_run_and_tune(cli, fakes, counts: Counter[str], tmp_path: Path, command: str) -> None:
    d = _folder(tmp_path)
    extra = ["-o", str(tmp_path / "o.json")] if command == "tune" else ["--iters", "1"]
    result = cli(command, "-g", str(d), *extra, "--warmup", "0")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("nmae") == 1
    _once(counts)


def test_another_dnntune_file_named_as_a_graph(cli, counts: Counter[str], tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (d / "a.json").write_text(json.dumps({"version": 2, "engine_overrides": []}))
    result = cli("validate", "-g", str(d / "a.json"), str(d / "b.json"))
    assert "an engine-override file" in result.stderr
    _once(counts)
