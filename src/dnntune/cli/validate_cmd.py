"""``dnntune validate``: load and validate graph files, one line per problem with its JSON path."""

from __future__ import annotations

from typing import Annotated

import typer

from dnntune.cli._graphs import (
    GraphArgs,
    GraphOption,
    Parsed,
    collect_graph_args,
    load_graph,
    other_file_kind,
)
from dnntune.cli._output import err_console, escape, out_console, warn
from dnntune.graph.json_unknown import unknown_fields_note

__all__ = ["other_file_kind", "validate"]


def validate(
    graphs: GraphOption = None,
    more: GraphArgs = None,
    allow_unknown_fields: Annotated[
        bool,
        typer.Option(
            "--allow-unknown-fields",
            help="Pass a graph that holds keys dnntune does not read (another tool's, a newer "
            "dnntune's) with a warning naming them, instead of counting each as a problem.",
        ),
    ] = False,
) -> None:
    """Load and validate graphs; report every problem of every invalid one, with its JSON path.

    A key dnntune does not read (``casual_mask`` for ``causal_mask``) is a problem: the file
    would run with the default in its place. Exit code 0 when all are valid, 1 when any is
    invalid, 2 for a path that names nothing.
    """
    parsed: Parsed = {}
    paths = collect_graph_args(graphs, more, parsed)
    out, err = out_console(), err_console()
    invalid = problems = 0
    for path in paths:
        loaded = load_graph(path, every_problem=True, warn_unknown=False, parsed=parsed)
        # first: a misspelled key explains a problem it causes ("dim": "dims" is missing)
        found = loaded.problems or ([loaded.error] if loaded.error else [])
        if allow_unknown_fields:
            if loaded.unknown:
                warn(unknown_fields_note(path, loaded.unknown), err)
        else:
            found = [*loaded.unknown, *found]
        if not found:
            out.print(f"[green]ok[/]       {escape(str(path))}", soft_wrap=True)
            continue
        invalid += 1
        for problem in found:
            problems += 1
            err.print(f"[bold red]invalid[/]  {escape(f'{path}: {problem}')}", soft_wrap=True)
    valid = len(paths) - invalid
    summary = f"{valid} valid, {invalid} invalid ({len(paths)} graph{'s' * (len(paths) != 1)})"
    if problems > invalid:
        summary += f", {problems} problems"
    (err if invalid else out).print(summary)
    if invalid:
        raise typer.Exit(1)
