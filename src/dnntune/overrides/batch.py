"""The batch dimension of override entries and of graphs: which tensors carry it.

``dnntune overrides generalize`` (and ``merge --wildcard batch``) make an entry match any batch
size by setting dim 0 to -1 on the tensors that carry the batch (:func:`generalize_batch`).
Two entries that then coincide are one problem only if the graphs they were tuned on differ
in nothing but the batch: two convolutions with the same X and W but another stride, or
another epilogue, coincide too, and ``dnntune tune`` keeps an entry for each (by
``autotune_metadata.graph_key``, which includes the batch). So the writer also records
:func:`batch_free_graph_key`, the graph key with the batch left out, and generalizing compares
that; the reader prefers an entry tuned on its graph at another batch size to one tuned on
another graph.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.ops import spec_for
from dnntune.graph.signature import graph_key
from dnntune.graph.tensor import TensorAttributes
from dnntune.overrides.format import WILDCARD, OverrideEntry, canonical_tensor_id

__all__ = [
    "BATCH_FREE_KEY_FIELD",
    "batch_free_graph_key",
    "batch_tensors",
    "generalize_batch",
    "metadata_batch_free_key",
]

_log = logging.getLogger(__name__)

#: the ``autotune_metadata`` field the writer records :func:`batch_free_graph_key` in
BATCH_FREE_KEY_FIELD = "batch_free_graph_key"

#: per op, the input that defines the batch (its dim 0 is the batch, N) and the other inputs
#: that always carry it. Conv weights (K), norm scales, biases and statistics do not.
_BATCH_INPUTS: dict[OpKind, tuple[str, ...]] = {
    OpKind.CONV_FPROP: ("x_tensor_uid",),
    OpKind.CONV_DGRAD: ("dy_tensor_uid",),
    OpKind.CONV_WGRAD: ("dy_tensor_uid", "x_tensor_uid"),
    # A's rows are the batch (a linear layer's [batch, in]); B is the weight unless batched
    OpKind.MATMUL: ("a_tensor_uid",),
    OpKind.POINTWISE: ("in_0_tensor_uid",),
    OpKind.REDUCTION: ("x_tensor_uid",),
    OpKind.LAYERNORM: ("x_tensor_uid",),
    OpKind.RMSNORM: ("x_tensor_uid",),
    OpKind.BATCHNORM: ("x_tensor_uid",),
    OpKind.BATCHNORM_INFERENCE: ("x_tensor_uid",),
    OpKind.BATCHNORM_BACKWARD: ("dy_tensor_uid", "x_tensor_uid"),
    OpKind.SDPA: ("q_tensor_uid", "k_tensor_uid", "v_tensor_uid"),
    OpKind.RESAMPLE: ("x_tensor_uid",),
}
#: inputs that carry the batch only when their layout says so (else they broadcast over it)
_MAYBE_BATCHED: dict[OpKind, tuple[str, ...]] = {
    OpKind.MATMUL: ("b_tensor_uid",),
    OpKind.POINTWISE: ("in_1_tensor_uid", "in_2_tensor_uid"),
    OpKind.SDPA: ("attn_mask_tensor_uid",),
}


def _field_of(kind: OpKind, tensor_id: str | None) -> str:
    """The dnntune field an entry's tensor stands for (hipDNN's JSON spellings too)."""
    if tensor_id is None:  # v1 positional entries are refused before this
        return ""
    wanted = canonical_tensor_id(tensor_id)
    json_fields: dict[str, str] = getattr(spec_for(kind), "json_fields", None) or {}
    return {v: k for k, v in json_fields.items()}.get(wanted, wanted)


def _carries_batch(dims: Sequence[int], batch: Sequence[int]) -> bool:
    """Whether an operand that may broadcast (a batched B, a pointwise operand) of dims
    ``dims`` carries the batch of the tensor of dims ``batch``.

    It does when it has the batch tensor's rank and batch size. A batch of 1 is ambiguous
    (a [1, C, 1, 1] bias of a batch-1 graph looks batched), so then the operand must have the
    batch tensor's whole shape.
    """
    if not dims or len(dims) != len(batch) or dims[0] != batch[0]:
        return False
    return batch[0] > 1 or list(dims[1:]) == list(batch[1:])


def _batched_b_possible(kind: OpKind, batch: Sequence[int]) -> bool:
    """A 2-D matmul has no batch axis in B: A's rows (its dim 0) are not B's dim 0 (K)."""
    return kind is not OpKind.MATMUL or len(batch) >= 3


def generalize_batch(entry: OverrideEntry) -> OverrideEntry:
    """A copy of ``entry`` that matches any batch size: dim 0 is -1 where it is the batch.

    Only the tensors that carry the batch are generalized: a convolution's input X (not its
    weight W, whose dim 0 is the output channels K), a matmul's A (and B only when it is
    batched too), a norm's X (not its scale, bias or statistics), attention's Q, K and V. An
    entry for an op dnntune does not know is left as it is, since its batch cannot be told.
    """
    try:
        kind = OpKind(entry.op)
    except ValueError:
        _log.info("generalize: op %r is not known; its entry is left as it is", entry.op)
        return entry
    fields = [_field_of(kind, t.tensor_id) for t in entry.tensors]
    always = _BATCH_INPUTS.get(kind, ())
    maybe = _MAYBE_BATCHED.get(kind, ())
    batch = next(
        (t for t, f in zip(entry.tensors, fields, strict=True) if always and f == always[0]),
        None,
    )
    tensors = []
    for t, f in zip(entry.tensors, fields, strict=True):
        batched = f in always
        if not batched and f in maybe and batch is not None:
            batched = _batched_b_possible(kind, batch.dim) and _carries_batch(t.dim, batch.dim)
        dim = (WILDCARD, *t.dim[1:]) if batched and t.dim else t.dim
        tensors.append(type(t)(t.tensor_id, dim, t.stride))
    raw = dict(entry.raw)
    raw["tensors"] = [t.to_json() for t in tensors]
    return OverrideEntry(
        entry.op, entry.engine_name, dict(entry.criteria), tensors, entry.metadata, entry.knobs, raw
    )


def batch_tensors(graph: OpGraph) -> list[TensorAttributes] | None:
    """The tensors of ``graph`` whose dim 0 is the batch; None when it cannot be told (a core
    op without a batch input).

    The batch N is dim 0 of the core node's batch input (the tensor :func:`generalize_batch`
    generalizes first). Through every node whose batch input has dim 0 N, the tensors that
    carry it are linked: the node's other batch inputs and its outputs with dim 0 N, and an
    operand that may broadcast when it has the batch (the rule of :func:`generalize_batch`).
    The batch tensors are those linked to the core's, so a bias of shape [1, C, 1, 1] is one
    at no batch size, and a convolution's output is one at every batch size, 1 included.
    """
    core = graph.core_node()
    always = _BATCH_INPUTS.get(core.kind)
    first = core.inputs.get(always[0]) if always else None
    if first is None or not first.dims:
        return None
    n = first.dims[0]
    parent: dict[int, int] = {}  # union-find over id(tensor)

    def root(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def link(a: TensorAttributes, b: TensorAttributes) -> None:
        parent[root(id(b))] = root(id(a))

    for node in graph.nodes:
        fields = _BATCH_INPUTS.get(node.kind, ())
        batch = node.inputs.get(fields[0]) if fields else None
        if batch is None or not batch.dims or batch.dims[0] != n:
            continue
        for f in fields[1:]:
            t = node.inputs.get(f)
            if t is not None and t.dims and t.dims[0] == n:
                link(batch, t)
        if _batched_b_possible(node.kind, batch.dims):
            for f in _MAYBE_BATCHED.get(node.kind, ()):
                t = node.inputs.get(f)
                if t is not None and not t.is_scalar and _carries_batch(t.dims, batch.dims):
                    link(batch, t)
        for t in node.outputs.values():
            if t is not None and t.dims and t.dims[0] == n:
                link(batch, t)
    mine = root(id(first))
    return [t for t in graph.tensors if id(t) in parent and root(id(t)) == mine]


def batch_free_graph_key(graph: OpGraph) -> str | None:
    """The graph key with the batch left out (dim 0 of :func:`batch_tensors` as -1): the same
    graph at every batch size shares it, another graph (another stride, another epilogue)
    does not. None when the batch cannot be told."""
    tensors = batch_tensors(graph)
    if tensors is None:
        return None
    return graph_key(graph, any_batch={id(t) for t in tensors})


def metadata_batch_free_key(metadata: Any) -> str | None:
    """``autotune_metadata.batch_free_graph_key`` (None if absent: hand-written or older)."""
    key = metadata.get(BATCH_FREE_KEY_FIELD) if isinstance(metadata, Mapping) else None
    return key if isinstance(key, str) else None
