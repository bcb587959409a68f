"""What every tuning-history reader (:mod:`dnntune.learning.sources`) shares: the
:class:`Collected` it appends records and notes to, and the checks that read one JSON field
without trusting its shape (a malformed field reads as None, never raises)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dnntune.graph.json_numbers import finite_float
from dnntune.learning.records import Record

__all__ = ["Collected", "field_of", "json_error", "knobs_of", "ms_of", "name_of"]


@dataclass
class Collected:
    """What :func:`collect` found: records, the files they came from, and what was skipped."""

    records: list[Record] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def ms_of(value: Any) -> float | None:
    """A time in ms: a finite JSON number > 0 (a huge integer too), else None."""
    number = finite_float(value)
    return number if number is not None and number > 0 else None


def knobs_of(items: Any) -> dict[str, Any]:
    """Knob settings as a mapping; items without a string ``knob_id`` are left out."""
    if isinstance(items, Mapping):
        return {k: v for k, v in items.items() if isinstance(k, str)}
    if isinstance(items, list):
        return {
            k["knob_id"]: k.get("value")
            for k in items
            if isinstance(k, Mapping) and isinstance(k.get("knob_id"), str)
        }
    return {}


def field_of(doc: Any, key: str) -> Any:
    """``doc[key]`` where ``doc`` is a JSON object, else None (a malformed record)."""
    return doc.get(key) if isinstance(doc, Mapping) else None


def name_of(value: Any) -> str | None:
    """A non-empty string (an engine or device name), else None."""
    return value if isinstance(value, str) and value else None


def json_error(exc: Exception) -> str:
    """What was wrong with a file that did not parse (a RecursionError says it too vaguely)."""
    return "invalid JSON: nested too deeply" if isinstance(exc, RecursionError) else str(exc)
