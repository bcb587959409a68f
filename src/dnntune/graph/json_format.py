"""hipDNN's graph JSON serialization: ``to_json`` / ``from_json`` with exact round trips.

Every problem in a document raises :class:`GraphFormatError` naming the JSON path of the bad
field (``nodes[2].inputs.w_tensor_uid: tensor uid 7 not defined``), never a KeyError/TypeError.

Layouts follow hipDNN's serializers op by op (each :class:`OpSpec` says where a field or
parameter lives: ``inputs``/``outputs`` maps, ``parameters``, ``attributes``, or the node
object itself). Reading (here) is lenient about where a key sits and records where it found
each one; writing (:mod:`dnntune.graph.json_writer`) patches the loaded objects, so keys dnntune
does not model, their order and their spelling survive: ``graph_to_dict(graph_from_dict(doc))
== doc``. Loading validates the graph unless asked not to.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from dnntune.errors import GraphFormatError, InvalidValueError
from dnntune.graph.ir import OpGraph, TensorError
from dnntune.graph.json_writer import VALUE_TYPES, dtype_value, graph_to_dict
from dnntune.graph.node import Node
from dnntune.graph.ops import ALL_SPECS, spec_for, spec_for_json
from dnntune.graph.ops.base import NodeError
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = [
    "SCHEMA_PATH",
    "graph_from_dict",
    "graph_from_json_text",
    "graph_problems",
    "graph_to_dict",
    "load_schema",
    "read_graph_text",
    "validate_loaded",
]

SCHEMA_PATH = Path(__file__).with_name("graph.schema.json")

G = TypeVar("G", bound=OpGraph)
T = TypeVar("T")

_NODE_KEYS = ("type", "name", "compute_data_type")
_SECTIONS = ("inputs", "outputs", "parameters", "attributes")
_INT64 = (-(2**63), 2**63 - 1)

_INT_VALUE_TYPES = ("Int32Value", "Int64Value")


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the graph format, shipped in the package."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


# ---- reading ------------------------------------------------------------------------------
def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _get(
    obj: dict[str, Any],
    key: str,
    path: str,
    kind: type | tuple[type, ...],
    what: str,
    required: bool = True,
    default: Any = None,
) -> Any:
    if key not in obj:
        if required:
            raise GraphFormatError(_join(path, key), f"required field missing ({what})")
        return default
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise GraphFormatError(_join(path, key), f"expected {what}, got {value!r}")
    return value


def _parse(path: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise GraphFormatError(path, str(exc)) from None


def _dtype(value: str, path: str) -> DataType | None:
    return _parse(path, lambda: dtype_value(value))


def _int(value: Any, path: str, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphFormatError(path, f"expected {what}, got {value!r}")
    if not minimum <= value <= _INT64[1]:
        raise GraphFormatError(path, f"{what} must be between {minimum} and 2**63-1, got {value}")
    return value


def _int_list(obj: dict[str, Any], key: str, path: str, minimum: int) -> list[int]:
    values = _get(obj, key, path, list, "a list of integers")
    what = "an integer >= 1" if minimum == 1 else "an integer >= 0"
    return [_int(v, f"{path}.{key}[{i}]", minimum, what) for i, v in enumerate(values)]


def _tensor_from_dict(obj: Any, path: str) -> TensorAttributes:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected a tensor object, got {_type_name(obj)}")
    uid = _int(_get(obj, "uid", path, int, "an integer uid"), f"{path}.uid", _INT64[0], "a uid")
    name = _get(obj, "name", path, str, "a string")
    dims = _int_list(obj, "dims", path, 1)
    if not dims:
        raise GraphFormatError(f"{path}.dims", "a tensor needs at least one dim")
    strides = _int_list(obj, "strides", path, 0)
    if len(strides) != len(dims):
        raise GraphFormatError(
            f"{path}.strides", f"{len(strides)} strides for {len(dims)} dims {dims}"
        )
    dtype_text = _get(obj, "data_type", path, str, "a data type string")
    dtype = _dtype(dtype_text, f"{path}.data_type")
    virtual = _get(obj, "virtual", path, bool, "true or false")
    value: float | int | None = None
    from_value_type = False
    if "value" in obj or "value_type" in obj:
        vt = _get(obj, "value_type", path, str, "a value type string")
        if vt not in VALUE_TYPES:
            raise GraphFormatError(
                f"{path}.value_type",
                f"unsupported value type {vt!r}; expected one of {', '.join(VALUE_TYPES)}",
            )
        kinds: tuple[type, ...] = (int,) if vt in _INT_VALUE_TYPES else (int, float)
        value = _get(obj, "value", path, kinds, f"a number for {vt}")
        if dtype is None:
            dtype, from_value_type = VALUE_TYPES[vt], True
    t = TensorAttributes(
        name=name,
        dims=dims,
        strides=strides,
        data_type=dtype,
        uid=uid,
        is_virtual=virtual,
        value=value,
    )
    if dtype_text.lower() == "unset":
        t._json_unset = True
        t._auto_data_type = not from_value_type
        t._spec_data_type = from_value_type
    t._json_source = copy.deepcopy(obj)
    return t


def _find(
    obj: dict[str, Any],
    keys: tuple[str, ...],
    sections: tuple[str, ...],
    taken: set[tuple[str, str]],
) -> tuple[tuple[str, str], Any] | None:
    """The first (section, key) holding one of ``keys``, searching ``sections`` in order."""
    for section in sections:
        box = obj if section == "" else obj.get(section)
        if not isinstance(box, dict):
            continue
        for key in keys:
            if key in box and (section, key) not in taken:
                if section == "" and key in (*_NODE_KEYS, *_SECTIONS):
                    continue
                return (section, key), box[key]
    return None


def _unique(*items: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _defined_uids(by_uid: Mapping[int, Any]) -> str:
    """The uids the file's ``tensors`` define, for a message about one it does not: runs
    written as ranges, at most a few dozen shown."""
    uids = sorted(by_uid)
    if not uids:
        return "the graph has no tensors"
    runs: list[str] = []
    start = prev = uids[0]
    for u in [*uids[1:], None]:
        if u is not None and u == prev + 1:
            prev = u
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if u is not None:
            start = prev = u
    shown = ", ".join(runs[:24]) + (", ..." if len(runs) > 24 else "")
    plural = "s" if len(uids) > 1 else ""
    return f"its tensors have uid{plural} {shown}"


def _where(path: str, loc: tuple[str, str]) -> str:
    return _join(_join(path, loc[0]), loc[1]) if loc[0] else _join(path, loc[1])


def _node_from_dict(obj: Any, path: str, by_uid: dict[int, TensorAttributes]) -> Node:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected a node object, got {_type_name(obj)}")
    type_name = _get(obj, "type", path, str, "a node type string")
    spec = spec_for_json(type_name)
    if spec is None:
        known = ", ".join(s.json_type for s in ALL_SPECS)
        raise GraphFormatError(
            f"{path}.type", f"unsupported node type {type_name!r}; dnntune supports {known}"
        )
    name = _get(obj, "name", path, str, "a string")
    compute_text = _get(obj, "compute_data_type", path, str, "a data type string", False, "unset")
    compute = _dtype(compute_text, f"{path}.compute_data_type")
    for section in _SECTIONS:
        if section in obj and not isinstance(obj[section], dict):
            raise GraphFormatError(
                f"{path}.{section}", f"expected an object, got {_type_name(obj[section])}"
            )
    if not spec.flat_io:
        for section in ("inputs", "outputs"):
            _get(obj, section, path, dict, "an object of *_tensor_uid fields")
    taken: set[tuple[str, str]] = set()
    locations: dict[str, tuple[str, str]] = {}
    io: dict[str, dict[str, TensorAttributes | None]] = {"inputs": {}, "outputs": {}}
    for section, fields in (("inputs", spec.all_inputs), ("outputs", spec.all_outputs)):
        for f in fields:
            own = spec.location(f)[0]
            found = _find(
                obj, _unique(spec.json_fields.get(f, f), f), _unique(own, section, ""), taken
            )
            if found is None:
                continue
            loc, uid = found
            taken.add(loc)
            locations[f] = loc
            if uid is None:
                continue
            where = _where(path, loc)
            if isinstance(uid, bool) or not isinstance(uid, int):
                raise GraphFormatError(where, f"expected a tensor uid (integer), got {uid!r}")
            if uid not in by_uid:
                raise GraphFormatError(
                    where, f"tensor uid {uid} not defined ({_defined_uids(by_uid)})"
                )
            io[section][f] = by_uid[uid]
    params: dict[str, Any] = spec.defaults()
    for p in spec.params:
        own = spec.location(p.name)[0]
        found = _find(
            obj, _unique(p.key, p.name), _unique(own, "", *_SECTIONS[2:], "inputs"), taken
        )
        if found is None:
            continue
        loc, raw = found
        taken.add(loc)
        locations[p.name] = loc
        try:
            params[p.name] = p.parse(raw, p.name)
        except ValueError as exc:
            raise GraphFormatError(_where(path, loc), str(exc)) from None
    extra: dict[str, Any] = {}
    for section in ("", *_SECTIONS):
        box = obj if section == "" else obj.get(section)
        if not isinstance(box, dict):
            continue
        for key, value in box.items():
            if (section, key) in taken or (section == "" and key in (*_NODE_KEYS, *_SECTIONS)):
                continue
            dotted = f"{section}.{key}" if section else key
            where = _where(path, (section, key))
            if dotted in spec.json_constants:
                if value not in (None, [], spec.json_constants[dotted]):
                    raise GraphFormatError(
                        where,
                        f"dnntune does not support {key} on {type_name}; expected "
                        f"{json.dumps(spec.json_constants[dotted])}, got {value!r}",
                    )
                continue
            if key.endswith("_tensor_uid") and value not in (None, []):
                raise GraphFormatError(
                    where, f"unsupported field for {type_name}; dnntune does not model it"
                )
            extra[dotted] = copy.deepcopy(value)
    return Node(
        name=name,
        kind=spec.kind,
        inputs=io["inputs"],
        outputs=io["outputs"],
        params=params,
        compute_data_type=compute,
        json_extra=extra,
        json_source=copy.deepcopy(obj),
        json_locations=locations,
    )


class _Problems:
    """Where reading a document sends a problem: raised at once, or collected to go on."""

    def __init__(self, collect: bool) -> None:
        self.found: list[GraphFormatError] | None = [] if collect else None

    def add(self, exc: GraphFormatError) -> None:
        if self.found is None:
            raise exc
        self.found.append(exc)

    def attempt(self, fn: Callable[[], T], default: T) -> T:
        """``fn()``, or ``default`` after recording its GraphFormatError (when collecting)."""
        try:
            return fn()
        except GraphFormatError as exc:
            self.add(exc)
            return default


def _dtype_field(doc: dict[str, Any], key: str) -> DataType | None:
    return _dtype(_get(doc, key, "", str, "a data type string"), key)


def _read_graph(doc: Any, graph_cls: type[G], problems: _Problems) -> G:
    """The graph of a parsed document, not validated; every problem goes to ``problems``.

    When collecting, a bad top-level field, tensor or node is recorded and reading goes on with
    the rest (one problem per tensor and per node: the first). A node is not blamed for naming
    a tensor whose own entry was bad.
    """
    if not isinstance(doc, dict):
        problems.add(
            GraphFormatError("", f"a graph document must be a JSON object, got {_type_name(doc)}")
        )
        return graph_cls()
    name = problems.attempt(partial(_get, doc, "name", "", str, "a string"), "")
    dtypes = {
        key: problems.attempt(partial(_dtype_field, doc, key), None)
        for key in ("compute_data_type", "io_data_type", "intermediate_data_type")
    }
    tensors: list[Any] = problems.attempt(
        partial(_get, doc, "tensors", "", list, "a list of tensors"), []
    )
    nodes: list[Any] = problems.attempt(
        partial(_get, doc, "nodes", "", list, "a list of nodes"), []
    )
    graph = graph_cls(name=name, **dtypes)
    by_uid: dict[int, TensorAttributes] = {}
    for i, obj in enumerate(tensors):
        t = problems.attempt(partial(_tensor_from_dict, obj, f"tensors[{i}]"), None)
        if t is None:
            uid = obj.get("uid") if isinstance(obj, dict) else None
            if isinstance(uid, int) and not isinstance(uid, bool) and uid not in by_uid:
                by_uid[uid] = TensorAttributes(name="?", uid=uid)  # stands in for the bad one
            continue
        assert t.uid is not None
        if t.uid in by_uid:
            problems.add(GraphFormatError(f"tensors[{i}].uid", f"duplicate tensor uid {t.uid}"))
            continue
        by_uid[t.uid] = t
        graph.tensors.append(t)  # uids are unique here: add_tensor's identity scan not needed
        t._graphs.append(graph)  # so an edit of the tensor reaches the graph, as add_tensor does
    for i, obj in enumerate(nodes):
        node = problems.attempt(partial(_node_from_dict, obj, f"nodes[{i}]", by_uid), None)
        if node is not None:
            graph.nodes.append(node)
    return graph


def graph_problems(doc: Any, graph_cls: type[OpGraph] = OpGraph) -> list[GraphFormatError]:
    """Every problem of a graph document, each with its JSON path; [] when it is valid.

    ``doc`` is JSON text or the parsed document. Problems in the document's structure come
    first: every bad top-level field, and the first problem of every bad tensor and node. When
    the structure is sound, the graph is validated and every validation problem is reported
    (:meth:`OpGraph.problems`). :func:`graph_from_dict` raises the first of these.
    """
    if isinstance(doc, str | bytes | bytearray):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as exc:
            return [
                GraphFormatError(
                    "", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
                )
            ]
        except (TypeError, ValueError, RecursionError) as exc:
            return [GraphFormatError("", f"cannot decode: {exc}")]
    problems = _Problems(collect=True)
    graph = _read_graph(doc, graph_cls, problems)
    assert problems.found is not None
    if problems.found:
        return problems.found
    _mark_outputs(graph)
    return [
        exc
        if isinstance(exc, GraphFormatError)
        else GraphFormatError(_path_for(graph, exc), str(exc))
        for exc in graph.problems()
    ]


def _mark_outputs(graph: OpGraph) -> None:
    produced = graph.producers()
    for t in graph.tensors:
        if id(t) in produced and not t.is_virtual:
            t.is_output = True


def graph_from_dict(doc: Any, graph_cls: type[G], *, validate: bool = True) -> G:
    """Build a graph of class ``graph_cls`` from a parsed JSON document.

    Args:
        doc: the parsed document.
        graph_cls: the class to build (``OpGraph`` or a subclass such as ``dnntune.Graph``).
        validate: also validate the graph, reporting problems as GraphFormatError with the
            JSON path of the node field or tensor they concern.

    Raises:
        GraphFormatError: with the JSON path of the first bad field (:func:`graph_problems`
            lists them all).
    """
    graph = _read_graph(doc, graph_cls, _Problems(collect=False))
    _mark_outputs(graph)
    graph.json_source = {
        key: None if key in ("tensors", "nodes") else copy.deepcopy(value)
        for key, value in doc.items()
    }
    if validate:
        validate_loaded(graph)
    return graph


def graph_from_json_text(
    text: str, graph_cls: type[G], source: str = "<string>", *, validate: bool = True
) -> G:
    """Parse JSON text; every problem becomes GraphFormatError naming the path (and file)."""
    if not isinstance(text, str | bytes | bytearray):  # an already parsed (non-object) value
        return graph_from_dict(text, graph_cls, validate=validate)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphFormatError(
            "", f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise GraphFormatError("", f"{source}: cannot decode: {exc}") from None
    try:
        return graph_from_dict(doc, graph_cls, validate=validate)
    except GraphFormatError as exc:
        if source == "<string>":
            raise
        raise GraphFormatError(exc.json_path, f"{exc.problem} (in {source})") from None


def read_graph_text(path: str | Path) -> str:
    """The text of a graph file, decoded as UTF-8 (JSON's encoding, whatever the locale says).

    Raises:
        InvalidValueError: the file cannot be read (the message names it and the reason).
        GraphFormatError: the file is not UTF-8 text (a binary file, another encoding); the
            message gives the offset of the first bad byte.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InvalidValueError(f"cannot read graph file {p}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise GraphFormatError(
            "",
            f"{p}: not a UTF-8 text file (byte 0x{bad} at offset {exc.start}); a graph file "
            "is JSON text",
        ) from None


def validate_loaded(graph: OpGraph) -> None:
    """Validate a loaded graph, turning InvalidValueError into GraphFormatError with a path."""
    try:
        graph.validate()
    except GraphFormatError:
        raise
    except InvalidValueError as exc:
        raise GraphFormatError(_path_for(graph, exc), str(exc)) from None


def _path_for(graph: OpGraph, exc: InvalidValueError) -> str:
    """The JSON path of the node field or tensor an error is about ("" for the whole graph)."""
    if isinstance(exc, NodeError):
        index = next((i for i, n in enumerate(graph.nodes) if n is exc.node), None)
        if index is None:
            return ""
        path = f"nodes[{index}]"
        spec = spec_for(exc.node.kind)
        field = exc.field
        known = field in spec.all_inputs or field in spec.all_outputs or spec.has_param(field)
        if not known:
            return path
        loc = exc.node.json_locations.get(field) or spec.location(field)
        return _where(path, loc)
    if isinstance(exc, TensorError):
        index = next((i for i, t in enumerate(graph.tensors) if t is exc.tensor), None)
        if index is None:
            return ""
        return _join(f"tensors[{index}]", exc.field) if exc.field else f"tensors[{index}]"
    return ""
