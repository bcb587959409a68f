"""``dnntune overrides``: inspect, merge and generalize engine-override files.

Mounted by :mod:`dnntune.cli.app` as a sub-app. Exit codes: 0 ok, 1 an input cannot be read
or is not a valid override file (nothing is written then), 2 usage error (bad option, a path
that names nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from dnntune.cli._output import error, fmt_ms, out_console, warn
from dnntune.errors import DnnTuneError
from dnntune.overrides.format import load_file
from dnntune.overrides.merge import MergeReport, describe_file, merge_files

__all__ = ["app"]

EXIT_FAILED = 1

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_WILDCARDS = ("batch",)

ExistingFile = Annotated[
    Path,
    typer.Argument(exists=True, dir_okay=False, help="An engine-override JSON file."),
]


def _wildcard_batch(wildcard: str | None) -> bool:
    if wildcard is None:
        return False
    if wildcard not in _WILDCARDS:
        raise typer.BadParameter(
            f"{wildcard!r} is not supported; choose one of: {', '.join(_WILDCARDS)}",
            param_hint="--wildcard",
        )
    return True


@app.command("show")
def show(file: ExistingFile) -> None:
    """Show the entries of an override file (first match wins, top to bottom)."""
    try:
        config = load_file(file)
        rows = describe_file(file)
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    version = f"version {config.version}" if config.has_version else "legacy v1 (positional)"
    table = Table(
        title=f"{escape(str(file))}: {version}, {len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
    )
    for column in (
        "#",
        "op",
        "engine",
        "criteria",
        "tensors",
        "min time",
        "mode",
        "strategy",
        "knobs",
        "timestamp",
    ):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(
            str(r.index),
            escape(r.op),
            escape(r.engine_name),
            escape(r.criteria) or "-",
            escape(r.tensors),
            fmt_ms(r.min_time_ms),
            escape(r.mode) or "-",
            escape(r.strategy) or "-",
            escape(r.knobs) or "-",
            escape(r.timestamp) or "-",
        )
    out_console().print(table)


def _print_report(report: MergeReport) -> None:
    console = out_console()
    console.print(
        f"wrote {report.entries_written} entr{'y' if report.entries_written == 1 else 'ies'} to "
        f"{escape(report.output)} (read {report.entries_read} from {len(report.inputs)} "
        f"file{'s' if len(report.inputs) != 1 else ''}; {report.replaced} replaced by a later file)"
    )
    if not report.conflicts:
        return
    warn(
        f"{len(report.conflicts)} conflicting entr{'y' if len(report.conflicts) == 1 else 'ies'}"
        " (the later file won)"
    )
    table = Table(title="conflicts")
    for column in ("match key", "kept", "from", "dropped", "from"):
        table.add_column(column, overflow="fold")
    for c in report.conflicts:
        table.add_row(
            escape(c.key),
            escape(c.kept_engine),
            escape(c.kept_from),
            escape(c.dropped_engine),
            escape(c.dropped_from),
        )
    console.print(table)


@app.command("merge")
def merge(
    inputs: Annotated[
        list[Path],
        typer.Argument(exists=True, dir_okay=False, help="Version-2 override files, in order."),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="The merged file to write.")],
    wildcard: Annotated[
        str | None,
        typer.Option(
            "--wildcard",
            help="Generalize entries: 'batch' sets the batch dim (dim 0 of the tensors that "
            "carry the batch, not weights) to -1.",
        ),
    ] = None,
) -> None:
    """Merge override files; a later file wins on equal match keys, conflicts are listed."""
    batch = _wildcard_batch(wildcard)
    try:
        report = merge_files(inputs, output, wildcard_batch=batch)
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    _print_report(report)


@app.command("generalize")
def generalize(
    file: ExistingFile,
    wildcard: Annotated[
        str,
        typer.Option(
            "--wildcard",
            help="What to generalize: 'batch' sets the batch dim (dim 0 of the tensors that "
            "carry the batch, not weights) to -1.",
        ),
    ] = "batch",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here (default: in place).")
    ] = None,
) -> None:
    """Make entries match more graphs (e.g. any batch size), merging those that then coincide."""
    _wildcard_batch(wildcard)
    try:
        report = merge_files([file], output or file, wildcard_batch=True)
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    _print_report(report)
