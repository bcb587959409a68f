"""Console helpers: the CLI owns output (the library never prints).

Results go to stdout, problems and logs to stderr, so ``dnntune tune ... > report.txt`` keeps
the tables and still shows errors on the terminal. Consoles are created per command so that
they write to whatever ``sys.stdout``/``sys.stderr`` are at that moment (tests swap them).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape as _markup_escape

from dnntune.cli._closed_output import output_closed
from dnntune.providers.engine_output import passthrough

__all__ = [
    "LOG_FORMAT",
    "busy_line",
    "configure_logging",
    "err_console",
    "error",
    "escape",
    "fmt_ms",
    "fmt_speedup",
    "out_console",
    "warn",
]

LOG_FORMAT = "%(name)s: %(message)s"

#: control characters a terminal acts on (ESC starts a colour or cursor sequence, CR returns
#: to the line's start), the line feed and tab left as they are
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(text: str) -> str:
    """``text`` for rich to print as it is: its markup escaped, and its control characters
    shown as escapes (``\\x1b``), so that a graph named with a terminal sequence prints its
    name, not a colour (new-user audit, session 55)."""
    return _markup_escape(_CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


#: width used when output is not a terminal (pipes, CI logs, tests): wide enough that graph
#: names and JSON paths never wrap in the middle
_PIPE_WIDTH = 200


class _CliConsole(Console):
    """A console whose stream, once its reader is gone (``dnntune tune ... | head -1``), takes
    nothing more, and the command goes on: rich's own answer was to exit 1 on the spot, which
    lost what the command writes after its table (:mod:`dnntune.cli._closed_output`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        del self._buffer[:]
        output_closed(self.file)


def _console(stderr: bool) -> Console:
    file: TextIO = sys.stderr if stderr else sys.stdout
    is_tty = hasattr(file, "isatty") and file.isatty()
    width = None if is_tty or os.environ.get("COLUMNS") else _PIPE_WIDTH
    # No ``file=``: rich then looks up sys.stdout/sys.stderr at each write, so a live progress
    # display (which redirects them) and log records printed meanwhile do not garble each other.
    return _CliConsole(stderr=stderr, width=width, highlight=False, soft_wrap=False)


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 graph``, ``2 graphs``; ``many`` for nouns that do not just take an s (entries)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def busy_line(shares: list[float | None], marked: str, again: str) -> str:
    """The line under a table whose rows include ``shares`` timed on a busy CPU ("" if none):
    how many, the worst run-queue wait, how they are ``marked`` and what to run ``again``."""
    if not shares:
        return ""
    worst = max(share or 0.0 for share in shares)
    were = "s were" if len(shares) != 1 else " was"
    return (
        f"{len(shares)} graph{were} timed while the CPU was busy (the timing threads waited for "
        f"a core up to {100.0 * worst:.0f}% of the time, {marked}): those times are not to be "
        f"trusted; {again} again with nothing else running"
    )


def out_console() -> Console:
    """Console on stdout (tables, results)."""
    return _console(stderr=False)


def err_console() -> Console:
    """Console on stderr (problems, progress, logs)."""
    return _console(stderr=True)


def error(message: str, console: Console | None = None) -> None:
    """One line on stderr: ``error: <message>`` (message printed verbatim, never as markup)."""
    (console or err_console()).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def warn(message: str, console: Console | None = None) -> None:
    (console or err_console()).print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


_HANDLER_FLAG = "_dnntune_cli_handler"


class _CliLogHandler(RichHandler):
    """The CLI's log handler. Its console looks up ``sys.stderr`` at each write, so while an
    engine compiles (its output captured, see :mod:`dnntune.providers.engine_output`) it
    writes through the capture: dnntune's own records always show."""

    def emit(self, record: logging.LogRecord) -> None:
        with passthrough():
            super().emit(record)


def configure_logging(level: int) -> None:
    """Send ``dnntune.*`` log records at ``level`` and above to stderr through rich.

    WARNING (the default) shows only what a user must act on; INFO (``-v``) adds each
    candidate's outcome (a variant the engine cannot run here, one that failed, its times);
    DEBUG (``-vv``) adds dnntune's details and what the engines printed or logged while they
    compiled and searched (``dnntune.engine_output``: torch.compile's max-autotune tables,
    Inductor, Triton, cuDNN frontend), which is otherwise kept out of the output.

    Replaces a handler installed by an earlier call (the CLI may be invoked several times in one
    process, as the tests do), and leaves every other logger alone.
    """
    logger = logging.getLogger("dnntune")
    for handler in list(logger.handlers):
        if getattr(handler, _HANDLER_FLAG, False):
            logger.removeHandler(handler)
    handler = _CliLogHandler(
        console=err_console(),
        show_time=False,
        show_path=False,
        rich_tracebacks=False,
        markup=False,
    )
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    setattr(handler, _HANDLER_FLAG, True)
    handler.setLevel(level)
    logger.addHandler(handler)
    # The progress handler of `tune` listens at INFO, so the logger itself passes INFO on;
    # the rich handler filters to what the user asked for.
    logger.setLevel(min(level, logging.INFO))


def quiet() -> bool:
    """``dnntune -q``: only errors, so no progress lines or bars (results still print)."""
    for handler in logging.getLogger("dnntune").handlers:
        if getattr(handler, _HANDLER_FLAG, False):
            return handler.level > logging.WARNING
    return False


def graph_labels(rows: list[tuple[str, str | None]]) -> list[str]:
    """A table's graph cells for ``(graph name, source file)`` rows: the name, followed by the
    file where another row has that name from another file (copies of a graph edited to other
    shapes or types keep their ``name``, and read as one graph twice, timed differently)."""
    files: dict[str, set[str | None]] = {}
    for name, source in rows:
        files.setdefault(name, set()).add(source)
    return [
        f"{name} ({source})" if source and len(files[name]) > 1 else name for name, source in rows
    ]


def fmt_ms(value: float | None) -> str:
    """Milliseconds with 3 significant decimals below 1 ms, e.g. ``0.0421 ms``, ``12.31 ms``."""
    if value is None or value != value or value == float("inf"):
        return "-"
    if value < 1.0:
        return f"{value:.4f} ms"
    if value < 100.0:
        return f"{value:.3f} ms"
    return f"{value:.1f} ms"


def fmt_speedup(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.2f}x"


#: :func:`existing_document`'s answer for a path that is no file, or an empty one
NO_DOCUMENT = object()


def existing_document(path: Path) -> Any:
    """What an output option would replace at ``path``: :data:`NO_DOCUMENT` when nothing (no
    file, an empty one), else its JSON document (None when it is not JSON), for the caller's
    "is it a file of my kind" check."""
    if not path.is_file() or path.stat().st_size == 0:
        return NO_DOCUMENT
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def refuse_other_kind(
    path: Path,
    ours: Callable[[Any], bool],
    option: str,
    what: str,
    example: str,
    hint: str | None = None,
) -> None:
    """An output option replaces a file of its own kind (``ours(document)``) or an empty one,
    never another file: an override file, a graph, results of another command (each output
    option replaced such files silently once, exit 0). ``hint``: how the usage error names the
    option (default: the option itself).

    Raises:
        typer.BadParameter: naming the file, what it is not, and a name to use instead.
    """
    import typer

    doc = existing_document(path.expanduser())
    if doc is NO_DOCUMENT or ours(doc):
        return
    raise typer.BadParameter(
        f"{path} exists and is not {what}; {option} would replace it: name a new file "
        f"(e.g. {example}) or remove it first",
        param_hint=hint or f"'{option}'",
    )
