"""The ``dnntune`` console script: the CLI's imports, and the CLI, under one Ctrl-C guard.

This module lies outside the ``dnntune`` package on purpose: importing anything inside it runs
``dnntune/__init__.py``, which imports torch (seconds), and an entry point in there could only
start guarding once that was done; a Ctrl-C meanwhile printed a page of traceback. Here nothing
heavy is imported before the ``try``, so an interrupt at any point of startup, or of a command,
ends with one line on stderr and exit code 130, as a command interrupted mid-run does.

SIGTERM (``kill PID``, ``timeout``, a batch scheduler ending or preempting the job) stops a
command the way Ctrl-C does, so what it finished is kept and said (``bench``'s results file,
``run --json``, ``tune``'s table), and the exit code is 143 (128 + SIGTERM). Python's default
ended the process on the spot: no summary, and ``bench`` lost the graphs measured since its
last periodic write of the results file. A second SIGTERM ends it at once.

``python -m dnntune`` imports the ``dnntune`` package (torch: seconds) before this module's
:func:`main` can run, so the package's first import, ``dnntune._startup``, calls
:func:`guard_package_import`: until :func:`main` starts, Ctrl-C ends the process with the same
line and code 130 (SIGTERM: 143), where it printed a page of KeyboardInterrupt traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "guard_package_import", "main"]

#: Ctrl-C (128 + SIGINT), the code every dnntune command exits with when interrupted
EXIT_INTERRUPTED = 130
#: SIGTERM (128 + SIGTERM): stopped as by Ctrl-C, and said with the signal's own code
EXIT_TERMINATED = 143

_terminated = False
_main_pid = os.getpid()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Stop the command as Ctrl-C does: raise KeyboardInterrupt in the main thread."""
    global _terminated
    # the next SIGTERM takes the default action (the process ends at once)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getpid() != _main_pid:  # a forked child inherited this handler: end as it would have
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _terminated = True
    raise KeyboardInterrupt


def _stop_on_sigterm() -> None:
    """Install :func:`_on_sigterm`, unless SIGTERM is ignored (``nohup``-style launchers) or
    this is not the main thread (signal handlers can only be set there)."""
    global _main_pid
    _main_pid = os.getpid()
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


#: the module names ``python -m`` runs the CLI by
_CLI_MODULES = ("dnntune", "dnntune.__main__")

#: Python's own handlers of the signals the startup guard takes
_DEFAULTS: dict[signal.Signals, signal.Handlers | Callable[[int, FrameType | None], Any]] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
}


def _runs_the_cli() -> bool:
    """Whether this process is ``python -m dnntune`` still looking for the module to run: Python
    sets ``sys.argv[0]`` to ``-m`` until then, and ``sys.orig_argv`` ends with the module's name
    (``-m dnntune``, or ``-mdnntune`` in one word) and then the command's own arguments."""
    if sys.argv[:1] != ["-m"]:
        return False
    given = sys.orig_argv[len(sys.orig_argv) - len(sys.argv)] if sys.orig_argv else ""
    return given in _CLI_MODULES or any(given.endswith(f"m{m}") for m in _CLI_MODULES)


def _stop_startup(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or SIGTERM while Python imports the package: end as :func:`main` would. The line
    is written to the file descriptor itself: a signal handler must not write to ``sys.stderr``
    (the main thread may be inside a write to it)."""
    with contextlib.suppress(OSError):
        os.write(2, b"interrupted\n")
    raise SystemExit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED)


def guard_package_import() -> None:
    """``python -m dnntune``: stop on Ctrl-C or SIGTERM without a traceback until :func:`main`
    starts (anything else importing ``dnntune`` is left alone). A signal that is ignored or
    handled already (``nohup``, a launcher's own handler) is left so."""
    if not _runs_the_cli():
        return
    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to guard
        for signum, default in _DEFAULTS.items():
            if signal.getsignal(signum) is default:
                signal.signal(signum, _stop_startup)


def _end_startup_guard() -> None:
    """Give Ctrl-C and SIGTERM back to Python's defaults, where :func:`guard_package_import`
    took them: from here :func:`main`'s own guards answer them."""
    with contextlib.suppress(ValueError, OSError):
        for signum, default in _DEFAULTS.items():
            if signal.getsignal(signum) is _stop_startup:
                signal.signal(signum, default)


def main() -> None:
    """Run the ``dnntune`` command line (``sys.argv``); exit 130 with one line on Ctrl-C, 143
    on SIGTERM."""
    try:
        try:
            # inside the guard: a Ctrl-C right after Python's handler is back is answered too
            _end_startup_guard()
            _stop_on_sigterm()
            from dnntune.cli.app import main as cli_main  # torch, typer, rich, the providers

            cli_main()
        except KeyboardInterrupt:
            # a command's own guard says more ("interrupted after 3 graphs of 17") and exits
            # 130 itself; this is the rest: the imports above, before any command runs
            with contextlib.suppress(OSError, ValueError):  # stderr gone (a pipe's reader quit)
                print("interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
    except SystemExit as done:
        if _terminated and done.code == EXIT_INTERRUPTED:
            sys.exit(EXIT_TERMINATED)
        raise


if __name__ == "__main__":
    main()
