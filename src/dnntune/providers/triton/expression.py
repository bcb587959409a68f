"""The fused pointwise expression: what the pointwise kernel and the matmul epilogue compute.

A graph's pointwise nodes become an :class:`Elementwise`: external tensors (``in<i>``, with
element strides over the kernel's iteration space, 0 where broadcast), one :class:`ExprOp`
per node in topological order (``v<i>``), and the values stored to graph outputs. Also the
stride arithmetic the matchers share. Pure Python: no triton, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, PointwiseMode

__all__ = [
    "SUPPORTED_DTYPES",
    "Elementwise",
    "ExprOp",
    "Operand",
    "broadcast_strides",
    "build_elementwise",
    "check_dtype",
    "coalesce",
    "group_stride",
    "tensor_uid",
]

SUPPORTED_DTYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16)


_PW_FIELDS = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")
_PW_PARAMS = (
    "relu_lower_clip",
    "relu_upper_clip",
    "relu_lower_clip_slope",
    "swish_beta",
    "elu_alpha",
    "softplus_beta",
)


def check_dtype(t: TensorAttributes, where: str) -> DataType:
    if t.data_type not in SUPPORTED_DTYPES:
        got = t.data_type.json_name if t.data_type else "unset"
        names = ", ".join(d.json_name for d in SUPPORTED_DTYPES)
        raise NotSupportedError(f"{where}: data type {got} is not supported ({names})")
    return t.data_type


def tensor_uid(t: TensorAttributes) -> int:
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


def build_elementwise(
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
                ew.inputs.append(Operand(tensor_uid(t), check_dtype(t, where), tuple(strides)))
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
            ew.outputs.append(
                (value, Operand(tensor_uid(out), check_dtype(out, where), tuple(out.strides)))
            )
    return ew


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
