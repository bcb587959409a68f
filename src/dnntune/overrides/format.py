"""The engine-override config file (RFC 0013 section 6.5): entries, parsing, serialization.

A file is a JSON object::

    {"version": 2, "engine_overrides": [{"op": ..., "engine_name": ..., "criteria": {...},
      "tensors": [{"tensor_id": ..., "dim": [...], "stride": [...]}], "autotune_metadata": {...}}]}

``version`` missing means v1, the legacy positional format (tensors matched by position);
version 2 names each tensor after the core node's input field (``x_tensor_uid``). A document
without ``engine_overrides`` (a graph, a heuristics model) is not an override file of any
version and is refused, naming the file; ``{"version": 2, "engine_overrides": []}`` is a valid
empty one. The reader is lenient where the RFC says so (unknown fields ignored, metadata
informational, knobs optional) and strict about the fields that decide a match: a malformed
``op``, ``engine_name``, ``criteria`` or ``tensors`` makes the whole file unreadable, as in
hipDNN, and the error names the JSON path of the bad field. So does a non-finite number
anywhere in the document (``NaN``, ``Infinity``, or a literal such as ``1e999`` that
overflows): Python's ``json`` reads them, but they are not JSON and no writer could write the
file back; and so does an object that names a key twice (``json`` kept the last value). The
writer applies the same rule before it appends
(:func:`dnntune.overrides.writer.check_appendable`), so a file that readers would ignore is
never extended.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune._file_kinds import RUN_RESULTS, TUNE_REPORT, document_kind
from dnntune._json_keys import DuplicateKeyError, loads
from dnntune.backend.knobs import KnobSetting, KnobValue
from dnntune.errors import ConfigFileError
from dnntune.overrides.json_text import dumps, has_non_finite, non_finite_path

__all__ = [
    "CURRENT_VERSION",
    "LEGACY_VERSION",
    "NAMED_TENSOR_IDS_VERSION",
    "OverrideEntry",
    "OverrideFile",
    "TensorPattern",
    "WILDCARD",
    "canonical_tensor_id",
    "dumps",
    "knob_from_json",
    "knob_to_json",
    "load_file",
    "parse_document",
    "parse_entry",
    "parse_text",
]

_log = logging.getLogger(__name__)

LEGACY_VERSION = 1
NAMED_TENSOR_IDS_VERSION = 2
CURRENT_VERSION = NAMED_TENSOR_IDS_VERSION
#: a dim or stride of -1 in a file matches any value (reader only; the writer never emits it)
WILDCARD = -1

#: knob ``type`` spellings the reader accepts, mapped to the Python type of the value
_KNOB_TYPE_ALIASES: dict[str, type] = {
    "int": int,
    "int64": int,
    "int64_t": int,
    "integer": int,
    "long": int,
    "double": float,
    "float": float,
    "float64": float,
    "real": float,
    "string": str,
    "str": str,
}
_KNOB_TYPE_NAMES: dict[type, str] = {int: "int", float: "double", str: "string"}


def canonical_tensor_id(tensor_id: str) -> str:
    """The node field a file's ``tensor_id`` names: ``"X"`` and ``"x"`` mean ``x_tensor_uid``.

    The RFC's example writes ``"X"``/``"W"`` while hipDNN's tests write the field names; both
    are accepted on read. The writer always writes field names.
    """
    text = tensor_id.strip().lower()
    return text if text.endswith("_tensor_uid") else f"{text}_tensor_uid"


# ---- knobs -----------------------------------------------------------------------------------
def knob_to_json(setting: KnobSetting) -> dict[str, Any]:
    """``{"knob_id", "type", "value"}`` with ``type`` one of ``int``, ``double``, ``string``.

    JSON does not tell an int64 from a double, hence the explicit type. A non-finite double is
    written as the string ``"inf"``/``"-inf"``/``"nan"`` (JSON has no literal for it).
    """
    value = setting.value
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return {"knob_id": setting.knob_id, "type": "int", "value": value}
    if isinstance(value, float):
        out: float | str = value if math.isfinite(value) else repr(value)
        return {"knob_id": setting.knob_id, "type": "double", "value": out}
    if isinstance(value, str):
        return {"knob_id": setting.knob_id, "type": "string", "value": value}
    raise ConfigFileError(f"knob {setting.knob_id}: value {value!r} is not an int, float or str")


def knob_from_json(obj: Any, where: str = "knob") -> KnobSetting:
    """Parse one knob object; the ``type`` field (or, if absent, the JSON value) sets the type.

    Raises:
        ConfigFileError: naming ``where`` and the problem.
    """
    if not isinstance(obj, Mapping):
        raise ConfigFileError(f"{where}: expected an object, got {obj!r}")
    knob_id = obj.get("knob_id")
    if not isinstance(knob_id, str) or not knob_id:
        raise ConfigFileError(f"{where}.knob_id: expected a non-empty string, got {knob_id!r}")
    if "value" not in obj:
        raise ConfigFileError(f"{where}.value: missing")
    raw = obj["value"]
    type_name = obj.get("type")
    if type_name is None:
        if isinstance(raw, bool):
            return KnobSetting(knob_id, int(raw))
        if isinstance(raw, int | float | str):
            return KnobSetting(knob_id, raw)
        raise ConfigFileError(f"{where}.value: expected a number or a string, got {raw!r}")
    if not isinstance(type_name, str) or type_name.strip().lower() not in _KNOB_TYPE_ALIASES:
        valid = ", ".join(sorted(_KNOB_TYPE_ALIASES))
        raise ConfigFileError(
            f"{where}.type: unknown knob type {type_name!r}; expected one of {valid}"
        )
    wanted = _KNOB_TYPE_ALIASES[type_name.strip().lower()]
    return KnobSetting(knob_id, _coerce_knob_value(raw, wanted, f"{where}.value"))


def _coerce_knob_value(raw: Any, wanted: type, where: str) -> KnobValue:
    if wanted is str:
        if not isinstance(raw, str):
            raise ConfigFileError(f"{where}: type is string but the value is {raw!r}")
        return raw
    if wanted is int:
        if isinstance(raw, bool):
            return int(raw)
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.strip(), 0)
            except ValueError:
                pass
        raise ConfigFileError(f"{where}: type is int but the value is {raw!r}")
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        try:
            return float(raw)
        except OverflowError:  # an integer literal beyond any double: 1 followed by 400 zeros
            raise ConfigFileError(
                f"{where}: type is double but the value {_short(raw)} is too large for one"
            ) from None
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            pass
    raise ConfigFileError(f"{where}: type is double but the value is {raw!r}")


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 400-digit integer in a message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


# ---- entries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorPattern:
    """One ``tensors[]`` item: an optional id, dims and strides (``-1`` = any; no stride = any)."""

    tensor_id: str | None
    dim: tuple[int, ...]
    stride: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tensor_id is not None:
            out["tensor_id"] = self.tensor_id
        out["dim"] = list(self.dim)
        if self.stride:
            out["stride"] = list(self.stride)
        return out


@dataclass
class OverrideEntry:
    """One ``engine_overrides[]`` item, parsed; ``raw`` keeps the object as it was read."""

    op: str
    engine_name: str
    criteria: dict[str, int] = field(default_factory=dict)
    tensors: list[TensorPattern] = field(default_factory=list)
    metadata: dict[str, Any] | None = None
    #: knobs of ``autotune_metadata.knobs``, typed; None when absent (default-knob entry)
    knobs: list[KnobSetting] | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The entry as written: ``criteria`` only when non-empty, metadata when present."""
        out: dict[str, Any] = {"op": self.op, "engine_name": self.engine_name}
        if self.criteria:
            out["criteria"] = dict(sorted(self.criteria.items()))
        out["tensors"] = [t.to_json() for t in self.tensors]
        if self.metadata is not None:
            out["autotune_metadata"] = self.metadata
        return out

    @property
    def device(self) -> str | None:
        """The device the entry was tuned on (``autotune_metadata.device``, the name of its
        device signature, e.g. ``NVIDIA H200``); None when it names none (written by hand)."""
        device = (self.metadata or {}).get("device")
        return str(device) if device else None


@dataclass
class OverrideFile:
    """A parsed file: its version (1 when the key is missing), entries, and where it came from."""

    version: int = CURRENT_VERSION
    entries: list[OverrideEntry] = field(default_factory=list)
    #: False when the document had no ``version`` key (legacy v1)
    has_version: bool = True
    source: str = ""

    @property
    def named_tensor_ids(self) -> bool:
        """v2 files match tensors by id ignoring order; v1 files by position."""
        return self.has_version and self.version >= NAMED_TENSOR_IDS_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "engine_overrides": [e.to_json() for e in self.entries]}

    def devices(self) -> Counter[str]:
        """How many entries were tuned on each device (:attr:`OverrideEntry.device`); entries
        that name none are not counted."""
        return Counter(device for device in (e.device for e in self.entries) if device)


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ConfigFileError(f"{where}: expected a list of integers, got {value!r}")
    return tuple(value)


def _parse_tensor(obj: Any, where: str) -> TensorPattern:
    if not isinstance(obj, Mapping):
        raise ConfigFileError(f"{where}: expected an object, got {obj!r}")
    tensor_id = obj.get("tensor_id")
    if tensor_id is not None and (not isinstance(tensor_id, str) or not tensor_id.strip()):
        raise ConfigFileError(f"{where}.tensor_id: expected a non-empty string, got {tensor_id!r}")
    if "dim" not in obj:
        raise ConfigFileError(f"{where}.dim: missing")
    dim = _int_list(obj["dim"], f"{where}.dim")
    stride_raw = obj.get("stride")
    stride = () if stride_raw is None else _int_list(stride_raw, f"{where}.stride")
    return TensorPattern(tensor_id, dim, stride)


def _parse_criteria(obj: Any, where: str) -> dict[str, int]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise ConfigFileError(f"{where}: expected an object of integers, got {obj!r}")
    out: dict[str, int] = {}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigFileError(f"{where}.{key}: expected an integer, got {value!r}")
        out[str(key)] = value
    return out


#: entry problems already warned about: a file is parsed again whenever it changes (and on
#: every read while it is freshly written, :mod:`dnntune.overrides.file_cache`), and one
#: warning per problem per process is enough (DEBUG after that)
_REPORTED: set[str] = set()


def _warn_once(message: str, *args: object) -> None:
    text = message % args
    level = logging.DEBUG if text in _REPORTED else logging.WARNING
    _REPORTED.add(text)
    _log.log(level, "%s", text)


def _parse_knobs(metadata: Mapping[str, Any], where: str) -> list[KnobSetting] | None:
    """Metadata knobs; informational, so a bad knob list is dropped with a warning, not fatal."""
    raw = metadata.get("knobs")
    if raw is None:
        return None
    if not isinstance(raw, list):
        _warn_once("%s.knobs: expected a list, got %r; knobs ignored", where, raw)
        return None
    try:
        return [knob_from_json(k, f"{where}.knobs[{i}]") for i, k in enumerate(raw)]
    except ConfigFileError as exc:
        _warn_once("%s; knobs of this entry ignored", exc)
        return None


def parse_entry(obj: Any, where: str = "entry", *, with_knobs: bool = True) -> OverrideEntry:
    """Parse one ``engine_overrides[]`` object (raises ConfigFileError naming ``where``)."""
    if not isinstance(obj, Mapping):
        raise ConfigFileError(f"{where}: expected an object, got {obj!r}")
    op = obj.get("op")
    if not isinstance(op, str) or not op.strip():
        raise ConfigFileError(f"{where}.op: expected a non-empty string, got {op!r}")
    engine = obj.get("engine_name")
    if isinstance(engine, int) and not isinstance(engine, bool):
        engine = str(engine)
    if not isinstance(engine, str) or not engine.strip():
        raise ConfigFileError(f"{where}.engine_name: expected a name or an id, got {engine!r}")
    tensors_raw = obj.get("tensors", [])
    if not isinstance(tensors_raw, list):
        raise ConfigFileError(f"{where}.tensors: expected a list, got {tensors_raw!r}")
    tensors = [_parse_tensor(t, f"{where}.tensors[{i}]") for i, t in enumerate(tensors_raw)]
    metadata_raw = obj.get("autotune_metadata")
    metadata: dict[str, Any] | None = None
    knobs: list[KnobSetting] | None = None
    if isinstance(metadata_raw, Mapping):
        metadata = dict(metadata_raw)
        if with_knobs:
            knobs = _parse_knobs(metadata, f"{where}.autotune_metadata")
    elif metadata_raw is not None:
        _warn_once("%s.autotune_metadata: expected an object; ignored", where)
    return OverrideEntry(
        op=op.strip(),
        engine_name=engine.strip(),
        criteria=_parse_criteria(obj.get("criteria"), f"{where}.criteria"),
        tensors=tensors,
        metadata=metadata,
        knobs=knobs,
        raw=dict(obj),
    )


def _json_type(value: Any) -> str:
    names = {dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _what_it_looks_like(doc: Mapping[str, Any]) -> str:
    """What a document that is not an override file seems to be, for the error: `` (it looks
    like a graph file)``, its ``format``, else its first top-level keys."""
    if "nodes" in doc and "tensors" in doc:
        return " (it looks like a graph file)"
    if isinstance(doc.get("format"), str):
        return f" (its format is {doc['format']!r})"
    if "schema_version" in doc and isinstance(doc.get("graphs"), list):
        return " (it looks like `dnntune bench` results)"
    keys = [str(k) for k in doc]
    if not keys:
        return " (it is an empty object)"
    more = f", ... ({len(keys)} keys)" if len(keys) > 5 else ""
    return f" (its keys: {', '.join(keys[:5])}{more})"


def _list_kind(doc: Any) -> str:
    """What a top-level JSON list or value that is no override file seems to be: a tune
    report (``dnntune tune --report``, new-user audit, session 56) or run results
    (``dnntune run --json``) named so (recognised as :func:`dnntune._file_kinds.document_kind`
    recognises them for every reader), else its JSON type."""
    kind = document_kind(doc)
    if kind is TUNE_REPORT:
        return (
            " (it looks like a tune report, dnntune tune --report; the override file is the "
            "one tune wrote with -o)"
        )
    if kind is RUN_RESULTS:
        return " (it looks like `dnntune run --json` results)"
    return " (it is a JSON list)" if isinstance(doc, list) else f" (it is {_json_type(doc)})"


def parse_document(doc: Any, source: str = "", *, with_knobs: bool = True) -> OverrideFile:
    """Parse a loaded JSON document (raises ConfigFileError naming the file and JSON path).

    The document must be an object with an ``engine_overrides`` list; ``version`` is optional
    (missing: legacy v1).

    ``with_knobs=False`` skips the typed ``autotune_metadata.knobs`` (and their warnings): the
    writer checks a file's validity that way without parsing what it does not use.
    """
    prefix = f"{source}: " if source else ""
    if not isinstance(doc, Mapping):
        raise ConfigFileError(f"{prefix}expected a JSON object at the top level{_list_kind(doc)}")
    has_version = "version" in doc
    version = doc.get("version", LEGACY_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigFileError(f"{prefix}version: expected an integer, got {version!r}")
    if version < LEGACY_VERSION or version > CURRENT_VERSION:
        fix = (
            "written by a newer dnntune: upgrade dnntune to read it, or re-tune with this one "
            "(`dnntune tune -o FILE`)"
            if version > CURRENT_VERSION
            else f"no dnntune writes it: set it to {CURRENT_VERSION} if its tensors are named "
            "by id (x_tensor_uid), or re-tune (`dnntune tune -o FILE`)"
        )
        raise ConfigFileError(
            f"{prefix}version: {version} is not supported "
            f"(this dnntune reads {LEGACY_VERSION}..{CURRENT_VERSION}); {fix}"
        )
    if "engine_overrides" not in doc:
        raise ConfigFileError(
            f'{prefix}not an engine-override file: it has no "engine_overrides" list'
            f"{_what_it_looks_like(doc)}; an override file is what `dnntune tune -o` writes: "
            f'{{"version": {CURRENT_VERSION}, "engine_overrides": [...]}}'
        )
    raw_entries = doc["engine_overrides"]
    if not isinstance(raw_entries, list):
        raise ConfigFileError(
            f"{prefix}engine_overrides: expected a list of entries, got {_json_type(raw_entries)}"
        )
    bad_number = non_finite_path(doc) if has_non_finite(doc) else None
    if bad_number is not None:
        raise ConfigFileError(
            f"{prefix}{bad_number}: not a finite number (NaN and Infinity are not valid JSON)"
        )
    try:
        entries = [
            parse_entry(e, f"engine_overrides[{i}]", with_knobs=with_knobs)
            for i, e in enumerate(raw_entries)
        ]
    except ConfigFileError as exc:
        raise ConfigFileError(f"{prefix}{exc}") from None
    return OverrideFile(version, entries, has_version, source)


def parse_text(text: str, source: str = "") -> OverrideFile:
    """Parse file content (raises ConfigFileError for invalid JSON or a malformed field).

    A leading UTF-8 byte-order mark (which Windows editors write) is skipped, as hipDNN's JSON
    reader skips it, so a file it reads is read here too.
    """
    prefix = f"{source}: " if source else ""
    if not text.removeprefix("\ufeff").strip():
        # said plainly: "invalid JSON: Expecting value: line 1 column 1 (char 0)" told a user who
        # had created the file (`touch overrides.json`) nothing
        raise ConfigFileError(
            f"{prefix}the file is empty: an override file is JSON, "
            '{"version": 2, "engine_overrides": [...]}; `dnntune tune GRAPH... -o FILE` fills '
            "it (an empty file is started afresh)"
        )
    try:
        doc = loads(text.removeprefix("\ufeff"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConfigFileError(f"{prefix}invalid JSON: {exc}") from None
    except DuplicateKeyError as exc:  # json kept the last value, silently
        raise ConfigFileError(f"{prefix}{exc}") from None
    return parse_document(doc, source)


def load_file(path: str | Path) -> OverrideFile:
    """Read and parse ``path`` (raises ConfigFileError if it cannot be read or parsed)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:  # a binary file, or text in another encoding
        raise ConfigFileError(
            f"{p}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "an override file is JSON in UTF-8"
        ) from None
    return parse_text(text, str(p))
