"""The ``dnntune`` console script: the CLI's imports, and the CLI, under one Ctrl-C guard.

This module lies outside the ``dnntune`` package on purpose: importing anything inside it runs
``dnntune/__init__.py``, which imports torch (seconds), and an entry point in there could only
start guarding once that was done; a Ctrl-C meanwhile printed a page of traceback. Here nothing
heavy is imported before the ``try``, so an interrupt at any point of startup, or of a command,
ends with one line on stderr and exit code 130, as a command interrupted mid-run does.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["EXIT_INTERRUPTED", "main"]

#: Ctrl-C (128 + SIGINT), the code every dnntune command exits with when interrupted
EXIT_INTERRUPTED = 130


def main() -> None:
    """Run the ``dnntune`` command line (``sys.argv``); exit 130 with one line on Ctrl-C."""
    try:
        from dnntune.cli.app import main as cli_main  # torch, typer, rich, the providers

        cli_main()
    except KeyboardInterrupt:
        # a command's own guard says more ("interrupted after 3 graphs of 17") and exits 130
        # itself; this is the rest: the imports above, before any command runs
        with contextlib.suppress(OSError, ValueError):  # stderr gone (a pipe's reader quit)
            print("interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
