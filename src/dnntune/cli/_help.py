"""Help screens that show no value placeholder after a flag.

typer's rich help prints the value type of every option, flags included (``--details <bool>``,
``--help <bool>``, ``-v <int>``), although a flag takes no value; click's plain help leaves it
out. The command and group classes here give each flag and counter an empty metavar, which the
help prints instead of a type; :func:`use_flag_help` puts them under every command of an app.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from dnntune.cli._mixins import mix_into

__all__ = ["FlagHelpCommand", "FlagHelpGroup", "use_flag_help"]


class _FlagHelp:
    """Mixin for click commands: flags and counters get the metavar ``""`` (parsing ignores it)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            takes_no_value = getattr(param, "is_flag", False) or getattr(param, "count", False)
            if takes_no_value and param.metavar is None:
                param.metavar = ""
        return params


class FlagHelpCommand(_FlagHelp, TyperCommand):
    """A typer command whose help shows flags without a type."""


class FlagHelpGroup(_FlagHelp, TyperGroup):
    """A typer group (an app with sub-commands) whose help shows flags without a type."""


def use_flag_help(app: typer.Typer) -> None:
    """Make ``app``, its commands and its sub-apps (recursively) show flags without a type."""
    mix_into(app, _FlagHelp, command=FlagHelpCommand, group=FlagHelpGroup)
