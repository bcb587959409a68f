"""``--device``: a handle for the device a command was given, with errors worded for the CLI.

:func:`dnntune.backend.handle.create_handle` speaks to Python callers (``use device='cpu'``);
a command line user types ``--device cpu`` (audit, session 18).
"""

from __future__ import annotations

import typer

from dnntune.backend.handle import Handle, create_handle
from dnntune.errors import DnnTuneError

__all__ = ["cli_device_message", "handle_for"]

_PREFIX = "create_handle: "


def cli_device_message(message: str) -> str:
    """``create_handle``'s message as the CLI says it: no function name, ``--device cpu``
    instead of the Python argument ``device='cpu'``."""
    return message.removeprefix(_PREFIX).replace("use device='cpu'", "use --device cpu")


def handle_for(device: str | None) -> Handle:
    """The handle of ``--device`` (None: cuda when available, else cpu).

    Raises:
        typer.BadParameter: the device is not known or not available here (exit 2).
    """
    try:
        return create_handle(device)
    except DnnTuneError as exc:
        raise typer.BadParameter(cli_device_message(str(exc)), param_hint="'--device'") from None
