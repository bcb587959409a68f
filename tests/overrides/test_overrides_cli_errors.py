"""``dnntune overrides``: an error outside dnntune's is one line and a hint, never a
traceback, and the audit's two crashes are read as the readers read them (session 18; each
test fails before its fix)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from overrides_helpers import conv_graph, write_winner
from typer.testing import CliRunner, Result

from dnntune.backend.knobs import KnobSetting
from dnntune.cli.app import app
from dnntune.overrides.merge import describe_file, merge_files


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _entries(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["engine_overrides"])


def test_show_a_huge_integer_time_is_no_time(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_winner(conv_graph(), path, "E")
    doc = json.loads(path.read_text())
    doc["engine_overrides"][0]["autotune_metadata"]["min_time_ms"] = 10**400
    path.write_text(json.dumps(doc))
    assert describe_file(path)[0].min_time_ms is None
    result = _invoke("overrides", "show", str(path))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def test_merge_a_knob_listed_twice_with_values_of_two_types(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_winner(conv_graph(), a, "E", knobs=[KnobSetting("fake.tile", 8)])
    write_winner(conv_graph(), b, "E", knobs=[KnobSetting("fake.tile", 8)])
    doc = json.loads(b.read_text())
    doc["engine_overrides"][0]["autotune_metadata"]["knobs"] = [
        {"knob_id": "fake.mode", "type": "string", "value": "preserve"},
        {"knob_id": "fake.mode", "type": "int", "value": 1},
    ]
    b.write_text(json.dumps(doc))
    out = tmp_path / "m.json"
    report = merge_files([a, b], out)  # was TypeError: '<' between 'int' and 'str'
    assert report.entries_written == 1 and len(report.conflicts) == 1
    result = _invoke("overrides", "merge", str(a), str(b), "-o", str(tmp_path / "m2.json"))
    assert result.exit_code == 0, result.output
    assert len(_entries(tmp_path / "m2.json")) == 1


def test_an_internal_error_in_overrides_is_one_line_and_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.json"
    write_winner(conv_graph(), path, "E")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr("dnntune.cli.overrides_cmd.describe_file", broken)
    result = _invoke("overrides", "show", str(path))
    assert result.exit_code == 1
    assert "internal error: ValueError: a bug" in result.stderr
    assert "-v for the traceback" in result.stderr
    assert "Traceback" not in result.output


def _without_graph_key(path: Path, engine: str) -> None:
    doc = json.loads(path.read_text())
    for e in doc["engine_overrides"]:
        e["autotune_metadata"].pop("graph_key", None)
        e["engine_name"] = engine
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("keyless_first", [False, True])
def test_an_entry_without_graph_key_merges_with_its_match_key(
    tmp_path: Path, keyless_first: bool
) -> None:
    """The later entry wins either way (both were kept, a dead duplicate: session 18)."""
    keyed, keyless = tmp_path / "keyed.json", tmp_path / "keyless.json"
    write_winner(conv_graph(), keyed, "CONV_A")
    write_winner(conv_graph(), keyless, "CONV_A")
    _without_graph_key(keyless, "CONV_B")
    assert "graph_key" in _entries(keyed)[0]["autotune_metadata"]
    order = [keyless, keyed] if keyless_first else [keyed, keyless]
    out = tmp_path / "m.json"
    report = merge_files(order, out)
    assert [e["engine_name"] for e in _entries(out)] == [_entries(order[1])[0]["engine_name"]]
    assert report.replaced == 1 and len(report.conflicts) == 1


def test_a_later_entry_without_graph_key_replaces_every_graph_of_its_match_key(
    tmp_path: Path,
) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    write_winner(conv_graph(), a, "CONV_A")
    write_winner(conv_graph(), b, "CONV_A")
    doc = json.loads(b.read_text())
    doc["engine_overrides"][0]["autotune_metadata"]["graph_key"] = "another-graph"
    b.write_text(json.dumps(doc))
    write_winner(conv_graph(), c, "CONV_A")
    _without_graph_key(c, "CONV_C")
    out = tmp_path / "m.json"
    both = tmp_path / "ab.json"
    merge_files([a, b], both)
    assert len(_entries(both)) == 2  # two graphs of one match key: an entry each
    report = merge_files([a, b, c], out)
    assert [e["engine_name"] for e in _entries(out)] == ["CONV_C"]
    assert report.replaced == 2


# ---- errors say what to try -------------------------------------------------------------------
def _said(result: Result) -> str:
    return " ".join(result.output.split())


def _refused(tmp_path: Path, name: str, text: str, command: str) -> tuple[Path, str]:
    """``dnntune overrides COMMAND`` on a file holding ``text``: exit 1; the file and what
    was said."""
    path = tmp_path / name
    path.write_text(text)
    result = _invoke("overrides", command, str(path))
    assert result.exit_code == 1, result.output
    return path, _said(result)


@pytest.mark.parametrize("command", ["show", "generalize"])
def test_a_file_of_a_newer_version_says_what_to_try(tmp_path: Path, command: str) -> None:
    path, said = _refused(tmp_path, "v9.json", '{"version": 9, "engine_overrides": []}', command)
    assert f"{path}: version: 9 is not supported (this dnntune reads 1..2)" in said
    assert "written by a newer dnntune: upgrade dnntune to read it" in said
    assert "re-tune with this one" in said


def test_a_file_of_no_version_dnntune_knows_says_what_to_try(tmp_path: Path) -> None:
    _, said = _refused(tmp_path, "v0.json", '{"version": 0, "engine_overrides": []}', "show")
    assert "version: 0 is not supported (this dnntune reads 1..2)" in said
    assert "no dnntune writes it: set it to 2" in said


def test_generalize_a_v1_file_names_generalize_not_merge(tmp_path: Path) -> None:
    _, said = _refused(tmp_path, "v1.json", '{"engine_overrides": []}', "generalize")
    assert "legacy v1 file (no version key)" in said
    assert "overrides merge and generalize read and write version 2 files only" in said
    assert "re-tune its graphs with `dnntune tune -o FILE` to get one" in said
