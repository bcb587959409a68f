"""``dnntune cache``: what dnntune keeps in its cache folder, and clearing it.

Mounted by :mod:`dnntune.cli.app` as a sub-app; the rules of what is looked at, removed and kept
are :mod:`dnntune._cache_folder`'s. Exit codes: 0 ok (nothing there is not an error), 1 a clear
left files it should have removed (another process holds their lock, or they cannot be removed:
each named, with what to try), 2 the cache folder setting names a file (or a path under one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dnntune import settings
from dnntune._cache_folder import Cleared, check_root, clear, parts
from dnntune._version import __version__
from dnntune.cli._output import error, escape, out_console, plural, warn

__all__ = ["app"]

EXIT_FAILED = 1
EXIT_USAGE = 2
#: how many paths a message lists before it says how many more
_LISTED = 5

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MiB"


def _root() -> Path:
    """The cache folder; a setting that names a file is exit 2, said in one line."""
    root = settings.cache_dir()
    where = "DNNTUNE_CACHE_DIR" if os.environ.get("DNNTUNE_CACHE_DIR") else "the default"
    try:
        check_root(root)
    except NotADirectoryError as exc:
        error(
            f"{root} ({where}): {exc.strerror}, so dnntune keeps no cache there; set "
            "DNNTUNE_CACHE_DIR to a folder (or move the file away)"
        )
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as exc:
        error(f"{root} ({where}): cannot be looked at: {exc.strerror or exc}")
        raise typer.Exit(EXIT_FAILED) from None
    return root


def _listed(paths: list[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:_LISTED])
    more = len(paths) - _LISTED
    return shown + (f" and {more} more" if more > 0 else "")


@app.command("show")
def show() -> None:
    """Where the cache folder is and what dnntune keeps in it (files and size per folder)."""
    root = _root()
    out = out_console()
    off = " (not used now: DNNTUNE_DISABLE_CACHE is set)" if settings.cache_disabled() else ""
    out.print(f"cache folder: {escape(str(root))}{off}", soft_wrap=True)
    found = [p for p in parts(root) if p.files or p.versions or p.foreign]
    if not found:
        out.print("no dnntune cache in it" if root.is_dir() else "not made yet", soft_wrap=True)
        return
    table = Table("folder", "versions", "files", "size")
    for p in found:
        versions = ", ".join(v + (" (this one)" if v == __version__ else "") for v in p.versions)
        table.add_row(escape(p.name), escape(versions or "-"), str(p.files), _size(p.bytes))
    out.print(table)
    foreign = [f for p in found for f in p.foreign]
    if foreign:
        out.print(
            escape(f"not dnntune's, kept by `dnntune cache clear`: {_listed(foreign)}"),
            soft_wrap=True,
        )


@app.command("clear")
def clear_cmd(
    other_versions: Annotated[
        bool,
        typer.Option(
            "--other-versions",
            help="Only the folders of other dnntune versions (this version's cache stays).",
        ),
    ] = False,
) -> None:
    """Remove what dnntune keeps in its cache folder (rankings, find and perf databases,
    built plans, generated kernels, compiled helpers). Files another process is writing, lock
    files and anything dnntune did not write stay."""
    root = _root()
    done = clear(root, other_versions=other_versions)
    _report(root, done, other_versions)
    if done.in_use or done.failed:
        raise typer.Exit(EXIT_FAILED)


def _report(root: Path, done: Cleared, other_versions: bool) -> None:
    out = out_console()
    which = "other versions' cache file" if other_versions else "cache file"
    if done.removed:
        line = f"removed {plural(len(done.removed), which)} ({_size(done.freed)}) from {root}"
        out.print(escape(line), soft_wrap=True)
    elif not done.in_use and not done.failed:
        out.print(escape(f"nothing to clear: no dnntune {which}s in {root}"), soft_wrap=True)
    if done.foreign:
        out.print(
            escape(f"kept what dnntune did not write: {_listed(done.foreign)}"), soft_wrap=True
        )
    if done.in_use:
        warn(
            f"kept {plural(len(done.in_use), 'file')} another process is writing (its lock is "
            f"held): {_listed(done.in_use)}; run `dnntune cache clear` again once it has finished"
        )
    for path, exc in done.failed:
        reason = exc.strerror or str(exc)
        error(
            f"{path}: not removed: {reason}; check that you may write to {path.parent} "
            f"(`ls -ld {path.parent}`), then run `dnntune cache clear` again"
        )
