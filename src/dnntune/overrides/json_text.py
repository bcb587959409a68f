"""An override file's JSON as text: the numbers JSON has no spelling for, and the layout
dnntune writes.

Python's ``json`` reads ``NaN``, ``Infinity`` and literals that overflow (``1e999``), but they
are not JSON and no writer could write the file back: :func:`has_non_finite` finds them (on the
reader's path, for every parse) and :func:`non_finite_path` names the first for the error.
An object that names a key twice is refused by the parse itself (:mod:`dnntune._json_keys`).
:func:`dumps` writes a document as dnntune's override files are laid out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["dumps", "has_non_finite", "non_finite_path"]

_JSON_SCALARS = (str, int, type(None))  # bool is an int


def has_non_finite(doc: Any) -> bool:
    """Whether ``doc`` holds a NaN or infinity anywhere: the walk of :func:`non_finite_path`
    without the JSON paths, which are built only for the error. Building one per value took
    most of a file's parse (4 of 6 ms for a 91-entry file), and the file was read again for
    every graph the Config policy is asked about: ``dnntune.torch``'s first call of each new
    shape paid it per layer (new-user audit: a GPT block's step at a new length 60 ms, 23 ms
    without the file). Since then the file is also parsed once per state of the file
    (:mod:`dnntune.overrides.file_cache`)."""
    isfinite = math.isfinite
    stack: list[Any] = [doc]
    pop, extend = stack.pop, stack.extend
    while stack:
        value = pop()
        if isinstance(value, float):
            if not isfinite(value):
                return True
        elif isinstance(value, dict):
            extend(value.values())
        elif isinstance(value, list):
            extend(value)
        elif not isinstance(value, _JSON_SCALARS) and isinstance(value, Mapping):
            extend(value.values())
    return False


def non_finite_path(doc: Any) -> str | None:
    """The JSON path of the first NaN or infinity in ``doc`` (document order), or None.

    Iterative, so a deeply nested document that ``json`` accepted cannot overflow the stack.
    """
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "(top level)"
        if isinstance(value, Mapping):
            items = [(f"{where}.{k}" if where else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))
    return None


def dumps(doc: Mapping[str, Any] | Sequence[Any]) -> str:
    """Serialize a document as dnntune writes override files: indent 2, short lists inline.

    Lists of scalars (``dim``, ``stride``) stay on one line so an entry reads at a glance;
    everything else is indented. Raises ValueError for NaN/infinity (not valid JSON).
    """
    return _pretty(doc, 0) + "\n"


def _pretty(value: Any, level: int) -> str:
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {_pretty(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        if all(not isinstance(v, Mapping | list | tuple) for v in value):
            return json.dumps(list(value), allow_nan=False)
        return "[\n" + ",\n".join(f"{inner}{_pretty(v, level + 1)}" for v in value) + f"\n{pad}]"
    return json.dumps(value, allow_nan=False)
