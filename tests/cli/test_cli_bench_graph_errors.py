"""``dnntune bench``'s line for a graph file it cannot use says what is wrong as ``validate``
does: a file that cannot be read kept its reason but lost its path and colon ("cannot read
graph file Permission denied"), and a file that is not JSON gave the decoder's bare message
("Expecting property name enclosed in double quotes: line 2 column 1 (char 2)"), not that the
file is invalid JSON and where."""

from __future__ import annotations

import json
import pathlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app


def test_bench_names_an_unreadable_and_a_non_json_graph_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, locked, broken = tmp_path / "mm.json", tmp_path / "locked.json", tmp_path / "broken.json"
    testing.small_matmul_graph().save(good)
    testing.small_matmul_graph().save(locked)
    broken.write_text('{\n  "name": "x",\n  tensors: []\n}\n')
    read_bytes = pathlib.Path.read_bytes

    def refuse_locked(self: Path) -> bytes:  # chmod 000 does not stop root, who runs CI here
        if self.name == locked.name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", refuse_locked)
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "results.json"
    args = ["bench", "-g", str(good), str(locked), str(broken), "--iters", "2", "-o", str(out)]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert f"{locked}: error: cannot read graph file {locked}: Permission denied" in result.output
    expected = "invalid JSON at line 3 column 3: Expecting property name enclosed in double quotes"
    assert f"{broken}: error: {expected}" in result.output
    messages = {g["graph_path"]: g["message"] for g in json.loads(out.read_text())["graphs"]}
    assert messages[str(broken)] == expected
    assert messages[str(locked)] == f"cannot read graph file {locked}: Permission denied"
    assert messages[str(good)] is None
