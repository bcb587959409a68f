"""The graph key: a deterministic signature of the problem a graph describes.

It covers ops, parameters, dims, strides, data types and structure, but not tensor or node
names nor how uids are numbered, so a renamed or renumbered graph keeps its key. Caches,
find/perf databases and result files are keyed by it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any

from dnntune.graph.ir import OpGraph
from dnntune.graph.tensor import TensorAttributes

__all__ = ["graph_key", "canonical_form"]

KEY_VERSION = 1


def _value(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, float):
        return repr(v)
    return v


def canonical_form(graph: OpGraph) -> dict[str, Any]:
    """Names dropped, tensors renumbered in the order the topologically sorted nodes use them."""
    if not graph.is_validated:
        graph.validate()
    numbering: dict[int, int] = {}

    def number(t: TensorAttributes) -> int:
        if id(t) not in numbering:
            numbering[id(t)] = len(numbering)
        return numbering[id(t)]

    nodes = []
    for node in graph.topological_nodes():
        nodes.append(
            {
                "op": node.kind.value,
                "compute": node.compute_data_type.json_name if node.compute_data_type else None,
                "in": {f: number(t) for f, t in sorted(node.inputs.items()) if t is not None},
                "out": {f: number(t) for f, t in sorted(node.outputs.items()) if t is not None},
                "params": {k: _value(v) for k, v in sorted(node.params.items()) if v is not None},
            }
        )
    by_number = sorted(((n, t) for t in graph.tensors if (n := numbering.get(id(t))) is not None),
                       key=lambda item: item[0])
    tensors = [
        {
            "dims": t.dims,
            "strides": [s if d > 1 else 0 for d, s in zip(t.dims, t.strides, strict=True)],
            "dtype": t.data_type.json_name if t.data_type else None,
            "virtual": t.is_virtual,
            "value": _value(t.value) if t.value is not None else None,
        }
        for _, t in by_number
    ]
    return {
        "v": KEY_VERSION,
        "compute": graph.compute_data_type.json_name if graph.compute_data_type else None,
        "io": graph.io_data_type.json_name if graph.io_data_type else None,
        "intermediate": graph.intermediate_data_type.json_name
        if graph.intermediate_data_type
        else None,
        "tensors": tensors,
        "nodes": nodes,
    }


def graph_key(graph: OpGraph) -> str:
    """A 32-hex-digit key of the canonical form (sha256, truncated)."""
    text = json.dumps(canonical_form(graph), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
