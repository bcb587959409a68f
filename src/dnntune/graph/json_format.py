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
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from dnntune._json_keys import DuplicateKeyError, loads
from dnntune.errors import GraphFormatError, InvalidValueError
from dnntune.graph.ir import OpGraph, TensorError
from dnntune.graph.json_nodes import (
    field_path,
    get_field,
    join_path,
    json_type_name,
    node_from_dict,
    parse_dtype,
    tensor_from_dict,
)
from dnntune.graph.json_writer import graph_to_dict
from dnntune.graph.ops import spec_for
from dnntune.graph.ops.base import NodeError
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import INT64_RANGE, DataType

__all__ = [
    "SCHEMA_PATH",
    "graph_from_dict",
    "graph_from_json_text",
    "graph_from_source",
    "graph_problems",
    "graph_to_dict",
    "load_schema",
    "parse_graph_text",
    "read_graph_text",
    "validate_loaded",
]

SCHEMA_PATH = Path(__file__).with_name("graph.schema.json")

G = TypeVar("G", bound=OpGraph)
T = TypeVar("T")

_NODE_KEYS = ("type", "name", "compute_data_type")
_SECTIONS = ("inputs", "outputs", "parameters", "attributes")

_INT_VALUE_TYPES = ("Int32Value", "Int64Value")


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the graph format, shipped in the package."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


# ---- reading (the tensors and nodes: :mod:`dnntune.graph.json_nodes`) ---------------------


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
    return parse_dtype(get_field(doc, key, "", str, "a data type string"), key)


def _read_graph(doc: Any, graph_cls: type[G], problems: _Problems) -> G:
    """The graph of a parsed document, not validated; every problem goes to ``problems``.

    When collecting, a bad top-level field, tensor or node is recorded and reading goes on with
    the rest (one problem per tensor and per node: the first). A node is not blamed for naming
    a tensor whose own entry was bad.
    """
    if not isinstance(doc, dict):
        problems.add(
            GraphFormatError(
                "", f"a graph document must be a JSON object, got {json_type_name(doc)}"
            )
        )
        return graph_cls()
    name = problems.attempt(partial(get_field, doc, "name", "", str, "a string"), "")
    dtypes = {
        key: problems.attempt(partial(_dtype_field, doc, key), None)
        for key in ("compute_data_type", "io_data_type", "intermediate_data_type")
    }
    tensors: list[Any] = problems.attempt(
        partial(get_field, doc, "tensors", "", list, "a list of tensors"), []
    )
    nodes: list[Any] = problems.attempt(
        partial(get_field, doc, "nodes", "", list, "a list of nodes"), []
    )
    graph = graph_cls(name=name, **dtypes)
    by_uid: dict[int, TensorAttributes] = {}
    for i, obj in enumerate(tensors):
        t = problems.attempt(partial(tensor_from_dict, obj, f"tensors[{i}]"), None)
        if t is None:
            uid = obj.get("uid") if isinstance(obj, dict) else None
            if (
                isinstance(uid, int)
                and not isinstance(uid, bool)
                and INT64_RANGE[0] <= uid <= INT64_RANGE[1]  # a uid a tensor can hold
                and uid not in by_uid
            ):
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
        node = problems.attempt(partial(node_from_dict, obj, f"nodes[{i}]", by_uid), None)
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
            doc = parse_graph_text(doc)
        except GraphFormatError as exc:
            return [exc]
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
    return graph_from_source(parse_graph_text(text, source), graph_cls, source, validate=validate)


def graph_from_source(
    doc: Any, graph_cls: type[G], source: str = "<string>", *, validate: bool = True
) -> G:
    """:func:`graph_from_dict` of the document parsed from ``source`` (a file's path), whose
    problems name it (``... (in g.json)``); ``"<string>"``, text given in Python, is not named.
    """
    try:
        return graph_from_dict(doc, graph_cls, validate=validate)
    except GraphFormatError as exc:
        if source == "<string>":
            raise
        raise GraphFormatError(exc.json_path, f"{exc.problem} (in {source})") from None


def parse_graph_text(text: str | bytes | bytearray, source: str | None = None) -> Any:
    """The parsed document of a graph file's text; every problem is a GraphFormatError, which
    names ``source`` when given (a file's path; ``"<string>"`` for text given in Python).

    An object that names a key twice is refused (:func:`dnntune._json_keys.loads`), naming its
    JSON path, the key and the line: Python's ``json`` kept the last value without a word, so
    a node with two ``causal_mask`` lines ran with whichever came last, and ``validate`` said
    ok.
    """
    prefix = "" if source is None else f"{source}: "
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise GraphFormatError(
            "", f"{prefix}invalid JSON at line {exc.lineno} column {exc.colno}: {_said(exc)}"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise GraphFormatError("", f"{prefix}cannot decode: {exc}") from None
    except DuplicateKeyError as exc:
        where = "" if exc.where == "(top level)" else exc.where
        # named where graph_from_json_text names a file in the problems of its document
        in_file = "" if source in (None, "<string>") else f" (in {source})"
        raise GraphFormatError(where, f"{exc.problem}{in_file}") from None


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
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise GraphFormatError(
            "",
            f"{p}: not a UTF-8 text file (byte 0x{bad} at offset {exc.start}); a graph file "
            "is JSON text",
        ) from None
    # a byte-order mark that an editor put first: skipped, as the override-file reader skips it
    # (hipDNN's reader does); json refused it with "decode using utf-8-sig" (new-user audit)
    return text.removeprefix("\ufeff")


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
        return field_path(path, loc)
    if isinstance(exc, TensorError):
        index = next((i for i, t in enumerate(graph.tensors) if t is exc.tensor), None)
        if index is None:
            return ""
        return join_path(f"tensors[{index}]", exc.field) if exc.field else f"tensors[{index}]"
    return ""


def _said(exc: json.JSONDecodeError) -> str:
    """The decoder's message without its dangling position: Python's ends "Unterminated
    string starting at", the line and column following in its own ``str`` only (new-user
    audit, session 55: "...: Unterminated string starting at" and nothing after)."""
    msg = exc.msg
    return msg[: -len(" at")] + " there" if msg.endswith(" at") else msg
