"""What the learned ranking knows about a graph: its core op, data type, layout and key sizes.

A :class:`Problem` is built from a graph's core node (:func:`problem_of`) or from the named
tensors of an override-file entry (:func:`problem_from_tensors`), so that tuning history that
kept only the core op's tensors is usable too. It holds only what decides which engine is
fastest in practice:

* ``op``: the core op kind (``conv_fprop``, ``matmul``, ``layernorm``, ...); its op class
  (``conv``, ``matmul``, ``sdpa``, ``norm``, ``pool``, ``pointwise``, ``other``) selects the
  model's group;
* ``dtype``: the data type of the core op's first input (None when the source does not say);
* ``dims``: named sizes per op (matmul ``m``/``n``/``k``/``batch``; conv ``n``/``c``/``h``/``w``/
  ``k``/``r``/``s``/``groups``/``stride``; norms ``rows``/``cols``; SDPA ``batch``/``heads``/
  ``kv_heads``/``seq_q``/``seq_kv``/``head_dim``; pooling ``n``/``c``/``h``/``w``/``r``/``s`` and
  ``out_h``/``out_w``);
* ``flags``: 0/1 layout and mode facts (``channels_last``, ``a_transposed``, ``b_transposed``,
  ``causal``, ``max_pool``, ``broadcast``); a flag the source cannot tell is left out;
* ``epilogue``: how many nodes the graph has besides the core op (a fused bias/activation
  chain), None when unknown.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from dnntune.errors import InvalidValueError
from dnntune.graph.node import OpKind

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph
    from dnntune.graph.tensor import TensorAttributes

__all__ = [
    "OP_CLASSES",
    "Problem",
    "TensorInfo",
    "device_class",
    "op_class_of",
    "problem_from_tensors",
    "problem_of",
]

OP_CLASSES = ("conv", "sdpa", "norm", "pool", "pointwise", "matmul", "other")
_CONV = (OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD)
#: epilogue counts above this are the same to the model (a long pointwise chain)
MAX_EPILOGUE = 4


def op_class_of(kind: OpKind) -> str:
    """The op class that static ordering and the learned model group problems by."""
    if kind in _CONV:
        return "conv"
    if kind is OpKind.SDPA:
        return "sdpa"
    if kind in (OpKind.LAYERNORM, OpKind.RMSNORM):
        return "norm"
    if kind is OpKind.MATMUL:
        return "matmul"
    if kind is OpKind.POINTWISE:
        return "pointwise"
    if kind is OpKind.RESAMPLE:
        return "pool"
    return "other"


def device_class(name: str) -> str:
    """A device name as the model keys it: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")
    return slug or "unknown"


class TensorInfo(NamedTuple):
    """One tensor of the core op: logical dims, strides (None: unknown), data type name."""

    dims: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    dtype: str | None = None


@dataclass
class Problem:
    """One problem as the learned ranking sees it (see the module docstring)."""

    op: str
    dtype: str | None = None
    dims: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    epilogue: int | None = None

    @property
    def kind(self) -> OpKind:
        return OpKind(self.op)

    @property
    def op_class(self) -> str:
        return op_class_of(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "dims": dict(sorted(self.dims.items())),
            "flags": dict(sorted(self.flags.items())),
            "epilogue": self.epilogue,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "problem") -> Problem:
        """Parse :meth:`to_json`'s object (raises InvalidValueError naming ``where``)."""
        if not isinstance(obj, Mapping):
            raise InvalidValueError(f"{where}: expected an object, got {type(obj).__name__}")
        op = obj.get("op")
        try:
            OpKind(op)
        except ValueError:
            raise InvalidValueError(f"{where}.op: unknown op kind {op!r}") from None
        dtype = obj.get("dtype")
        if dtype is not None and not isinstance(dtype, str):
            raise InvalidValueError(f"{where}.dtype: expected a string or null, got {dtype!r}")
        dims = _int_map(obj.get("dims", {}), f"{where}.dims", minimum=1)
        flags = _int_map(obj.get("flags", {}), f"{where}.flags", minimum=0)
        epilogue = obj.get("epilogue")
        if epilogue is not None and (
            not isinstance(epilogue, int) or isinstance(epilogue, bool) or epilogue < 0
        ):
            raise InvalidValueError(f"{where}.epilogue: expected an int >= 0 or null")
        return cls(str(op), dtype, dims, flags, epilogue)

    def key(self) -> str:
        """A short stable id of the whole problem (what merges repeated measurements)."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def shape_key(self) -> str:
        """Op class and sizes only (no data type, layout or epilogue): the unit of grouped
        K-fold, so a shape in a test fold was never seen in training in any type or layout."""
        dims = ",".join(f"{k}={v}" for k, v in sorted(self.dims.items()))
        return f"{self.op_class}:{dims}"

    def label(self) -> str:
        """A one-line description: ``matmul half m=4096 n=1024 k=4096 +2``."""
        dims = " ".join(f"{k}={v}" for k, v in sorted(self.dims.items()))
        flags = " ".join(k for k, v in sorted(self.flags.items()) if v)
        tail = f" +{self.epilogue}" if self.epilogue else ""
        parts = [self.op, self.dtype or "?", dims, flags]
        return " ".join(p for p in parts if p) + tail


def _int_map(obj: Any, where: str, minimum: int) -> dict[str, int]:
    if not isinstance(obj, Mapping):
        raise InvalidValueError(f"{where}: expected an object")
    out: dict[str, int] = {}
    for k, v in obj.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise InvalidValueError(f"{where}.{k}: expected an int >= {minimum}, got {v!r}")
        out[str(k)] = v
    return out


# ---- extraction --------------------------------------------------------------------------------
def _prod(values: Sequence[int]) -> int:
    return math.prod(values) if values else 1


def _channels_last(t: TensorInfo) -> int | None:
    if t.strides is None or len(t.dims) < 4 or len(t.strides) != len(t.dims) or t.dims[1] <= 1:
        return None if t.strides is None else 0
    return int(t.strides[1] == 1)


def _transposed(t: TensorInfo) -> int | None:
    if t.strides is None or len(t.strides) != len(t.dims) or len(t.dims) < 2:
        return None
    return int(t.strides[-1] != 1 and t.dims[-1] > 1)


def _spatial(dims: Sequence[int]) -> tuple[int, int]:
    """(h, w) of an NC... tensor; a 5-D tensor's depth is folded into h."""
    rest = list(dims[2:]) or [1]
    return _prod(rest[:-1]) if len(rest) > 1 else 1, rest[-1]


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value)).upper()


def _set_flag(flags: dict[str, int], name: str, value: int | None) -> None:
    if value is not None:
        flags[name] = value


def _matmul(t: Mapping[str, TensorInfo], dims: dict[str, int], flags: dict[str, int]) -> None:
    a, b = t.get("a_tensor_uid"), t.get("b_tensor_uid")
    if a is None or b is None or len(a.dims) < 2 or len(b.dims) < 2:
        return
    dims.update(m=a.dims[-2], k=a.dims[-1], n=b.dims[-1])
    c = t.get("c_tensor_uid")
    dims["batch"] = _prod((c or a).dims[:-2])
    _set_flag(flags, "a_transposed", _transposed(a))
    _set_flag(flags, "b_transposed", _transposed(b))


def _conv(
    kind: OpKind, t: Mapping[str, TensorInfo], params: Mapping[str, Any], dims: dict[str, int]
) -> TensorInfo | None:
    """Fill conv sizes; return the activation tensor whose layout is the graph's."""
    x, w = t.get("x_tensor_uid"), t.get("w_tensor_uid")
    dx, dw, dy = t.get("dx_tensor_uid"), t.get("dw_tensor_uid"), t.get("dy_tensor_uid")
    if kind is OpKind.CONV_DGRAD:
        x, w = dx, w
    elif kind is OpKind.CONV_WGRAD:
        w = dw
    act = x if x is not None else dy
    if act is None or len(act.dims) < 3:
        return None
    dims["n"] = act.dims[0]
    dims["h"], dims["w"] = _spatial(act.dims)
    if x is not None:
        dims["c"] = x.dims[1]
    if dy is not None:
        dims["k"] = dy.dims[1]
    if w is not None and len(w.dims) >= 3:
        dims["k"] = w.dims[0]
        dims["r"], dims["s"] = _spatial(w.dims)
        if "c" not in dims:
            dims["c"] = w.dims[1]
        elif w.dims[1] and dims["c"] % w.dims[1] == 0:
            dims["groups"] = dims["c"] // w.dims[1]
    stride = params.get("stride")
    if isinstance(stride, list | tuple) and stride and all(isinstance(s, int) for s in stride):
        dims["stride"] = max(1, max(stride))
    return act


def _sdpa(t: Mapping[str, TensorInfo], params: Mapping[str, Any], dims: dict[str, int]) -> None:
    q, k = t.get("q_tensor_uid"), t.get("k_tensor_uid")
    if q is None or len(q.dims) != 4:
        return
    dims.update(batch=q.dims[0], heads=q.dims[1], seq_q=q.dims[2], head_dim=q.dims[3])
    if k is not None and len(k.dims) == 4:
        dims.update(kv_heads=k.dims[1], seq_kv=k.dims[2])


def problem_from_tensors(
    op: str | OpKind,
    tensors: Mapping[str, TensorInfo],
    params: Mapping[str, Any] | None = None,
    epilogue: int | None = None,
) -> Problem:
    """A problem from the core op's tensors by node field name (``x_tensor_uid``, ...).

    ``params`` are the node's parameters or an override entry's ``criteria``; missing tensors
    or parameters leave the sizes and flags they would give out (the model treats them as
    unknown). Raises InvalidValueError for an op kind dnntune does not know.
    """
    try:
        kind = op if isinstance(op, OpKind) else OpKind(op)
    except ValueError:
        raise InvalidValueError(f"unknown op kind {op!r}") from None
    params = params or {}
    dims: dict[str, int] = {}
    flags: dict[str, int] = {}
    layout: TensorInfo | None = None
    first = next(iter(tensors.values()), None)
    if kind is OpKind.MATMUL:
        _matmul(tensors, dims, flags)
        first = tensors.get("a_tensor_uid", first)
    elif kind in _CONV:
        layout = _conv(kind, tensors, params, dims)
        first = layout or first
    elif kind is OpKind.SDPA:
        _sdpa(tensors, params, dims)
        first = tensors.get("q_tensor_uid", first)
        causal = params.get("causal_mask") or params.get("causal_mask_bottom_right")
        if "causal_mask" in params or "causal_mask_bottom_right" in params:
            flags["causal"] = int(bool(causal))
    elif kind in (OpKind.LAYERNORM, OpKind.RMSNORM):
        x, scale = tensors.get("x_tensor_uid"), tensors.get("scale_tensor_uid")
        if x is not None and x.dims:
            cols = _prod(scale.dims) if scale is not None and _prod(scale.dims) > 1 else x.dims[-1]
            dims.update(rows=max(1, _prod(x.dims) // max(cols, 1)), cols=cols)
            first = x
    elif kind is OpKind.RESAMPLE:
        x = tensors.get("x_tensor_uid")
        if x is not None and len(x.dims) >= 3:
            dims["n"], dims["c"] = x.dims[0], x.dims[1]
            dims["h"], dims["w"] = _spatial(x.dims)
            layout, first = x, x
        y = tensors.get("y_tensor_uid")
        if y is not None and len(y.dims) >= 3:  # 1x1 out: global pooling, a reduction
            dims["out_h"], dims["out_w"] = _spatial(y.dims)
        window = params.get("window")
        if isinstance(window, list | tuple) and window:
            dims["r"], dims["s"] = _spatial([1, 1, *window])
        if "mode" in params or "resample_mode" in params:
            mode = params.get("mode", params.get("resample_mode"))
            flags["max_pool"] = int("MAX" in _enum_name(mode) or mode == 1)
    elif kind is OpKind.POINTWISE:
        ins = [tensors.get(f) for f in ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")]
        present = [x for x in ins if x is not None and x.dims]
        if present:
            big = max(_prod(x.dims) for x in present)
            dims["numel"] = big
            flags["broadcast"] = int(any(_prod(x.dims) < big for x in present))
            first = present[0]
    else:  # batch norms, reductions: a generic N, C, rest view of the first input
        x = tensors.get("x_tensor_uid", first)
        if x is not None and x.dims:
            dims["n"] = x.dims[0]
            dims["c"] = x.dims[1] if len(x.dims) > 1 else 1
            dims["rest"] = _prod(x.dims[2:])
            layout, first = x, x
    if layout is not None:
        _set_flag(flags, "channels_last", _channels_last(layout))
    dtype = first.dtype if first is not None else None
    if epilogue is not None:
        epilogue = min(max(epilogue, 0), MAX_EPILOGUE)
    return Problem(kind.value, dtype, {k: max(1, int(v)) for k, v in dims.items()}, flags, epilogue)


def _info(t: TensorAttributes) -> TensorInfo:
    dtype = t.data_type.value if t.data_type is not None else None
    return TensorInfo(tuple(t.dims), tuple(t.strides) if t.strides else None, dtype)


def problem_of(graph: OpGraph) -> Problem:
    """The problem of a graph (its core node; the other nodes count as the epilogue)."""
    node = graph.core_node()
    tensors = {
        f: _info(t)
        for f, t in [*node.inputs.items(), *node.outputs.items()]
        if t is not None and not t.is_scalar
    }
    return problem_from_tensors(node.kind, tensors, node.params, len(graph.nodes) - 1)
