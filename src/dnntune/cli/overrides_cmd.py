"""``dnntune overrides``: inspect, merge and generalize engine-override files.

Mounted by :mod:`dnntune.cli.app` as a sub-app. Exit codes: 0 ok, 1 an input (or the existing
output, which merge and generalize keep unless ``--overwrite``) cannot be read or is not a valid
override file (nothing is written then), 2 usage error (bad option, a path that names nothing,
an output that cannot be written: checked before any work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dnntune.cli._output import error, escape, fmt_ms, out_console, plural, warn
from dnntune.errors import ConfigFileError, DnnTuneError
from dnntune.overrides.format import load_file
from dnntune.overrides.merge import MergeReport, describe_file, merge_files
from dnntune.overrides.store import check_writable

__all__ = ["app"]

EXIT_FAILED = 1
#: how a refusal to merge into an existing output names the way out
_REPLACE_HINT = "pass --overwrite to replace it"

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_WILDCARDS = ("batch",)

ExistingFile = Annotated[
    Path,
    typer.Argument(
        exists=True, dir_okay=False, metavar="FILE", help="An engine-override JSON file."
    ),
]


Append = Annotated[
    bool,
    typer.Option(
        "--append/--overwrite",
        help="An existing output that is not an input: merge it in first, as the "
        "lowest-priority input (its entries are kept unless a later one has the same match "
        "key), or replace it.",
    ),
]


def _check_output(output: Path, hint: str = "'-o' / '--output'") -> None:
    """Before any work: ``output`` can be written (a directory, a link loop, a folder without
    write permission are usage errors, exit 2); ``hint``: the argument that named it."""
    try:
        check_writable(output)
    except ConfigFileError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def _wildcard_batch(wildcard: str | None) -> bool:
    if wildcard is None:
        return False
    if wildcard not in _WILDCARDS:
        raise typer.BadParameter(
            f"{wildcard!r} is not supported; choose one of: {', '.join(_WILDCARDS)}",
            param_hint="'--wildcard'",
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


def _summary(report: MergeReport) -> str:
    """``wrote 3 entries to m.json (read 4 from 2 files; 1 replaced by a later file's entry)``."""
    parts = []
    if report.existing_entries is not None:
        parts.append(f"{plural(report.existing_entries, 'entry', 'entries')} already in it")
    parts.append(f"read {report.entries_read} from {plural(len(report.inputs), 'file', 'files')}")
    by_later_file = report.replaced - report.replaced_within_file
    replaced = []
    if by_later_file:
        replaced.append(f"{by_later_file} replaced by a later file's entry")
    if report.replaced_within_file:
        replaced.append(f"{report.replaced_within_file} replaced by a later entry of the same file")
    parts.append(", ".join(replaced) or "none replaced")
    return (
        f"wrote {plural(report.entries_written, 'entry', 'entries')} to {report.output} "
        f"({'; '.join(parts)})"
    )


def _where(source: str, index: int | None) -> str:
    return source if index is None else f"{source}: engine_overrides[{index}]"


def _print_report(report: MergeReport) -> None:
    console = out_console()
    console.print(escape(_summary(report)))
    if not report.conflicts:
        return
    conflicts = report.conflicts
    warn(
        f"{plural(len(conflicts), 'conflicting entry', 'conflicting entries')} "
        "(the later entry with the match key won)"
    )
    table = Table(title="conflicts")
    for column in ("match key", "kept", "from", "dropped", "from"):
        table.add_column(column, overflow="fold")
    for c in conflicts:
        table.add_row(
            escape(c.key),
            escape(c.kept_engine),
            escape(_where(c.kept_from, c.kept_index)),
            escape(c.dropped_engine),
            escape(_where(c.dropped_from, c.dropped_index)),
        )
    console.print(table)


@app.command("merge")
def merge(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            exists=True, dir_okay=False, metavar="FILE", help="Version-2 override files, in order."
        ),
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
    append: Append = True,
) -> None:
    """Merge override files; a later entry wins on equal match keys, conflicts are listed.

    An existing output that is not one of the inputs is kept and merged in first (as `dnntune
    tune -o` appends); --overwrite replaces it.
    """
    batch = _wildcard_batch(wildcard)
    _check_output(output)
    try:
        report = merge_files(
            inputs, output, wildcard_batch=batch, overwrite=not append, replace_hint=_REPLACE_HINT
        )
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
    append: Append = True,
) -> None:
    """Make entries match more graphs (e.g. any batch size), merging those that then coincide.

    With -o naming an existing file other than FILE, that file's entries are kept (as they
    are) and FILE's generalized entries merged into it; --overwrite replaces it.
    """
    _wildcard_batch(wildcard)
    target = output or file
    # written in place without -o: the error names FILE, not an option never given
    _check_output(target, "'-o' / '--output'" if output is not None else "FILE (in place)")
    try:
        report = merge_files(
            [file], target, wildcard_batch=True, overwrite=not append, replace_hint=_REPLACE_HINT
        )
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    _print_report(report)
