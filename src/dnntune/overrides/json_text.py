"""An override file's JSON as text: the numbers JSON has no spelling for, and the layout
dnntune writes.

Python's ``json`` reads ``NaN``, ``Infinity`` and literals that overflow (``1e999``), but they
are not JSON and no writer could write the file back: :func:`has_non_finite` finds them (on the
reader's path, for every parse) and :func:`non_finite_path` names the first for the error.
Python's ``json`` also takes an object that names a key twice, keeping the last value: a
hand-edited ``{"version": 2, ..., "version": 3}`` read as version 3, an entry with two
``engine_name`` lines lost one without a word. :func:`loads` refuses such an object
(:class:`DuplicateKeyError`, naming the key, its JSON path and line).
:func:`dumps` writes a document as dnntune's override files are laid out.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dnntune.errors import ConfigFileError

__all__ = ["DuplicateKeyError", "dumps", "has_non_finite", "loads", "non_finite_path"]

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


class DuplicateKeyError(ConfigFileError):
    """A JSON object names a key twice: ``where`` (its JSON path), ``key``, ``line`` (of the
    second one, None where it cannot be told)."""

    def __init__(self, where: str, key: str, line: int | None) -> None:
        self.where, self.key, self.line = where, key, line
        at = f" (again on line {line})" if line is not None else ""
        super().__init__(
            f"{where}: the key {json.dumps(key)} appears twice{at}; a reader would keep only "
            "the last value: delete the one you do not mean"
        )


def loads(text: str) -> Any:
    """``json.loads(text)``, refusing an object that names a key twice (DuplicateKeyError, for
    the first such object to close; ValueError and RecursionError as ``json.loads``).

    The check costs one call per object; the path and the line are found only for the error.
    """
    found: list[tuple[dict[str, Any], str, int]] = []
    closed = [0]

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs) and not found:
            keys = [k for k, _ in pairs]
            key = next(k for i, k in enumerate(keys) if k in keys[:i])
            found.append((obj, key, closed[0]))
        closed[0] += 1
        return obj

    doc = json.loads(text, object_pairs_hook=pairs_hook)
    if not found:
        return doc
    obj, key, index = found[0]
    raise DuplicateKeyError(_path_of(doc, obj), key, _duplicate_line(text, index, key))


def _path_of(doc: Any, target: object) -> str:
    """The JSON path of the object ``target`` (by identity) in ``doc``."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if value is target:
            return where or "(top level)"
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
    return "(top level)"


def _duplicate_line(text: str, index: int, key: str) -> int | None:
    """The line of the second ``key`` of the ``index``-th object to close in ``text``: parsed
    again by the pure-Python scanner, which says where each object starts and ends; the keys of
    the objects nested in it are blanked out before the key is looked for. None where the key
    is spelled otherwise (escapes) or the text is too deep for the Python scanner."""
    spans: list[tuple[int, int]] = []
    # the pure-Python parts of json, which typeshed does not declare
    json_object: Any = vars(json.decoder)["JSONObject"]
    py_make_scanner: Any = vars(json.scanner)["py_make_scanner"]

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[Any, int]:
        obj, end = json_object(s_and_end, *args)
        spans.append((s_and_end[1] - 1, end))
        return obj, end

    decoder: Any = json.JSONDecoder()
    decoder.parse_object = parse_object
    decoder.scan_once = py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except (ValueError, RecursionError):
        return None
    if index >= len(spans):
        return None
    start, end = spans[index]
    body = list(text[start:end])
    for s, e in spans[:index]:
        if start < s and e <= end:
            body[s - start + 1 : e - start] = " " * (e - s - 1)
    keys = list(re.finditer(re.escape(json.dumps(key)) + r"\s*:", "".join(body)))
    if len(keys) < 2:
        return None
    return text.count("\n", 0, start + keys[1].start()) + 1


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
