"""A reader that stops reading (``dnntune tune -g lib | head -1``): the command still finishes
its work, quietly, and exits 141.

Python ignores SIGPIPE, so a write to a pipe whose reader is gone raises BrokenPipeError. rich
answered it by pointing stdout at /dev/null and exiting 1 on the spot, without a word: what a
command writes after its table (``tune --report``, ``run --json``, ``bench --plot``) was lost,
and the exit code said that a graph had failed. The CLI's consoles now point the closed stream
at /dev/null, as Python's documentation recommends, and the command goes on to its end: every
file it writes is written as without the pipe (the tables print after the work, so the work is
done by then), and nothing more is printed to that stream. The exit code is then 141 (128 +
SIGPIPE), what the shell reports for git, ls or cat killed by SIGPIPE, so ``set -o pipefail``
scripts see the same status from dnntune as from them; a failure of the command's own (1, 2, 3,
130, 143) says more, and is kept: a usage error's 2 too, when its own message is what could not
be written.

:class:`OutputWatch` is the entry point's half: it flushes the streams at the end (what was
written outside the consoles), notices a stream that another handler pointed at /dev/null
(rich's default one, which typer's help and usage output use: it exits 1), and picks the code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["EXIT_CLOSED_OUTPUT", "OutputWatch", "output_closed"]

#: the exit code once stdout or stderr was closed by its reader: 128 + SIGPIPE
EXIT_CLOSED_OUTPUT = 141

#: the file descriptors this module pointed at /dev/null, and whether any stream was closed
_ours: set[int] = set()
_closed: list[bool] = [False]


def output_closed(stream: Any) -> None:
    """``stream``'s reader is gone: point its file descriptor at /dev/null, so that what is still
    written to it (its buffer too) goes nowhere without an error, and remember it for the exit
    code. A stream without a descriptor (a test's capture) is only remembered."""
    _closed[0] = True
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, fd)
        _ours.add(fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def _identity(fd: int | str) -> tuple[int, int] | None:
    """The file an open descriptor (or a path) is, as (device, inode); None if unknown."""
    try:
        st = os.fstat(fd) if isinstance(fd, int) else os.stat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class OutputWatch:
    """What stdout and stderr were when the CLI started; at its end, the exit code."""

    def __init__(self) -> None:
        _ours.clear()
        _closed[0] = False
        self._start = {fd: _identity(fd) for fd in (1, 2)}

    def exit_code(self, code: object, usage_error: bool = False) -> object:
        """``code``, or :data:`EXIT_CLOSED_OUTPUT` when a reader went away: in place of success
        (0, None), and in place of the 1 that rich's default handler exits with, unless
        ``code`` is a usage error's own (the caller found it under rich's exit)."""
        for stream in dict.fromkeys((sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
            if stream is None:
                continue
            try:
                stream.flush()  # what was written outside the consoles and is still buffered
            except BrokenPipeError:
                output_closed(stream)
            except (OSError, ValueError):
                pass
        devnull = _identity(os.devnull)
        swapped = devnull is not None and any(
            fd not in _ours and start != devnull and _identity(fd) == devnull
            for fd, start in self._start.items()
        )
        if swapped and code in (0, 1, None) and not usage_error:
            return EXIT_CLOSED_OUTPUT
        if _closed[0] and code in (0, None):
            return EXIT_CLOSED_OUTPUT
        return code
