"""A key named twice in one object of an override file: Python's ``json`` kept the last value
without a word, so ``{"version": 2, "engine_overrides": [], "version": 3}`` was a version 3
file ("written by a newer dnntune") and a hand-edited entry lost one of its values. Readers
and writers now refuse it, naming the key, the object's JSON path and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, write_winner
from typer.testing import CliRunner, Result

from dnntune.cli.app import app
from dnntune.errors import InvalidValueError


def _show(path: Path) -> Result:
    return CliRunner().invoke(app, ["overrides", "show", str(path)], env={"COLUMNS": "200"})


def _said(result: Result) -> str:
    return " ".join(result.output.split())


def test_show_refuses_a_version_named_twice(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text('{"version": 2, "engine_overrides": [], "version": 3}\n')
    result = _show(path)
    assert result.exit_code == 1, result.output
    said = _said(result)
    assert f'{path.name}: (top level): the key "version" appears twice (again on line 1)' in said
    assert "delete the one you do not mean" in said
    assert "newer dnntune" not in said


def _entry_with_two_engine_names(tmp_path: Path) -> tuple[Path, int]:
    """A file ``dnntune`` wrote, hand-edited: a second ``engine_name`` line in its entry; and
    the number of that line."""
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "FAKE_A")
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"engine_name"' in line)
    lines.insert(at + 1, lines[at].replace("FAKE_A", "FAKE_B"))
    path.write_text("\n".join(lines) + "\n")
    return path, at + 2


def test_show_names_the_entry_and_line_of_a_key_named_twice(tmp_path: Path) -> None:
    path, line = _entry_with_two_engine_names(tmp_path)
    result = _show(path)
    assert result.exit_code == 1, result.output
    said = _said(result)
    assert f'engine_overrides[0]: the key "engine_name" appears twice (again on line {line})' in (
        said
    )


def test_the_writer_refuses_to_add_to_such_a_file_and_leaves_it(tmp_path: Path) -> None:
    """Appending would have rewritten the file with one of the two values gone."""
    path, _ = _entry_with_two_engine_names(tmp_path)
    before = path.read_text()
    with pytest.raises(InvalidValueError, match=r'refusing to update .*"engine_name" appears'):
        write_winner(conv_graph(n=4), path, "FAKE_C")
    assert path.read_text() == before
    assert not list(tmp_path.glob("*.corrupt-*"))  # it is JSON: not moved aside


def test_the_line_is_the_second_key_of_that_object_not_of_one_inside_it() -> None:
    from dnntune._json_keys import DuplicateKeyError, loads

    text = '{"a": {\n"op": 1},\n"op": 2,\n"b": [{"op": 3}],\n"op": 4}'
    with pytest.raises(DuplicateKeyError) as caught:
        loads(text)
    assert (caught.value.where, caught.value.key, caught.value.line) == ("(top level)", "op", 5)
    nested = '{"x": [1, {"k": 1,\n "k": 2}]}'
    with pytest.raises(DuplicateKeyError) as caught:
        loads(nested)
    assert (caught.value.where, caught.value.line) == ("x[1]", 2)
    assert loads('{"a": {"k": 1}, "k": 2}') == json.loads('{"a": {"k": 1}, "k": 2}')
