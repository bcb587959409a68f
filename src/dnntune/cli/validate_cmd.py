"""``dnntune validate``: load and validate graph files, one line per problem with its JSON path."""

from __future__ import annotations

import typer

from dnntune.cli._graphs import (
    GraphArgs,
    GraphOption,
    collect_graph_args,
    load_graph,
    other_file_kind,
)
from dnntune.cli._output import err_console, escape, out_console

__all__ = ["other_file_kind", "validate"]


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
        for problem in loaded.problems or [loaded.error]:
            problems += 1
            err.print(f"[bold red]invalid[/]  {escape(f'{path}: {problem}')}", soft_wrap=True)
    valid = len(paths) - invalid
    summary = f"{valid} valid, {invalid} invalid ({len(paths)} graph{'s' * (len(paths) != 1)})"
    if problems > invalid:
        summary += f", {problems} problems"
    (err if invalid else out).print(summary)
    if invalid:
        raise typer.Exit(1)
