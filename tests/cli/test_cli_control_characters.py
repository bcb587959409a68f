"""A graph whose name holds control characters (a terminal's ESC sequence, a carriage return)
prints them as escapes: ``run``, ``tune`` and ``validate`` wrote the raw ESC to the terminal,
which turned the rest of the line red (new-user audit, session 55)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import pointwise_mul

from dnntune.cli._output import escape

NAME = "[/]bad[bold] \x1b[31mred\rback"


def test_escape_shows_control_characters_and_keeps_lines() -> None:
    assert escape("a\x1b[31mb\rc\x07") == "a\\x1b[31mb\\x0dc\\x07"
    assert escape("two\nlines\tand a tab") == "two\nlines\tand a tab"


def test_a_graph_named_with_a_terminal_sequence_prints_the_escapes(
    cli, fakes, tmp_path: Path
) -> None:
    path = tmp_path / "g.json"
    doc = json.loads(pointwise_mul().to_json())
    doc["name"] = NAME
    path.write_text(json.dumps(doc))
    for args in (
        ("validate", "-g", str(path)),
        ("run", "-g", str(path), "--warmup", "0", "--iters", "1"),
        ("tune", "-g", str(path), "-o", str(tmp_path / "o.json"), "--warmup", "0"),
    ):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\r" not in result.output, args
        if args[0] != "validate":  # validate names the file, not the graph
            assert "\\x1b[31mred\\x0dback" in "".join(result.output.split()), args
