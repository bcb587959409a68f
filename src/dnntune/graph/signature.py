"""The graph key: a deterministic signature of the problem a graph describes.

It covers ops, parameters, dims, strides, data types and structure, but not tensor or node
names nor how uids are numbered, so a renamed or renumbered graph keeps its key. Caches,
find/perf databases and result files are keyed by it.

It describes the problem, not its spelling: data types are the effective ones (a tensor or
node left "unset" counts as the graph type it resolves to), a parameter at its default counts
as absent, and implementation hints (SDPA ``implementation``, ``mma_core_mode``) are left out.
A graph built with the builder and the same graph loaded from a hipDNN file share a key.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Collection
from typing import Any

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node
from dnntune.graph.ops import spec_for
from dnntune.graph.tensor import TensorAttributes

__all__ = ["graph_key", "canonical_form"]

KEY_VERSION = 2


def _value(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, float):
        return repr(v)
    return v


def canonical_form(graph: OpGraph, *, any_batch: Collection[int] = ()) -> dict[str, Any]:
    """Names dropped, tensors renumbered in the order the topologically sorted nodes use them.

    ``any_batch``: ``id()`` of the tensors whose dim 0 is the batch; their dim 0 is written
    as -1 and its stride as 0 (a form shared by the same graph at every batch size).
    """
    if not graph.is_validated:
        graph.validate()
    numbering: dict[int, int] = {}

    def number(t: TensorAttributes) -> int:
        if id(t) not in numbering:
            numbering[id(t)] = len(numbering)
        return numbering[id(t)]

    nodes = []
    for node in graph.topological_nodes():
        compute = node.compute_data_type or graph.compute_data_type
        nodes.append(
            {
                "op": node.kind.value,
                "compute": compute.json_name if compute else None,
                "in": {f: number(t) for f, t in sorted(node.inputs.items()) if t is not None},
                "out": {f: number(t) for f, t in sorted(node.outputs.items()) if t is not None},
                "params": _params(node),
            }
        )
    by_number = sorted(
        ((n, t) for t in graph.tensors if (n := numbering.get(id(t))) is not None),
        key=lambda item: item[0],
    )
    tensors = []
    for _, t in by_number:
        dims = list(t.dims)
        strides = [s if d > 1 else 0 for d, s in zip(t.dims, t.strides, strict=True)]
        if dims and id(t) in any_batch:
            dims[0], strides[0] = -1, 0
        tensors.append(
            {
                "dims": dims,
                "strides": strides,
                "dtype": t.data_type.json_name if t.data_type else None,
                "virtual": t.is_virtual,
                "value": _value(t.value) if t.value is not None else None,
            }
        )
    return {"v": KEY_VERSION, "tensors": tensors, "nodes": nodes}


def _params(node: Node) -> dict[str, Any]:
    spec = spec_for(node.kind)
    out: dict[str, Any] = {}
    for p in spec.params:
        value = node.params.get(p.name)
        if value is None or not p.in_key or value == p.default:
            continue
        out[p.name] = _value(value)
    return spec.key_params(node, out)


def graph_key(graph: OpGraph, *, any_batch: Collection[int] = ()) -> str:
    """A 32-hex-digit key of the canonical form (sha256, truncated); ``any_batch``: see
    :func:`canonical_form` (the default, none, is the graph key)."""
    text = json.dumps(
        canonical_form(graph, any_batch=any_batch), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]
