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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, PointwiseMode, ReductionMode

__all__ = [
    "SUPPORTED_DTYPES",
    "Elementwise",
    "ExprOp",
    "Match",
    "MatmulMatch",
    "NormMatch",
    "Operand",
    "PointwiseMatch",
    "ReductionMatch",
    "match_graph",
]

SUPPORTED_DTYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16)
SUPPORTED_REDUCTIONS = (
    ReductionMode.ADD,
    ReductionMode.AVG,
    ReductionMode.MAX,
    ReductionMode.MIN,
    ReductionMode.AMAX,
    ReductionMode.NORM1,
    ReductionMode.NORM2,
)
_PW_FIELDS = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")
_PW_PARAMS = (
    "relu_lower_clip",
    "relu_upper_clip",
    "relu_lower_clip_slope",
    "swish_beta",
    "elu_alpha",
    "softplus_beta",
)


def _dtype(t: TensorAttributes, where: str) -> DataType:
    if t.data_type not in SUPPORTED_DTYPES:
        got = t.data_type.json_name if t.data_type else "unset"
        names = ", ".join(d.json_name for d in SUPPORTED_DTYPES)
        raise NotSupportedError(f"{where}: data type {got} is not supported ({names})")
    return t.data_type


def _uid(t: TensorAttributes) -> int:
    assert t.uid is not None, "graph must be validated (uids assigned) before matching"
    return t.uid


def group_stride(dims: Sequence[int], strides: Sequence[int]) -> int | None:
    """The element stride of ``dims`` flattened in row-major order, or None if they do not
    flatten to one stride. Size-1 dims are ignored; an all-size-1 group has stride 0."""
    inner: int | None = None
    extent = 1
    for d, s in zip(reversed(dims), reversed(strides), strict=True):
        if d == 1:
            continue
        if inner is None:
            inner = s
        elif s != inner * extent:
            return None
        extent *= d
    return 0 if inner is None else inner


def broadcast_strides(
    dims: Sequence[int], strides: Sequence[int], space: Sequence[int], where: str
) -> list[int]:
    """Strides of a tensor over the iteration ``space`` (right-aligned; 0 where broadcast)."""
    pad = len(space) - len(dims)
    if pad < 0:
        raise NotSupportedError(f"{where}: dims {list(dims)} have more dims than {list(space)}")
    out: list[int] = []
    for i, size in enumerate(space):
        td = dims[i - pad] if i >= pad else 1
        if td == size and size != 1:
            out.append(strides[i - pad])
        elif td == 1:
            out.append(0)
        else:
            raise NotSupportedError(f"{where}: dims {list(dims)} do not broadcast to {list(space)}")
    return out


# ---- the fused pointwise expression ---------------------------------------------------------
@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads or writes, with strides over the kernel's iteration space."""

    uid: int
    dtype: DataType
    strides: tuple[int, ...]


@dataclass(frozen=True)
class ExprOp:
    """One pointwise node: ``out = mode(*args)``; args name values (``v0``, ``in1``, ``acc``)
    or are float literals."""

    mode: PointwiseMode
    out: str
    args: tuple[str, ...]
    params: tuple[tuple[str, float], ...] = ()

    def param(self, name: str, default: float) -> float:
        return dict(self.params).get(name, default)


@dataclass
class Elementwise:
    """A pointwise DAG over an iteration space: inputs ``in<i>``, ops, stored outputs."""

    space: tuple[int, ...]
    inputs: list[Operand] = field(default_factory=list)
    ops: list[ExprOp] = field(default_factory=list)
    #: (value name, where it is stored)
    outputs: list[tuple[str, Operand]] = field(default_factory=list)

    def signature(self) -> dict[str, Any]:
        return {
            "inputs": [[o.dtype.json_name, list(o.strides)] for o in self.inputs],
            "ops": [
                [op.mode.json_name, list(op.args), [list(p) for p in op.params]] for op in self.ops
            ],
            "outputs": [[name, o.dtype.json_name, list(o.strides)] for name, o in self.outputs],
        }


def _build_elementwise(
    graph: OpGraph,
    nodes: Sequence[Node],
    space: Sequence[int],
    seeds: dict[int, str],
    what: str,
) -> Elementwise:
    """Lower pointwise ``nodes`` (topological order) to an Elementwise over ``space``.

    ``seeds`` maps ``id(tensor)`` to value names the kernel provides (the matmul accumulator).
    """
    ew = Elementwise(tuple(space))
    names: dict[int, str] = dict(seeds)
    for node in nodes:
        mode = node.params.get("operation")
        assert isinstance(mode, PointwiseMode)
        args: list[str] = []
        for f in _PW_FIELDS[: mode.arity]:
            t = node.inputs.get(f)
            assert t is not None
            if id(t) in names:
                args.append(names[id(t)])
            elif t.is_scalar:
                args.append(repr(float(t.value)))  # type: ignore[arg-type]
            else:
                where = f"node {node.name!r}: {f}"
                if t.is_virtual:
                    raise NotSupportedError(f"{where}: {what} cannot compute {t.name!r}")
                strides = broadcast_strides(t.dims, t.strides, space, where)
                name = f"in{len(ew.inputs)}"
                ew.inputs.append(Operand(_uid(t), _dtype(t, where), tuple(strides)))
                names[id(t)] = name
                args.append(name)
        out = node.outputs.get("out_0_tensor_uid")
        assert out is not None
        if list(out.dims) != list(space):
            raise NotSupportedError(
                f"node {node.name!r}: output dims {out.dims} differ from the {what} dims "
                f"{list(space)}; only elementwise ops over the full output fuse"
            )
        value = f"v{len(ew.ops)}"
        params = tuple(
            (p, float(node.params[p])) for p in _PW_PARAMS if node.params.get(p) is not None
        )
        ew.ops.append(ExprOp(mode, value, tuple(args), params))
        names[id(out)] = value
        if not out.is_virtual:
            where = f"node {node.name!r}: out_0_tensor_uid"
            ew.outputs.append((value, Operand(_uid(out), _dtype(out, where), tuple(out.strides))))
    return ew


# ---- matches --------------------------------------------------------------------------------
class Match:
    """Base of the matches: ``kernel`` names the kernel module and the perf-db file."""

    kernel: str = ""

    def signature(self) -> dict[str, Any]:
        raise NotImplementedError


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
def _only(graph: OpGraph, kinds: Sequence[OpKind], what: str) -> list[Node]:
    others = sorted({n.kind.value for n in graph.nodes if n.kind not in kinds})
    if others:
        raise NotSupportedError(f"graph is not {what}: it has {', '.join(others)} node(s)")
    return graph.topological_nodes()


def match_matmul(graph: OpGraph) -> MatmulMatch:
    nodes = _only(graph, (OpKind.MATMUL, OpKind.POINTWISE), "a matmul[+epilogue]")
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
    dtype = _dtype(a, "matmul a_tensor_uid")
    if _dtype(b, "matmul b_tensor_uid") is not dtype:
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
    ew = _build_elementwise(graph, nodes[1:], space, {id(c): "acc"}, "the matmul epilogue")
    if not c.is_virtual:
        ew.outputs.insert(
            0, ("acc", Operand(_uid(c), _dtype(c, "matmul c_tensor_uid"), tuple(c.strides)))
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
        a_uid=_uid(a),
        b_uid=_uid(b),
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
    return Operand(_uid(t), _dtype(t, where), (row_stride, col_stride))


def match_norm(graph: OpGraph) -> NormMatch:
    nodes = _only(graph, (OpKind.LAYERNORM, OpKind.RMSNORM), "a layernorm/rmsnorm")
    if len(nodes) != 1:
        raise NotSupportedError(f"graph is not a single norm: it has {len(nodes)} nodes")
    node = nodes[0]
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
    nodes = _only(graph, (OpKind.REDUCTION,), "a reduction")
    if len(nodes) != 1:
        raise NotSupportedError(f"graph is not a single reduction: it has {len(nodes)} nodes")
    node = nodes[0]
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


def coalesce(
    space: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims that every tensor walks contiguously (size-1 dims dropped)."""
    keep = [i for i, d in enumerate(space) if d != 1]
    dims = [space[i] for i in keep]
    per = [[s[i] for i in keep] for s in strides]
    i = len(dims) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * dims[i + 1] for s in per):
            dims[i] *= dims[i + 1]
            del dims[i + 1]
            for s in per:
                s[i] = s[i + 1]
                del s[i + 1]
        i -= 1
    if not dims:
        return [1], [[0] for _ in per]
    return dims, per


def match_pointwise(graph: OpGraph) -> PointwiseMatch:
    nodes = _only(graph, (OpKind.POINTWISE,), "a pointwise chain")
    outs = graph.output_tensors()
    if not outs:
        raise NotSupportedError("pointwise graph has no output")
    space = list(max(outs, key=lambda t: t.numel).dims)
    ew = _build_elementwise(graph, nodes, space, {}, "pointwise graph")
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
            "layernorm/rmsnorm, a last-dim reduction or a pointwise chain"
        )
    return matcher(graph)
