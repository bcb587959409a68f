"""An option's value that is one of the command's own option names is a usage error.

click gives an option that takes a value the next word whatever it is, so ``dnntune run --json
-g graph.json`` (``--json`` is a flag of ``engines``) wrote the results to a file named ``-g``
and ran ``graph.json`` as a positional path, exit 0; ``tune -o -g g.json`` would have written
the winners there. A command of :func:`refuse_option_names_as_values` says which option lacks
its value instead (exit 2).
"""

from __future__ import annotations

from typing import Any

import typer

from dnntune.cli._mixins import mix_into

__all__ = ["refuse_option_names_as_values"]


class _NoOptionNameValues:
    """Mixin for click commands and groups: after parsing, no option holds one of the
    command's option names (``-g``, ``--graph``, ``-o``...) as its value."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        rest: list[str] = super().parse_args(ctx, args)  # type: ignore[misc]
        if ctx.resilient_parsing:
            return rest
        params = getattr(self, "params", [])
        names = {name for p in params for name in getattr(p, "opts", []) if name.startswith("-")}
        for param in params:
            if getattr(param, "param_type_name", "") != "option" or param.is_flag or param.count:
                continue
            value = ctx.params.get(param.name)
            values = value if isinstance(value, list | tuple) else [value]
            taken = next((str(v) for v in values if v is not None and str(v) in names), None)
            if taken is not None:
                option = max(param.opts, key=len)
                raise typer.BadParameter(
                    f"got the option {taken} as its value; give {option} a value before it "
                    f"(`{option} VALUE {taken} ...`)",
                    ctx=ctx,
                    param=param,
                )
        return rest


def refuse_option_names_as_values(app: typer.Typer) -> None:
    """Give ``app``, its commands and its sub-apps (recursively) the check."""
    mix_into(app, _NoOptionNameValues)
