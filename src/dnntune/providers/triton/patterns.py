"""Pattern matchers: which Triton kernel runs a graph, and why none does.

Each matcher reads the IR and returns a *match* (everything its kernel needs: sizes, strides in
elements, dtypes, tensor uids, the fused pointwise expression) or raises NotSupportedError
saying why not. Nothing here imports triton or torch, so matching is testable anywhere.

Kernels:

- ``matmul``: one matmul (batch dims collapsible to one stride) plus any pointwise nodes on
  its output (bias, activation, residual add, scaling...) fused as an epilogue.
- ``norm``: one layernorm or rmsnorm forward (inference or training statistics) over the last
  dims, which must be contiguous.
- ``reduction``: one reduction over the last dim (add, avg, max, min, amax, norm1, norm2).
- ``pointwise``: any graph of pointwise nodes, fused into one kernel.
- ``pool``: one 2-D max or average pooling of channels-last (NHWC) data; a window covering the
  whole input (global pooling) is one reduction over H*W per (n, channel block).
- ``batchnorm``: one batch-norm inference of channels-last data plus any pointwise epilogue
  (:mod:`.batchnorm_match`, which builds on this module).
- ``attention``: one scaled dot-product attention forward with its mask, causal flags and
  grouped-query heads (:mod:`.attention_match`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, ReductionMode
from dnntune.providers.triton.attention_match import AttentionMatch, match_attention
from dnntune.providers.triton.batchnorm_match import decline_batchnorm_training, match_batchnorm
from dnntune.providers.triton.expression import (
    SUPPORTED_DTYPES,
    Elementwise,
    ExprOp,
    Operand,
    broadcast_strides,
    build_elementwise,
    check_dtype,
    coalesce,
    group_stride,
    tensor_uid,
)
from dnntune.providers.triton.match_base import Match, only_kinds, only_node
from dnntune.providers.triton.pool_match import PoolMatch, match_pool

__all__ = [
    "SUPPORTED_DTYPES",
    "AttentionMatch",
    "Elementwise",
    "ExprOp",
    "Match",
    "MatmulMatch",
    "NormMatch",
    "Operand",
    "PointwiseMatch",
    "PoolMatch",
    "ReductionMatch",
    "coalesce",
    "match_graph",
]

SUPPORTED_REDUCTIONS = (
    ReductionMode.ADD,
    ReductionMode.AVG,
    ReductionMode.MAX,
    ReductionMode.MIN,
    ReductionMode.AMAX,
    ReductionMode.NORM1,
    ReductionMode.NORM2,
)


# ---- matches --------------------------------------------------------------------------------
@dataclass
class MatmulMatch(Match):
    """C[b] = A[b] @ B[b] with a fused elementwise epilogue over (batch, M, N)."""

    batch: int
    m: int
    n: int
    k: int
    dtype: DataType
    a_uid: int
    b_uid: int
    a_strides: tuple[int, int, int]
    b_strides: tuple[int, int, int]
    epilogue: Elementwise
    kernel = "matmul"

    def signature(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "dtype": self.dtype.json_name,
            "a_strides": list(self.a_strides),
            "b_strides": list(self.b_strides),
            "epilogue": self.epilogue.signature(),
        }


@dataclass
class NormMatch(Match):
    """Layernorm or rmsnorm over ``n`` contiguous elements of each of ``rows`` rows."""

    op: OpKind
    rows: int
    n: int
    epsilon: float
    x: Operand
    y: Operand
    scale: Operand
    bias: Operand | None
    #: training statistics: layernorm's mean, and its inv_variance or rmsnorm's inv_rms
    mean: Operand | None
    rstd: Operand | None
    kernel = "norm"

    def signature(self) -> dict[str, Any]:
        def op(o: Operand | None) -> Any:
            return None if o is None else [o.dtype.json_name, list(o.strides)]

        return {
            "op": self.op.value,
            "rows": self.rows,
            "n": self.n,
            "x": op(self.x),
            "y": op(self.y),
            "scale": op(self.scale),
            "bias": op(self.bias),
            "mean": op(self.mean),
            "rstd": op(self.rstd),
        }


@dataclass
class ReductionMatch(Match):
    """y[r] = reduce(x[r, :]) over the last dim of ``rows`` rows."""

    mode: ReductionMode
    rows: int
    n: int
    x: Operand  # strides (row, col)
    y: Operand  # strides (row,)
    kernel = "reduction"

    def signature(self) -> dict[str, Any]:
        return {
            "mode": self.mode.json_name,
            "rows": self.rows,
            "n": self.n,
            "x": [self.x.dtype.json_name, list(self.x.strides)],
            "y": [self.y.dtype.json_name, list(self.y.strides)],
        }


@dataclass
class PointwiseMatch(Match):
    """A pointwise-only graph over ``expr.space`` (dims coalesced where every tensor allows)."""

    expr: Elementwise
    kernel = "pointwise"

    @property
    def numel(self) -> int:
        return math.prod(self.expr.space)

    def signature(self) -> dict[str, Any]:
        return {"space": list(self.expr.space), **self.expr.signature()}


# ---- matchers -------------------------------------------------------------------------------
def match_matmul(graph: OpGraph) -> MatmulMatch:
    nodes = only_kinds(graph, (OpKind.MATMUL, OpKind.POINTWISE), "a matmul[+epilogue]")
    matmuls = [n for n in nodes if n.kind is OpKind.MATMUL]
    if len(matmuls) != 1:
        raise NotSupportedError(f"graph is not a matmul[+epilogue]: it has {len(matmuls)} matmuls")
    mm = matmuls[0]
    if nodes[0] is not mm:
        raise NotSupportedError(
            "graph is not a matmul[+epilogue]: pointwise nodes before the matmul (a prologue) "
            "do not fuse"
        )
    a, b, c = mm.inputs["a_tensor_uid"], mm.inputs["b_tensor_uid"], mm.outputs["c_tensor_uid"]
    assert a is not None and b is not None and c is not None
    dtype = check_dtype(a, "matmul a_tensor_uid")
    if check_dtype(b, "matmul b_tensor_uid") is not dtype:
        raise NotSupportedError(
            f"matmul: a is {dtype.json_name} but b is {b.data_type.json_name}; "  # type: ignore[union-attr]
            "mixed input types are not supported"
        )
    space = list(c.dims)
    batch_dims = space[:-2]
    batch = math.prod(batch_dims)

    def batch_stride(t: TensorAttributes, where: str) -> int:
        if not batch_dims:
            return 0
        full = broadcast_strides(t.dims[:-2], t.strides[:-2], batch_dims, where)
        stride = group_stride(batch_dims, full)
        if stride is None:
            raise NotSupportedError(
                f"{where}: batch dims {t.dims[:-2]} do not flatten to one stride"
            )
        return stride

    def mm_operand(t: TensorAttributes, where: str) -> tuple[int, int, int]:
        return (batch_stride(t, where), t.strides[-2], t.strides[-1])

    a_strides = mm_operand(a, "matmul a_tensor_uid")
    b_strides = mm_operand(b, "matmul b_tensor_uid")
    ew = build_elementwise(graph, nodes[1:], space, {id(c): "acc"}, "the matmul epilogue")
    if not c.is_virtual:
        ew.outputs.insert(
            0,
            (
                "acc",
                Operand(tensor_uid(c), check_dtype(c, "matmul c_tensor_uid"), tuple(c.strides)),
            ),
        )

    # Collapse every epilogue tensor's strides to (batch, m, n).
    def collapse(o: Operand, where: str) -> Operand:
        bs = group_stride(batch_dims, o.strides[:-2]) if batch_dims else 0
        if bs is None:
            raise NotSupportedError(f"{where}: batch dims do not flatten to one stride")
        return Operand(o.uid, o.dtype, (bs, o.strides[-2], o.strides[-1]))

    ew.inputs = [collapse(o, f"epilogue input uid {o.uid}") for o in ew.inputs]
    ew.outputs = [(n, collapse(o, f"output uid {o.uid}")) for n, o in ew.outputs]
    ew.space = (batch, space[-2], space[-1])
    return MatmulMatch(
        batch=batch,
        m=space[-2],
        n=space[-1],
        k=a.dims[-1],
        dtype=dtype,
        a_uid=tensor_uid(a),
        b_uid=tensor_uid(b),
        a_strides=a_strides,
        b_strides=b_strides,
        epilogue=ew,
    )


def _rows_operand(t: TensorAttributes, count: int, where: str, need_contiguous: bool) -> Operand:
    """(row stride, col stride) of ``t`` seen as [rows, last ``count`` dims flattened]."""
    split = len(t.dims) - count
    row_stride = group_stride(t.dims[:split], t.strides[:split])
    col_stride = group_stride(t.dims[split:], t.strides[split:])
    if row_stride is None or col_stride is None:
        raise NotSupportedError(
            f"{where}: dims {t.dims} strides {t.strides} do not flatten to rows of one stride"
        )
    if need_contiguous and math.prod(t.dims[split:]) > 1 and col_stride != 1:
        raise NotSupportedError(
            f"{where}: the normalized dims must be contiguous (stride 1), got strides {t.strides}"
        )
    return Operand(tensor_uid(t), check_dtype(t, where), (row_stride, col_stride))


def match_norm(graph: OpGraph) -> NormMatch:
    node = only_node(graph, (OpKind.LAYERNORM, OpKind.RMSNORM), "a layernorm/rmsnorm", "norm")
    x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x is not None and y is not None
    count = int(node.params.get("normalized_dim_count") or len(x.dims) - 1)
    n = math.prod(x.dims[len(x.dims) - count :])
    rows = math.prod(x.dims[: len(x.dims) - count])
    eps_t = node.inputs.get("epsilon_tensor_uid")
    if eps_t is None or eps_t.value is None:
        raise NotSupportedError(f"node {node.name!r}: epsilon must be a pass-by-value scalar")

    def param(f: str) -> Operand | None:
        t = node.inputs.get(f)
        if t is None:
            return None
        where = f"node {node.name!r}: {f}"
        if t.numel != n:
            raise NotSupportedError(
                f"{where}: needs one value per normalized element ({n}), got dims {t.dims}"
            )
        op = _rows_operand(t, min(count, len(t.dims)), where, need_contiguous=True)
        return Operand(op.uid, op.dtype, (0, 1))

    def stat(f: str) -> Operand | None:
        t = node.outputs.get(f)
        if t is None:
            return None
        return _rows_operand(t, count, f"node {node.name!r}: {f}", need_contiguous=False)

    scale = param("scale_tensor_uid")
    assert scale is not None
    is_ln = node.kind is OpKind.LAYERNORM
    return NormMatch(
        op=node.kind,
        rows=rows,
        n=n,
        epsilon=float(eps_t.value),
        x=_rows_operand(x, count, f"node {node.name!r}: x_tensor_uid", need_contiguous=True),
        y=_rows_operand(y, count, f"node {node.name!r}: y_tensor_uid", need_contiguous=True),
        scale=scale,
        bias=param("bias_tensor_uid"),
        mean=stat("mean_tensor_uid") if is_ln else None,
        rstd=stat("inv_variance_tensor_uid" if is_ln else "inv_rms_tensor_uid"),
    )


def match_reduction(graph: OpGraph) -> ReductionMatch:
    node = only_node(graph, (OpKind.REDUCTION,), "a reduction", "reduction")
    mode = node.params["mode"]
    if mode not in SUPPORTED_REDUCTIONS:
        names = ", ".join(m.json_name for m in SUPPORTED_REDUCTIONS)
        raise NotSupportedError(f"reduction mode {mode.json_name} is not supported ({names})")
    x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x is not None and y is not None
    if y.dims != [*x.dims[:-1], 1] or x.dims[-1] == 1:
        raise NotSupportedError(
            f"reduction {node.name!r}: only reductions over the last dim are supported "
            f"(x dims {x.dims}, y dims {y.dims})"
        )
    xo = _rows_operand(x, 1, f"reduction {node.name!r}: x_tensor_uid", need_contiguous=False)
    yo = _rows_operand(y, 1, f"reduction {node.name!r}: y_tensor_uid", need_contiguous=False)
    return ReductionMatch(
        mode, math.prod(x.dims[:-1]), x.dims[-1], xo, Operand(yo.uid, yo.dtype, (yo.strides[0],))
    )


def match_pointwise(graph: OpGraph) -> PointwiseMatch:
    nodes = only_kinds(graph, (OpKind.POINTWISE,), "a pointwise chain")
    outs = graph.output_tensors()
    if not outs:
        raise NotSupportedError("pointwise graph has no output")
    space = list(max(outs, key=lambda t: t.numel).dims)
    ew = build_elementwise(graph, nodes, space, {}, "pointwise graph")
    operands = [*ew.inputs, *(o for _, o in ew.outputs)]
    dims, per = coalesce(space, [o.strides for o in operands])
    fixed = [Operand(o.uid, o.dtype, tuple(s)) for o, s in zip(operands, per, strict=True)]
    ew.inputs = fixed[: len(ew.inputs)]
    ew.outputs = [
        (name, o) for (name, _), o in zip(ew.outputs, fixed[len(ew.inputs) :], strict=True)
    ]
    ew.space = tuple(dims)
    return PointwiseMatch(ew)


_MATCHERS = {
    OpKind.MATMUL: match_matmul,
    OpKind.LAYERNORM: match_norm,
    OpKind.RMSNORM: match_norm,
    OpKind.REDUCTION: match_reduction,
    OpKind.POINTWISE: match_pointwise,
    OpKind.RESAMPLE: match_pool,
    OpKind.BATCHNORM_INFERENCE: match_batchnorm,
    OpKind.BATCHNORM: decline_batchnorm_training,
    OpKind.BATCHNORM_BACKWARD: decline_batchnorm_training,
    OpKind.SDPA: match_attention,
}


def match_graph(graph: OpGraph) -> Match:
    """The kernel match for ``graph``; raises NotSupportedError saying why there is none."""
    if not graph.is_validated:
        graph.validate()
    kind = graph.core_node().kind
    matcher = _MATCHERS.get(kind)
    if matcher is None:
        raise NotSupportedError(
            f"no Triton kernel for {kind.value}: the graph is not a matmul[+epilogue], a "
            "layernorm/rmsnorm, a last-dim reduction, a pointwise chain, a 2-D pooling, a "
            "batchnorm_inference or an attention forward"
        )
    return matcher(graph)
