"""Every option of every ``dnntune`` command is documented on that command's page (docs audit,
session 61: ``bench``'s ``--verbose``/``--quiet`` and ``heuristics``' ``--output``/``--graph``
were only in ``-h``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from dnntune.cli.app import app

REPO = Path(__file__).resolve().parents[1]


def _command_tree() -> dict[tuple[str, ...], set[str]]:
    """Option names of every command and subcommand, keyed by its path under ``dnntune``."""
    tree: dict[tuple[str, ...], set[str]] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        tree[path] = {n for p in command.params for n in (*p.opts, *p.secondary_opts) if "-" in n}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return tree


#: the page that documents each command's options
PAGES = {"bench": "bench.md", "heuristics": "heuristics.md"}


def test_every_option_of_every_command_is_documented_on_its_page() -> None:
    for path, names in _command_tree().items():
        page = (REPO / "docs" / PAGES.get(path[0] if path else "", "cli.md")).read_text()
        for name in names - {"-h", "--help"}:
            pattern = rf"(?<![\w-]){re.escape(name)}(?![\w-])"
            assert re.search(pattern, page), f"dnntune {' '.join(path)} {name}: not in its page"
