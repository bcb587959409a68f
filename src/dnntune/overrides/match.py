"""Matching graphs against override entries: the writer's exact key and the reader's rules.

What a node contributes (both sides use the same function, :func:`node_tensors`): its input
tensors by field name (``x_tensor_uid``, ``w_tensor_uid``, ``in_0_tensor_uid`` ...), required
inputs first in the op spec's order, then the optional inputs that are present. Pass-by-value
scalar inputs (epsilon, momentum, a constant pointwise operand) are left out: they carry a
value, not a layout, and hipDNN's match keys describe layouts.

Reader rules (hipDNN's ``matchOperation``): the op must be equal; the criteria must have the
same count and equal pairs; the tensor count must be equal. v2 files match tensors by named id
ignoring order, v1 files by position. Each dim must equal the graph's or be ``-1``; a stride
is checked only when the pattern has one (same length, each equal or ``-1``). Entries are
scanned in file order and the first match wins, except that an entry tuned on the graph itself
(``autotune_metadata.graph_key``), or else on the graph at another batch size
(``batch_free_graph_key``), wins over earlier ones tuned on other graphs (:func:`find_match`).

Writer key (hipDNN's ``writeAutotuneResults``): op, criteria and the tensors matched by id
ignoring order, with exact dims and strides (no wildcards).

Writer order: since the first match wins, an entry is placed before any entry that matches
every graph it matches and more (one with a ``-1`` or no stride where it has a value,
:func:`covers`), so a tuned winner written into a file that already holds a generalized entry
for its op is the one read back (:func:`place`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.errors import ConfigFileError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops import spec_for
from dnntune.graph.tensor import TensorAttributes
from dnntune.overrides.batch import metadata_batch_free_key
from dnntune.overrides.format import (
    WILDCARD,
    OverrideEntry,
    OverrideFile,
    TensorPattern,
    canonical_tensor_id,
    parse_entry,
)

__all__ = [
    "EntryKey",
    "Match",
    "OpQuery",
    "TensorView",
    "covers",
    "entry_key",
    "entry_matches",
    "find_match",
    "graph_queries",
    "node_tensors",
    "pattern_matches",
    "place",
    "query_for_node",
    "tensor_id_of",
    "metadata_graph_key",
    "raw_entry_key",
    "same_problem",
]

#: hipDNN's legacy positional tensors where they differ from the op spec's field order
_POSITIONAL_ORDER: dict[OpKind, tuple[str, ...]] = {
    OpKind.CONV_WGRAD: ("x_tensor_uid", "dy_tensor_uid"),
}

#: (op, sorted criteria pairs, sorted (tensor_id, dims, strides)) -- the writer's identity
_KeyTensor = tuple[str, tuple[int, ...], tuple[int, ...]]
EntryKey = tuple[str, tuple[tuple[str, int], ...], tuple[_KeyTensor, ...]]


@dataclass(frozen=True)
class TensorView:
    """A graph tensor as the matcher sees it: its id, dims, strides and dnntune field name.

    ``tensor_id`` is hipDNN's JSON spelling of the field (the op spec's ``json_fields``, e.g.
    reduction's ``in_tensor_uid``), ``field_name`` dnntune's; a file may use either.
    """

    tensor_id: str
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    field_name: str = ""


@dataclass(frozen=True)
class OpQuery:
    """One node of a graph, ready to match: op string, criteria, tensors in positional order."""

    op: str
    criteria: Mapping[str, int] = field(default_factory=dict)
    tensors: tuple[TensorView, ...] = ()
    node_name: str = ""


@dataclass(frozen=True)
class Match:
    """The first entry that matched: its index in the file and the node it matched."""

    entry: OverrideEntry
    index: int
    query: OpQuery


def node_tensors(node: Node) -> list[tuple[str, TensorAttributes]]:
    """The node's input tensors by field name, positional order, scalars left out."""
    spec = spec_for(node.kind)
    order = list(_POSITIONAL_ORDER.get(node.kind, spec.inputs))
    order += [f for f in spec.all_inputs if f not in order]
    out: list[tuple[str, TensorAttributes]] = []
    for f in order:
        t = node.inputs.get(f)
        if t is not None and not t.is_scalar:
            out.append((f, t))
    return out


def tensor_id_of(node: Node, field_name: str) -> str:
    """The ``tensor_id`` written for a field: hipDNN's JSON spelling of it."""
    json_fields: dict[str, str] = getattr(spec_for(node.kind), "json_fields", None) or {}
    return json_fields.get(field_name, field_name)


def query_for_node(node: Node) -> OpQuery:
    """The node's op string (the OpKind value), criteria and tensors."""
    tensors = tuple(
        TensorView(tensor_id_of(node, f), tuple(t.dims), tuple(t.strides), f)
        for f, t in node_tensors(node)
    )
    return OpQuery(node.kind.value, spec_for(node.kind).criteria(node), tensors, node.name)


def graph_queries(graph: OpGraph) -> list[OpQuery]:
    """The core node first (what the writer records), then every other node in graph order.

    hipDNN walks the nodes and takes the first node that matches a rule; trying the core node
    first makes a file written by autotune win over a stray rule for a fused epilogue.
    """
    core = graph.core_node()
    rest = [n for n in graph.topological_nodes() if n is not core]
    return [query_for_node(core), *(query_for_node(n) for n in rest)]


# ---- reader ----------------------------------------------------------------------------------
def _axis_matches(pattern: Sequence[int], actual: Sequence[int]) -> bool:
    return len(pattern) == len(actual) and all(
        p in (WILDCARD, a) for p, a in zip(pattern, actual, strict=True)
    )


def pattern_matches(pattern: TensorPattern, view: TensorView) -> bool:
    """Rank equal, dims equal or -1; strides likewise when the pattern has any."""
    if not _axis_matches(pattern.dim, view.dim):
        return False
    return not pattern.stride or _axis_matches(pattern.stride, view.stride)


def entry_matches(entry: OverrideEntry, query: OpQuery, named: bool) -> bool:
    """Whether ``entry`` matches ``query`` (named tensor ids for v2, positions for v1)."""
    if entry.op != query.op:
        return False
    if dict(entry.criteria) != dict(query.criteria):
        return False
    if len(entry.tensors) != len(query.tensors):
        return False
    if not named:
        return all(pattern_matches(p, v) for p, v in zip(entry.tensors, query.tensors, strict=True))
    unused = list(query.tensors)
    for pattern in entry.tensors:
        if pattern.tensor_id is None:
            return False
        wanted = canonical_tensor_id(pattern.tensor_id)
        view = next((v for v in unused if wanted in (v.tensor_id, v.field_name)), None)
        if view is None or not pattern_matches(pattern, view):
            return False
        unused.remove(view)
    return True


def find_match(
    config: OverrideFile,
    queries: Sequence[OpQuery],
    graph_key: str | None = None,
    batch_free_key: Callable[[], str | None] | None = None,
) -> Match | None:
    """For each node in turn, the first entry (file order) that matches it; None if none does.

    With ``graph_key``, an entry tuned on that very graph (its ``autotune_metadata.graph_key``)
    wins over earlier entries that match the same node: two layers that share a core node but
    not their epilogue each keep their own entry. Failing that, with ``batch_free_key`` (the
    graph's :func:`~dnntune.overrides.batch.batch_free_graph_key`, asked for at most once, when
    an entry records one), an entry tuned on this graph at another batch size (generalized,
    its ``autotune_metadata.batch_free_graph_key`` equal) wins over earlier entries tuned on
    other graphs.
    """
    named = config.named_tensor_ids
    mine: list[str | None] = []  # batch_free_key(), once asked
    for query in queries:
        first: Match | None = None
        same_graph: Match | None = None  # this graph at another batch size
        for index, entry in enumerate(config.entries):
            if not entry_matches(entry, query, named):
                continue
            if graph_key is None or metadata_graph_key(entry.metadata) == graph_key:
                return Match(entry, index, query)
            first = first or Match(entry, index, query)
            theirs = metadata_batch_free_key(entry.metadata)
            if same_graph is None and theirs is not None and batch_free_key is not None:
                if not mine:
                    mine.append(batch_free_key())
                if theirs == mine[0]:
                    same_graph = Match(entry, index, query)
        if first is not None:
            return same_graph or first
    return None


def metadata_graph_key(metadata: Any) -> str | None:
    """``autotune_metadata.graph_key``: the graph an entry was tuned on (None if unknown)."""
    key = metadata.get("graph_key") if isinstance(metadata, Mapping) else None
    return key if isinstance(key, str) else None


def _metadata(raw: Any) -> Any:
    return raw.get("autotune_metadata") if isinstance(raw, Mapping) else None


def same_problem(old: Any, new: Any, key: EntryKey | None) -> bool:
    """Whether writing raw entry ``new`` (match key ``key``) replaces raw entry ``old``: the
    same match key, and the same graph, or an ``old`` that does not say which (hand-written or
    older); entries of other graphs that share the core node are kept."""
    if key is None or raw_entry_key(old) != key:
        return False
    tuned_on = metadata_graph_key(
        new.get("autotune_metadata") if isinstance(new, Mapping) else None
    )
    theirs = metadata_graph_key(old.get("autotune_metadata") if isinstance(old, Mapping) else None)
    return tuned_on is None or theirs is None or theirs == tuned_on


# ---- writer ----------------------------------------------------------------------------------
def entry_key(
    op: str, criteria: Mapping[str, int], tensors: Sequence[TensorPattern]
) -> EntryKey | None:
    """The writer's identity of an entry; None when a tensor has no id (cannot be keyed)."""
    items: list[_KeyTensor] = []
    for t in tensors:
        if t.tensor_id is None:
            return None
        items.append((canonical_tensor_id(t.tensor_id), tuple(t.dim), tuple(t.stride)))
    return (op, tuple(sorted(criteria.items())), tuple(sorted(items)))


def covers(broad: OverrideEntry, narrow: OverrideEntry) -> bool:
    """``broad`` matches every graph ``narrow`` matches, and more: the same op, criteria and
    tensor ids, each dim and stride of ``broad`` equal to ``narrow``'s or a wildcard (``-1``;
    no stride at all), and at least one wildcard where ``narrow`` has a value. Before
    ``narrow`` in a file, ``broad`` would shadow it."""
    if broad.op != narrow.op or broad.criteria != narrow.criteria:
        return False
    b_tensors, n_tensors = _by_id(broad.tensors), _by_id(narrow.tensors)
    if b_tensors is None or n_tensors is None or b_tensors.keys() != n_tensors.keys():
        return False
    wider = False
    for tid, b in b_tensors.items():
        n = n_tensors[tid]
        pairs = [(b.dim, n.dim)]
        if b.stride:
            if not n.stride:
                return False  # ``narrow`` takes any stride, ``broad`` only some
            pairs.append((b.stride, n.stride))
        elif n.stride:
            wider = True
        for bv, nv in pairs:
            if len(bv) != len(nv):
                return False
            if any(x not in (WILDCARD, y) for x, y in zip(bv, nv, strict=True)):
                return False
            wider = wider or any(
                x == WILDCARD and y != WILDCARD for x, y in zip(bv, nv, strict=True)
            )
    return wider


def _by_id(tensors: Sequence[TensorPattern]) -> dict[str, TensorPattern] | None:
    out = {}
    for t in tensors:
        if t.tensor_id is None:
            return None
        out[canonical_tensor_id(t.tensor_id)] = t
    return out


def place(entries: Sequence[Any], entry: Any) -> list[Any]:
    """``entries`` (raw file objects) with ``entry`` inserted before the first one that
    :func:`covers` it (appended when none does), so that it is the one a reader matches."""
    out = list(entries)
    narrow = _parsed(entry)
    if narrow is not None:
        for i, other in enumerate(out):
            broad = _parsed(other)
            if broad is not None and covers(broad, narrow):
                out.insert(i, entry)
                return out
    out.append(entry)
    return out


def _parsed(obj: Any) -> OverrideEntry | None:
    try:
        return parse_entry(obj, with_knobs=False)
    except ConfigFileError:
        return None


def raw_entry_key(obj: Any) -> EntryKey | None:
    """The key of an entry as read from disk; None if it is malformed (such entries are kept)."""
    try:
        entry = parse_entry(obj, with_knobs=False)
    except ConfigFileError:
        return None
    return entry_key(entry.op, entry.criteria, entry.tensors)
