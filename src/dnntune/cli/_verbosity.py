"""The log level the global options set (``-v``, ``-vv``, ``-q``), before or after the command.

``dnntune -v tune ...`` is the documented form, but ``dnntune tune -g g.json -v`` (where
``bench -v`` and most tools take it) was a usage error, "No such option: -v", with no hint that
the option exists one word earlier. A command of :func:`accept_log_flags` takes them after its
name too and sets the same level: the counts add up (``dnntune -v tune -v`` is ``-vv``) and
``-q`` wins. A command that has options of those names itself (``bench``) keeps its own.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import typer

from dnntune import settings
from dnntune.cli._mixins import mix_into
from dnntune.cli._output import configure_logging

__all__ = ["accept_log_flags", "set_verbosity", "verbosity"]

#: -1 with -q, else the number of -v given (before and after the command)
_state: dict[str, int] = {"verbosity": 0}

_VERBOSE = re.compile(r"-v+")
_QUIET = ("-q", "--quiet")


def verbosity() -> int:
    """-1 (``-q``), 0 (default), 1 (``-v``) or more (``-vv``)."""
    return _state["verbosity"]


def set_verbosity(verbose: int, quiet: bool) -> None:
    """Set the log level of ``-v`` counted ``verbose`` times, or of ``-q``."""
    if quiet:
        level = logging.ERROR
    elif verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1:
        level = logging.INFO
    else:
        configure_logging(logging.WARNING)  # so that a bad DNNTUNE_LOG_LEVEL's warning shows
        level = settings.log_level() or logging.WARNING
    _state["verbosity"] = -1 if quiet else verbose
    configure_logging(level)


class _LogFlagsAfterCommand:
    """Mixin for click commands: ``-v``/``-vv``/``--verbose``/``-q``/``--quiet`` among the
    command's arguments (before a ``--``) set the global level, unless the command has an
    option of that name itself."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        own = {name for p in getattr(self, "params", []) for name in getattr(p, "opts", [])}
        rest: list[str] = []
        verbose, quiet, seen = 0, False, False
        for i, arg in enumerate(args):
            if arg == "--":
                rest.extend(args[i:])
                break
            if arg not in own and (_VERBOSE.fullmatch(arg) or arg == "--verbose"):
                verbose += 1 if arg == "--verbose" else len(arg) - 1
                seen = True
            elif arg not in own and arg in _QUIET:
                quiet = seen = True
            else:
                rest.append(arg)
        if seen:
            before = _state["verbosity"]
            set_verbosity(max(before, 0) + verbose, quiet or before < 0)
        parsed: list[str] = super().parse_args(ctx, rest)  # type: ignore[misc]
        return parsed


def accept_log_flags(app: typer.Typer) -> None:
    """Let every command of ``app`` and of its sub-apps (recursively) take the global log
    options after its name. Groups are left alone: their options come before a command."""
    mix_into(app, _LogFlagsAfterCommand, group=None)
