"""``dnntune validate``: load and validate graph files, one line per problem with its JSON path."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from dnntune.cli._graphs import GraphArgs, GraphOption, collect_graph_args, load_graph
from dnntune.cli._output import err_console, out_console
from dnntune.errors import DnnTuneError
from dnntune.graph.json_format import read_graph_text

__all__ = ["other_file_kind", "validate"]

#: (top-level key and value or None for any, what the file is) of the other JSON files dnntune
#: writes, which a user may give where a graph goes
_OTHER_FILES: tuple[tuple[str, str | None, str], ...] = (
    (
        "engine_overrides",
        None,
        "an engine-override file (what `dnntune tune` writes), not a graph; "
        "`dnntune overrides show FILE` checks it",
    ),
    (
        "format",
        "dnntune-heuristics-model",
        "a learned heuristics model (`dnntune heuristics train`), not a graph; "
        "`dnntune heuristics show FILE` reads it",
    ),
    (
        "schema_version",
        None,
        "a `dnntune bench` results file, not a graph; `dnntune bench compare A B` reads it",
    ),
)


def other_file_kind(path: Path) -> str | None:
    """What ``path`` is, when it is another dnntune JSON file (an override file, a heuristics
    model, bench results) rather than a graph: a graph's problems say little about it."""
    try:
        doc = json.loads(read_graph_text(path))
    except (DnnTuneError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "nodes" in doc or "tensors" in doc:
        return None
    for key, value, what in _OTHER_FILES:
        if key in doc and (value is None or doc[key] == value):
            return what
    return None


def validate(
    graphs: GraphOption = None,
    more: GraphArgs = None,
) -> None:
    """Load and validate graphs; report every problem of every invalid one, with its JSON path.

    Exit code 0 when all are valid, 1 when any is invalid, 2 for a path that names nothing.
    """
    paths = collect_graph_args(graphs, more)
    out, err = out_console(), err_console()
    invalid = problems = 0
    for path in paths:
        loaded = load_graph(path, every_problem=True)
        if loaded.ok:
            out.print(f"[green]ok[/]       {escape(str(path))}", soft_wrap=True)
            continue
        invalid += 1
        other = other_file_kind(path)
        for problem in [other] if other else loaded.problems or [loaded.error]:
            problems += 1
            err.print(f"[bold red]invalid[/]  {escape(f'{path}: {problem}')}", soft_wrap=True)
    valid = len(paths) - invalid
    summary = f"{valid} valid, {invalid} invalid ({len(paths)} graph{'s' * (len(paths) != 1)})"
    if problems > invalid:
        summary += f", {problems} problems"
    (err if invalid else out).print(summary)
    if invalid:
        raise typer.Exit(1)
