"""Adding a behaviour (a mixin class) to every command and group class of a typer app, its
sub-apps included: how the CLI's help format (``_help``), its option-value check
(``_option_values``) and its log flags after a command (``_verbosity``) reach every command."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import DefaultPlaceholder

__all__ = ["mix_into"]


def _with(cls: Any, mixin: type, default: type) -> Any:
    """``cls`` (a command or group class, or typer's placeholder for its default) with
    ``mixin`` first in its bases; ``default`` stands for a class not given. A custom class (one
    that rewrites its arguments) is kept, with the mixin added."""
    if isinstance(cls, DefaultPlaceholder):
        cls = cls.value
    if cls is None:
        cls = default
    if issubclass(cls, mixin):
        return cls
    return type(cls.__name__, (mixin, cls), {"__module__": cls.__module__})


def mix_into(
    app: typer.Typer,
    mixin: type,
    *,
    command: type = TyperCommand,
    group: type | None = TyperGroup,
) -> None:
    """Give ``app``'s commands (default class ``command``) and, unless ``group`` is None, its
    group (default class ``group``) ``mixin``; the same for its sub-apps, recursively."""
    if group is not None:
        app.info.cls = _with(app.info.cls, mixin, group)
    for registered in app.registered_commands:
        registered.cls = _with(registered.cls, mixin, command)
    for sub in app.registered_groups:
        if sub.typer_instance is not None:
            mix_into(sub.typer_instance, mixin, command=command, group=group)
