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
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "main"]

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


def main() -> None:
    """Run the ``dnntune`` command line (``sys.argv``); exit 130 with one line on Ctrl-C, 143
    on SIGTERM."""
    _stop_on_sigterm()
    try:
        try:
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
