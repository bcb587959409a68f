"""Value checks of the RFC data types' fields (:mod:`dnntune.rfc`): a member of an enum given
as itself or its exact string, a list of engine ids or names, a hint for a float count, a time
budget. Each raises InvalidValueError naming the field, the value and what it takes (the budget
check returns its message, for callers that raise their own error type)."""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, TypeVar

from dnntune.errors import InvalidValueError

__all__ = [
    "MAX_BUDGET_S",
    "budget_error",
    "engine_ids",
    "enum_field",
    "member",
    "whole_number_hint",
]

_E = TypeVar("_E", bound=enum.Enum)


def enum_field(name: str, value: Any, enum_type: type[_E], also: str = "") -> _E:
    """``value`` as a member of ``enum_type``: the member itself or its exact string value."""
    if isinstance(value, enum_type):
        return value
    found = member(enum_type, value)
    if found is not None:
        return found
    valid = ", ".join(f"{enum_type.__name__}.{m.name} ({m.value!r})" for m in enum_type)
    hint = ""
    if isinstance(value, str) and member(enum_type, value.lower()) is not None:
        hint = f"; did you mean {value.lower()!r}?"
    or_none = f", or {also}" if also else ""
    raise InvalidValueError(
        f"AutotuneConfig.{name} must be one of {valid}{or_none}; got {value!r}{hint}"
    )


def member(enum_type: type[_E], value: Any) -> _E | None:
    """The member whose value is exactly the string ``value``, else None."""
    if type(value) is not str:
        return None
    for member in enum_type:
        if member.value == value:
            return member
    return None


def engine_ids(value: Any) -> list[int]:
    """``engine_id_filter`` as a list: one engine id or name alone becomes a list of one (a
    string is not read letter by letter), and every entry is an id (int) or an engine name."""
    if isinstance(value, str | numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple):
        raise InvalidValueError(
            "AutotuneConfig.engine_id_filter must be a list of engine ids or names (e.g. "
            f'["CUDNN_ENGINE"]), got {type(value).__name__} {value!r}'
        )
    for entry in value:
        if isinstance(entry, bool) or not isinstance(entry, str | numbers.Integral):
            raise InvalidValueError(
                "AutotuneConfig.engine_id_filter entries must be engine ids (int) or names "
                f"(str), got {type(entry).__name__} {entry!r} in {value!r}"
            )
    return list(value)


def whole_number_hint(value: Any) -> str:
    """For a float count, a whole number to pass instead (``int(2.5)`` is 2)."""
    if isinstance(value, float) and math.isfinite(value):
        return f"; pass a whole number such as {int(value)}"
    return ""


#: the largest time budget taken, in seconds (about 31,700 years; no limit is None)
MAX_BUDGET_S = 1e12


def budget_error(name: str, value: object) -> str | None:
    """Why ``value`` is not a time budget (``name`` says whose), else None: a number of seconds,
    not a bool, above 0 and below :data:`MAX_BUDGET_S` (NaN and infinity are neither)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and 0.0 < value < MAX_BUDGET_S:  # type: ignore[operator]
        return None
    return (
        f"{name} must be a finite number of seconds > 0 and below {MAX_BUDGET_S:g}, got {value!r}"
    )
