"""Non-finite numbers in graph JSON: written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``.

JSON has no literal for an infinity or a NaN. Python's ``json`` writes the tokens ``Infinity``
and ``NaN``, which strict parsers (jq, JavaScript's ``JSON.parse``, Go's ``encoding/json``)
refuse, so a graph with a clamp bound of ``float("inf")`` was saved as a file only Python
could read. The writer now puts the strings ``"inf"``, ``"-inf"`` and ``"nan"`` where such a
number goes: a pass-by-value scalar's ``value``, a float parameter (``relu_upper_clip``, ...),
and a field dnntune does not model but keeps. The strings cannot be mistaken for a value:
every field dnntune reads a float from takes a JSON number, and took nothing else before.

The reader takes both the strings (in the fields it reads floats from) and the bare tokens of
files written by earlier versions (Python's ``json`` reads those); any other string in such a
field is an error naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from dnntune.errors import GraphFormatError

__all__ = [
    "NON_FINITE",
    "finite_float",
    "non_finite_from_json",
    "short_repr",
    "strict_json_numbers",
]

#: the strings written for the non-finite floats, and what each one reads as
NON_FINITE: dict[str, float] = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_SPELLINGS = ", ".join(f'"{s}"' for s in NON_FINITE)


def finite_float(value: Any) -> float | None:
    """``value`` as a float where it is a JSON number (not a bool) that is finite as a float,
    else None: an integer too large for a float (JSON allows ``1`` followed by 400 zeros) is
    None, where ``math.isfinite`` and ``float`` raise OverflowError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message (an integer of 400
    digits would fill the screen)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def non_finite_from_json(raw: str, where: str, what: str) -> float:
    """The float a string in a number field stands for: ``"inf"``, ``"-inf"`` or ``"nan"``.

    Args:
        raw: the string found in the field.
        where: the JSON path of the field, for the error.
        what: what the field holds (``"a number for Float32Value"``), for the error.

    Raises:
        GraphFormatError: any other string, naming ``where`` and the accepted spellings.
    """
    value = NON_FINITE.get(raw)
    if value is None:
        raise GraphFormatError(
            where,
            f"expected {what}, or one of {_SPELLINGS} for a non-finite one, got {raw!r}",
        )
    return value


def strict_json_numbers(doc: Any) -> Any:
    """``doc`` with every non-finite float, at any depth, replaced by its string
    (:data:`NON_FINITE`), so ``json.dumps(doc, allow_nan=False)`` succeeds.

    Changes the dicts and lists of ``doc`` in place (tuples become lists): pass a document
    built for writing, not one the caller keeps. Iterative, so no nesting depth that ``json``
    accepts can overflow the stack.
    """
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else _name(doc)
    if isinstance(doc, tuple):
        doc = list(doc)
    if not isinstance(doc, dict | list):
        return doc
    isfinite = math.isfinite
    stack: list[Any] = [doc]
    while stack:
        box = stack.pop()
        keys = box.keys() if isinstance(box, dict) else range(len(box))
        for key in keys:
            value = box[key]
            if isinstance(value, float):
                if not isfinite(value):
                    box[key] = _name(value)
            elif isinstance(value, dict | list):
                stack.append(value)
            elif isinstance(value, tuple):
                box[key] = list(value)
                stack.append(box[key])
    return doc
