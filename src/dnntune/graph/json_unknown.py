"""Keys of a graph document that dnntune does not read: kept in the file, and reported.

The reader keeps every key it does not model, so that files round-trip (hipDNN's serializer
and other tools write keys of their own, and a newer dnntune may write more). A key that is not
read is ignored, though, and a misspelled one silently meant the default: ``casual_mask`` on an
SDPA node ran non-causal attention and ``dnntune validate`` said ok (CLI audit).
:func:`unknown_fields` lists such keys, each with the closest key dnntune knows there, for
``validate`` to refuse the file and for ``run``, ``tune`` and ``bench`` to warn of.

The known keys come from the code that reads and writes them, not from a list of their own: a
node's from its op spec through the reader's own lookup (:func:`json_nodes.locate_fields`,
wherever in the node the key sits), the document's and a tensor's from the JSON Schema
(:func:`dnntune.graph.schema.build_schema`), whose test holds it to the shipped file; a test
round-trips every example graph through the writer and finds nothing unknown.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from dnntune._file_kinds import GRAPH, document_kind
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict, graph_from_source, parse_graph_text
from dnntune.graph.json_nodes import field_path, locate_fields, unread_fields
from dnntune.graph.ops import OpSpec, spec_for_json
from dnntune.graph.schema import build_schema

__all__ = [
    "UnknownField",
    "UnknownFieldWarning",
    "unknown_fields",
    "unknown_fields_note",
    "warn_unknown_fields",
]

_NODE_KEYS = ("type", "name", "compute_data_type")
_SECTIONS = ("inputs", "outputs", "parameters", "attributes")


class UnknownFieldWarning(UserWarning):
    """A graph document holds keys dnntune does not read (``Graph.load``, ``Graph.from_json``):
    kept for the round trip, but ignored, so a misspelled one means its default. Make it an
    error with ``warnings.filterwarnings("error", category=dnntune.UnknownFieldWarning)``."""


@dataclass(frozen=True)
class UnknownField:
    """A key the reader keeps but does not read."""

    #: where it sits: ``nodes[0].attributes.casual_mask``
    json_path: str
    key: str
    #: what holds it: ``node 'attn' (SdpaAttributes)``, ``tensor 'Q'``, ``the graph``
    owner: str
    #: the closest key dnntune reads there, if one is close (``causal_mask``)
    suggestion: str | None

    def __str__(self) -> str:
        text = f"{self.json_path}: unknown field of {self.owner}, ignored"
        if self.suggestion is not None:
            text += f"; did you mean {self.suggestion!r}?"
        return text


@cache
def _document_and_tensor_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    schema = build_schema()
    return tuple(schema["properties"]), tuple(schema["$defs"]["tensor"]["properties"])


def _node_keys(spec: OpSpec) -> tuple[str, ...]:
    """Every key a node of ``spec`` may hold, for suggestions (the reader takes a field's key
    in any section, so where the key sits does not narrow them)."""
    keys: list[str] = [*_NODE_KEYS, *_SECTIONS]
    for f in (*spec.all_inputs, *spec.all_outputs):
        keys += [spec.json_fields.get(f, f), f]
    for p in spec.params:
        keys += [p.key, p.name]
    keys += [dotted.rpartition(".")[2] for dotted in spec.json_constants]
    return tuple(dict.fromkeys(keys))


def _closest(key: str, known: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(key, list(known), n=1)
    return found[0] if found else None


def _named(what: str, obj: dict[str, Any]) -> str:
    name = obj.get("name")
    return f"{what} {name!r}" if isinstance(name, str) else what


def _node_unknowns(obj: dict[str, Any], path: str) -> list[UnknownField]:
    type_name = obj.get("type")
    spec = spec_for_json(type_name) if isinstance(type_name, str) else None
    if spec is None:  # an unsupported type is a problem of its own; its keys mean nothing here
        return []
    owner = f"{_named('node', obj)} ({spec.json_type})"
    out: list[UnknownField] = []
    for section, key, _ in unread_fields(obj, set(locate_fields(obj, spec).values())):
        dotted = f"{section}.{key}" if section else key
        if dotted in spec.json_constants:  # hipDNN's, unmodelled; the reader checks its value
            continue
        if key.endswith("_tensor_uid"):  # a uid the reader refuses, or an unset one (null)
            continue
        out.append(
            UnknownField(
                field_path(path, (section, key)), key, owner, _closest(key, _node_keys(spec))
            )
        )
    return out


def unknown_fields(doc: Any) -> list[UnknownField]:
    """The keys of a parsed graph document that dnntune keeps but does not read, in document
    order: at the top level, in each tensor and in each node (in its sections too).

    A part the reader cannot take at all (a tensor that is not an object, a node of an
    unsupported type) is left to its own problem; values are not looked at.
    """
    if not isinstance(doc, dict):
        return []
    document_keys, tensor_keys = _document_and_tensor_keys()
    out = [
        UnknownField(key, key, "the graph", _closest(key, document_keys))
        for key in doc
        if key not in document_keys
    ]
    tensors = doc.get("tensors")
    for i, obj in enumerate(tensors if isinstance(tensors, list) else []):
        if isinstance(obj, dict):
            out += [
                UnknownField(
                    f"tensors[{i}].{key}", key, _named("tensor", obj), _closest(key, tensor_keys)
                )
                for key in obj
                if key not in tensor_keys
            ]
    nodes = doc.get("nodes")
    for i, obj in enumerate(nodes if isinstance(nodes, list) else []):
        if isinstance(obj, dict):
            out += _node_unknowns(obj, f"nodes[{i}]")
    return out


def unknown_fields_note(source: object, unknown: Sequence[object]) -> str:
    """The one warning for a file's unknown keys (``unknown``: :class:`UnknownField` or its
    text): ``source: json.path: unknown field ...``, a line each when there are several."""
    if len(unknown) == 1:
        return f"{source}: {unknown[0]}"
    return f"{source}: {len(unknown)} unknown fields:" + "".join(f"\n  {u}" for u in unknown)


def warn_unknown_fields(doc: Any, source: object, stacklevel: int = 2) -> None:
    """Warn (:class:`UnknownFieldWarning`) of the unknown keys of a parsed graph document, in
    :func:`unknown_fields_note`'s words, as ``dnntune run`` says them; nothing when it has none.
    A document of another of dnntune's files (an override file) is left to the reader's error,
    which names it: its keys are no graph's. ``stacklevel`` as ``warnings.warn`` takes it, from
    the caller of this function."""
    kind = document_kind(doc)
    if kind is not None and kind is not GRAPH:
        return
    unknown = unknown_fields(doc)
    if unknown:
        warnings.warn(
            unknown_fields_note(source, unknown), UnknownFieldWarning, stacklevel=stacklevel + 1
        )


G = TypeVar("G", bound=OpGraph)


def graph_from_user_json(
    given: Any, graph_cls: type[G], source: str, where: object, stacklevel: int = 2
) -> G:
    """A graph from what a user handed ``Graph.load`` or ``Graph.from_json``: JSON text
    (parsed, a key named twice refused) or a parsed document; its unknown keys warned of once,
    naming ``where`` (:func:`warn_unknown_fields`); problems name ``source`` (a file's path;
    ``"<string>"``: not named). ``stacklevel`` as ``warnings.warn`` takes it, from the caller."""
    if isinstance(given, Mapping):
        doc: Any = dict(given)
    elif isinstance(given, str | bytes | bytearray):
        doc = parse_graph_text(given, source)
    else:  # an already parsed (non-object) value: the reader names what it got
        return graph_from_dict(given, graph_cls)
    warn_unknown_fields(doc, where, stacklevel=stacklevel + 1)
    return graph_from_source(doc, graph_cls, source)
