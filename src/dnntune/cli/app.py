"""The ``dnntune`` command: a typer app whose commands live one per module in this folder.

The CLI is thin: it parses, calls the library, shows the result (rich) and picks the exit code:
0 ok, 1 a graph failed or is invalid, 2 usage error (bad option, a path that names nothing),
130 interrupted (Ctrl-C), 141 stdout or stderr closed by its reader (``| head``: the command
still finishes, see :mod:`dnntune.cli._closed_output`). Expected errors print one line each,
never a traceback.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from dnntune._version import __version__
from dnntune.cli._closed_output import EXIT_CLOSED_OUTPUT, OutputWatch
from dnntune.cli._help import use_flag_help
from dnntune.cli._option_values import refuse_option_names_as_values
from dnntune.cli._output import err_console, error, out_console
from dnntune.cli._verbosity import accept_log_flags, set_verbosity, verbosity
from dnntune.cli.engines_cmd import engines
from dnntune.cli.run_cmd import run
from dnntune.cli.tune_cmd import tune
from dnntune.cli.validate_cmd import validate
from dnntune.errors import DnnTuneError

__all__ = [
    "EXIT_CLOSED_OUTPUT",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "app",
    "main",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_log = logging.getLogger(__name__)

app = typer.Typer(
    name="dnntune",
    help=(
        "Run deep-learning operation graphs on the measurably fastest verified engine, and "
        "remember the choice (hipDNN RFC 0013 autotuning, in Python)."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])

#: exceptions typer/click use for control flow (exit codes, usage errors): never intercepted.
#: ClickException is looked up through BadParameter's bases because typer vendors click in
#: recent releases and re-exports the real click in older ones.
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
_CLI_CONTROL: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, _CLICK_ERROR)


def _guarded(fn: F) -> F:
    """Turn expected errors into one line + exit 1, and Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _CLI_CONTROL:
            raise
        except KeyboardInterrupt:
            err_console().print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except DnnTuneError as exc:
            error(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except Exception as exc:
            # A bug, not an expected error: say so, and show the traceback with -v.
            error(f"internal error: {type(exc).__name__}: {exc}")
            if verbosity() > 0:
                err_console().print_exception()
            else:
                err_console().print("run with -v for the traceback")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]


def _version_callback(value: bool) -> None:
    if value:
        # the CLI's console, not typer.echo: a closed stdout (``| head -0``) exits 141 quietly
        out_console().print(f"dnntune {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_version_callback,
            is_eager=True,
        ),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "-v", "--verbose", count=True, show_default=False, help="More log output (-vv: debug)."
        ),
    ] = 0,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Only errors.")] = False,
) -> None:
    """Run deep-learning operation graphs on the measurably fastest verified engine."""
    set_verbosity(verbose, quiet)


app.command("validate")(_guarded(validate))
app.command("engines")(_guarded(engines))
app.command("run")(_guarded(run))
app.command("tune")(_guarded(tune))


def _guard_commands(sub: typer.Typer) -> None:
    """Give every command of a sub-app (and of its own sub-apps) the root's error handling:
    an error outside dnntune's is one line and a hint, not a traceback (``overrides`` was
    mounted without it: audit, session 18). A command that guards itself is guarded twice,
    which changes nothing (the inner guard's exits pass through the outer one). A sub-app's
    own callback is a command too: ``bench`` runs in its callback, and its errors and a Ctrl-C
    outside the suite loop were raw tracebacks (new-user audit, session 19)."""
    info = sub.registered_callback
    if info is not None and info.callback is not None:
        info.callback = _guarded(info.callback)
    for command in sub.registered_commands:
        if command.callback is not None:
            command.callback = _guarded(command.callback)
    for group in sub.registered_groups:
        if group.typer_instance is not None:
            _guard_commands(group.typer_instance)


def _mount_optional(name: str, module: str, help_text: str | None = None) -> None:
    """Add a sub-app that another part of dnntune ships, if it imports.

    Imported here, not at the top, so that a sub-app whose module is missing or broken (an
    optional dependency, work in progress) costs only its own command, never the whole CLI.
    """
    try:
        sub = importlib.import_module(module).app
    except ImportError as exc:
        _log.debug("cli: %s not available: %s", module, exc)
        return
    except Exception as exc:  # a broken sub-app costs its own command only
        _log.warning("cli: `dnntune %s` is unavailable: %s: %s", name, type(exc).__name__, exc)
        return
    _guard_commands(sub)
    if help_text is None:
        app.add_typer(sub, name=name)
    else:
        app.add_typer(sub, name=name, help=help_text)


_mount_optional("bench", "dnntune.cli.bench_cmd")
_mount_optional(
    "overrides",
    "dnntune.cli.overrides_cmd",
    "Inspect, merge and generalize engine-override files (what `dnntune tune` writes).",
)
_mount_optional(
    "heuristics",
    "dnntune.cli.heuristics_cmd",
    "Train and inspect the learned engine ranking (HeuristicMode.B) from tuning history.",
)
_mount_optional(
    "cache",
    "dnntune.cli.cache_cmd",
    "Show or clear what dnntune keeps in its cache folder (DNNTUNE_CACHE_DIR).",
)
accept_log_flags(app)  # `dnntune tune ... -v` as `dnntune -v tune ...`
refuse_option_names_as_values(app)  # `run --json -g g.json` wrote its results to `-g`
use_flag_help(app)  # after every command and sub-app is added: flags show no `<bool>`


def _meant(done: SystemExit) -> tuple[object, bool]:
    """The code ``done`` means, and whether it is a usage error's. typer prints a usage error
    (click's ClickException: ``--bogus``, a bad value) and exits with its code (2) while
    handling it; when the message cannot be written (``2>&1 | head -0``), rich's handler of
    the closed stream exits 1 in its place, which read as 141, and the usage error's 2 was
    lost. The exception typer was handling is in the exit's context either way (rich's exit
    has the BrokenPipeError it handled in between)."""
    shown = done.__context__
    if isinstance(shown, BrokenPipeError):
        shown = shown.__context__
    if isinstance(shown, _CLICK_ERROR):
        return getattr(shown, "exit_code", done.code), True
    return done.code, False


def main() -> None:
    """The CLI, once imported: ``_dnntune_cli.main`` (the ``dnntune`` console script and
    ``python -m dnntune``) imports this module and calls it under its Ctrl-C guard."""
    watch = OutputWatch()
    try:
        try:
            app(prog_name="dnntune")
        except KeyboardInterrupt:
            # outside a command's guard (typer building its commands): exit as a command does,
            # and through exit_rank below in a torchrun job
            err_console().print("interrupted")
            raise SystemExit(EXIT_INTERRUPTED) from None
    except SystemExit as done:
        from dnntune.distributed.env import exit_rank, used_a_group

        code = watch.exit_code(*_meant(done))
        if not used_a_group():
            if code is done.code:
                raise
            raise SystemExit(code) from None
        # a rank of a torchrun job ends without the interpreter's teardown (exit_rank says why)
        if isinstance(code, str):  # sys.exit("message") prints it and means 1
            print(code, file=sys.stderr)
        exit_rank(code if isinstance(code, int) else int(code is not None))
