"""JSON text whose objects name each key once: :func:`loads`.

Python's ``json`` takes an object that names a key twice and keeps the last value, without a
word. In a hand-edited file that hides a mistake: an override file's
``{"version": 2, ..., "version": 3}`` read as version 3, an entry with two ``engine_name`` lines
lost one; a graph node with two ``causal_mask`` lines, or a heuristics model with two
``format_version`` lines, ran with whichever came last. Every reader of dnntune's own JSON
files (graphs, override files, heuristics models and records, ``bench compare``'s results and
the files ``heuristics train`` reads) parses with :func:`loads`, which refuses such
an object (:class:`DuplicateKeyError`, naming the key, its JSON path and line); each reader
says it in its own error.

Its own layer, just above the exception tree: ``graph/``, ``backend/``, ``overrides/``,
``learning/`` and ``bench/`` all read with it.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

from dnntune.errors import ConfigFileError

__all__ = ["DuplicateKeyError", "loads"]


class DuplicateKeyError(ConfigFileError):
    """A JSON object names a key twice: ``where`` (its JSON path), ``key``, ``line`` (of the
    second one, None where it cannot be told)."""

    def __init__(self, where: str, key: str, line: int | None) -> None:
        self.where, self.key, self.line = where, key, line
        at = f" (again on line {line})" if line is not None else ""
        #: the message without ``where``, for a reader that names the place its own way
        self.problem = (
            f"the key {json.dumps(key)} appears twice{at}; a reader would keep only the last "
            "value: delete the one you do not mean"
        )
        super().__init__(f"{where}: {self.problem}")


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``, refusing an object that names a key twice (DuplicateKeyError, for
    the first such object to close; ValueError and RecursionError as ``json.loads``).

    The check costs one call per object; the path and the line are found only for the error.
    Bytes are decoded as ``json.loads`` decodes them (UTF-8, -16 or -32, told from the start).
    """
    if not isinstance(text, str):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
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
