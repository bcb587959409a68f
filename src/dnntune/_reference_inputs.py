"""Variant packs for trying a graph: random inputs of the right layout, fresh output buffers.

Values depend on the role a tensor plays, so that every engine (half precision included) gets a
well-conditioned problem: operands of long dot products are scaled by ``1/sqrt(K)`` so outputs
stay of order one, variances and the arguments of log/sqrt are positive, attention masks keep at
least one key per row. Values come from a generator seeded by ``(seed, uid)``, so adding a tensor
does not change the others. They are drawn on the pack's device (a 64 M-element tensor takes about
0.3 s to draw on one CPU core and microseconds on a GPU); ``draw_on="cpu"`` draws them on the CPU,
which gives the same pack on every device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dnntune._reference_tolerance import reduction_length
from dnntune.errors import InvalidValueError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, PointwiseMode

__all__ = ["DEFAULT_MAX_PACK_BYTES", "check_pack_size", "make_inputs", "make_outputs", "pack_bytes"]

#: the limit the CLI puts on one graph's variant pack unless ``--max-input-gb`` raises it: a
#: graph that validates can still ask for far more than a device holds (a padded stride raised
#: by 10**6 makes a 12 GB buffer for a few kilobytes of values)
DEFAULT_MAX_PACK_BYTES = 8 << 30

#: draws logical values (float32, or bool) for a tensor of the given dims, on the generator's device
Draw = Callable[[torch.Generator, list[int]], torch.Tensor]


def _uniform(low: float, high: float, scale: float = 1.0) -> Draw:
    def draw(gen: torch.Generator, dims: list[int]) -> torch.Tensor:
        values = torch.empty(dims, dtype=torch.float32, device=gen.device)
        values.uniform_(low, high, generator=gen)
        return values * scale if scale != 1.0 else values

    return draw


def _keep(gen: torch.Generator, dims: list[int]) -> torch.Tensor:
    """Keep three keys in four; the first key of every row is always kept."""
    keep = torch.rand(dims, generator=gen, device=gen.device) < 0.75
    if keep.dim() and keep.shape[-1] > 0:
        keep[..., 0] = True
    return keep


def _keep_mask(gen: torch.Generator, dims: list[int]) -> torch.Tensor:
    return _keep(gen, dims).to(torch.float32)  # bool tensors take it as is


def _additive_mask(gen: torch.Generator, dims: list[int]) -> torch.Tensor:
    """Small biases in [-1, 1) with -inf where a key is masked out."""
    bias = torch.empty(dims, dtype=torch.float32, device=gen.device)
    bias.uniform_(-1.0, 1.0, generator=gen)
    return bias.masked_fill(~_keep(gen, dims), -math.inf)


def _coin(gen: torch.Generator, dims: list[int]) -> torch.Tensor:
    return (torch.rand(dims, generator=gen, device=gen.device) < 0.5).to(torch.float32)


_DEFAULT: Draw = _uniform(-1.0, 1.0)
_POSITIVE: Draw = _uniform(0.5, 2.0)
_SCALE: Draw = _uniform(0.5, 1.5)
_POSITIVE_OPERAND = {
    (PointwiseMode.LOG, "in_0_tensor_uid"),
    (PointwiseMode.SQRT, "in_0_tensor_uid"),
    (PointwiseMode.RSQRT, "in_0_tensor_uid"),
    (PointwiseMode.POW, "in_0_tensor_uid"),
    (PointwiseMode.RECIPROCAL, "in_0_tensor_uid"),
    (PointwiseMode.DIV, "in_1_tensor_uid"),
}
#: (op, field) whose tensor is one operand of a K-term dot product: scaled by 1/sqrt(K). A batch
#: norm's backward sums dy over the N*H*W values of a channel (DBIAS = sum dy, DSCALE = sum dy
#: * x_hat): unscaled, those sums are of order sqrt(K) and a float32 engine's rounding of them
#: (1.5e-4 on 0.29 at K = 8195, ATen's CPU kernel) falls outside a tolerance that assumes outputs
#: of order one
_DOT_OPERAND = {
    (OpKind.CONV_FPROP, "w_tensor_uid"),
    (OpKind.CONV_DGRAD, "w_tensor_uid"),
    (OpKind.CONV_WGRAD, "dy_tensor_uid"),
    (OpKind.MATMUL, "b_tensor_uid"),
    (OpKind.BATCHNORM_BACKWARD, "dy_tensor_uid"),
}
_NORMS = {
    OpKind.LAYERNORM,
    OpKind.RMSNORM,
    OpKind.BATCHNORM,
    OpKind.BATCHNORM_INFERENCE,
    OpKind.BATCHNORM_BACKWARD,
}


def _role(node: Node, field_name: str) -> Draw | None:
    """How to draw a tensor read by ``node`` as ``field_name``; None: no special role."""
    kind = node.kind
    if (kind, field_name) in _DOT_OPERAND:
        return _uniform(-1.0, 1.0, 1.0 / math.sqrt(reduction_length(node)))
    if field_name == "inv_variance_tensor_uid" or field_name == "prev_running_variance_tensor_uid":
        return _POSITIVE
    if kind in _NORMS and field_name == "scale_tensor_uid":
        return _SCALE
    if kind is OpKind.SDPA and field_name == "attn_mask_tensor_uid":
        mask = node.inputs[field_name]
        is_bool = mask is not None and mask.data_type is DataType.BOOLEAN
        return _keep_mask if is_bool else _additive_mask
    if kind is OpKind.POINTWISE:
        mode = node.params.get("operation")
        if (mode, field_name) in _POSITIVE_OPERAND:
            return _POSITIVE
        if mode is PointwiseMode.BINARY_SELECT and field_name == "in_2_tensor_uid":
            return _coin
    return None


def _draw_for(graph: OpGraph, tensor: TensorAttributes) -> Draw:
    for node in graph.nodes:
        for field_name, t in node.inputs.items():
            if t is tensor:
                role = _role(node, field_name)
                if role is not None:
                    return role
    return _DEFAULT


def _values(draw: Draw, gen: torch.Generator, dims: list[int], dtype: DataType) -> torch.Tensor:
    """Logical values of ``dims`` in ``dtype`` (on the generator's device)."""
    if dtype is DataType.BOOLEAN:
        return draw(gen, dims) != 0 if draw in (_keep_mask, _coin) else _coin(gen, dims) != 0
    if not dtype.is_floating:
        # a positive operand (a divisor, a log's or square root's) stays positive: an integer
        # division by zero has no right answer to verify against
        if draw is _POSITIVE:
            low, high = 1, 9
        else:
            low = 0 if dtype is DataType.UINT8 else -8
            high = low + 17
        ints = torch.randint(low, high, dims, generator=gen, device=gen.device)
        return ints.to(dtype.to_torch())
    return draw(gen, dims).to(dtype.to_torch())


def _allocate(tensor: TensorAttributes, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer with the tensor's dims and strides (gaps of padded layouts zeroed too)."""
    storage = torch.zeros(tensor.storage_size(), dtype=dtype, device=device)
    return storage.as_strided(tensor.dims, tensor.strides)


def _fill(buffer: torch.Tensor, values: torch.Tensor, tensor: TensorAttributes) -> None:
    """Copy logical values into a strided buffer; stride-0 (broadcast) dims are written once."""
    index = tuple(
        slice(0, 1) if s == 0 and d > 1 else slice(None)
        for d, s in zip(tensor.dims, tensor.strides, strict=True)
    )
    target, source = buffer[index], values.to(buffer.device)[index]
    if target.numel() > 1 and tensor.storage_size() < target.numel():
        raise InvalidValueError(
            f"{tensor.describe()}: strides {tensor.strides} make elements overlap; make_inputs "
            "can fill only layouts whose elements are distinct (broadcast dims with stride 0 "
            "are fine); pass your own tensor for this one"
        )
    target.copy_(source)


def _uid(key: Any, graph: OpGraph) -> int:
    if isinstance(key, TensorAttributes):
        if key.uid is None:
            graph.assign_uids()
        assert key.uid is not None
        return key.uid
    return int(key)


def _override(
    overrides: Mapping[Any, DataType | torch.dtype] | None, graph: OpGraph, tensor: TensorAttributes
) -> DataType:
    dtype: DataType | torch.dtype | None = None
    if overrides:
        by_uid = {_uid(k, graph): v for k, v in overrides.items()}
        dtype = by_uid.get(tensor.uid)  # type: ignore[arg-type]
    if dtype is None:
        dtype = tensor.data_type or graph.io_data_type or DataType.FLOAT
    return dtype if isinstance(dtype, DataType) else DataType.from_torch(dtype)


def _ready(graph: OpGraph) -> None:
    if not graph.is_validated:
        graph.validate()


def make_outputs(
    graph: OpGraph, device: str | torch.device | None = None
) -> dict[int, torch.Tensor]:
    """Fresh zeroed buffers for every non-virtual output of ``graph``, with its strides and dtype.

    Args:
        graph: the graph (validated here if it is not yet).
        device: where to allocate; default CPU.

    Returns:
        ``{uid: tensor}`` for every tensor of ``graph.output_tensors()``.
    """
    _ready(graph)
    dev = torch.device(device if device is not None else "cpu")
    out: dict[int, torch.Tensor] = {}
    for t in graph.output_tensors():
        assert t.uid is not None
        out[t.uid] = _allocate(t, (t.data_type or DataType.FLOAT).to_torch(), dev)
    return out


def _pack_tensors(
    graph: OpGraph, dtype_overrides: Mapping[Any, DataType | torch.dtype] | None
) -> list[tuple[TensorAttributes, int]]:
    """Every buffer :func:`make_inputs` allocates, with its size in bytes (padding included)."""
    out = []
    for t in graph.input_tensors():
        itemsize = _override(dtype_overrides, graph, t).to_torch().itemsize
        out.append((t, t.storage_size() * itemsize))
    for t in graph.output_tensors():
        itemsize = (t.data_type or DataType.FLOAT).to_torch().itemsize
        out.append((t, t.storage_size() * itemsize))
    return out


def pack_bytes(
    graph: OpGraph, dtype_overrides: Mapping[Any, DataType | torch.dtype] | None = None
) -> int:
    """Bytes :func:`make_inputs` allocates for ``graph``: every input and output buffer.

    A buffer spans its layout from the first to the last element, so padded strides count
    (dims [2, 3] with strides [1000000, 1] take 1000003 elements). Nothing is allocated here.
    The graph is validated first if it is not yet.
    """
    _ready(graph)
    return sum(size for _, size in _pack_tensors(graph, dtype_overrides))


def _fmt_bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n} bytes"


def check_pack_size(
    graph: OpGraph,
    max_bytes: int,
    dtype_overrides: Mapping[Any, DataType | torch.dtype] | None = None,
) -> int:
    """The bytes of ``graph``'s variant pack (:func:`pack_bytes`), refused over ``max_bytes``.

    Raises:
        InvalidValueError: the pack needs more than ``max_bytes``; the message gives the total
            and the largest tensor with its dims and strides, before anything is allocated.
    """
    _ready(graph)
    sizes = _pack_tensors(graph, dtype_overrides)
    total = sum(size for _, size in sizes)
    if total > max_bytes:
        largest, largest_bytes = max(sizes, key=lambda item: item[1])
        raise InvalidValueError(
            f"graph {graph.name!r} needs {_fmt_bytes(total)} for its input and output buffers, "
            f"more than the limit of {_fmt_bytes(max_bytes)}; the largest is tensor "
            f"{largest.name!r} (uid {largest.uid}, dims {largest.dims}, strides "
            f"{largest.strides}): {_fmt_bytes(largest_bytes)}. Check its strides, or raise "
            "the limit (the CLI's --max-input-gb)"
        )
    return total


def make_inputs(
    graph: OpGraph,
    device: str | torch.device | None = None,
    *,
    seed: int = 0,
    dtype_overrides: Mapping[Any, DataType | torch.dtype] | None = None,
    draw_on: str | torch.device | None = None,
    max_bytes: int | None = None,
) -> dict[int, torch.Tensor]:
    """A full variant pack: random inputs and zeroed output buffers, laid out as the graph says.

    Every input tensor (``graph.input_tensors()``) gets a buffer with its dims, strides and data
    type, filled with values suited to its role (see the module docstring); every non-virtual
    output gets a zeroed buffer. Pass-by-value scalars are not in the pack.

    Args:
        graph: the graph (validated here if it is not yet).
        device: where to allocate; default CPU.
        seed: the same seed gives the same values on the same kind of device.
        dtype_overrides: ``{uid or tensor: DataType or torch.dtype}`` to allocate some tensors
            in another type than the graph declares.
        draw_on: where the random values are drawn (default: ``device``). ``"cpu"`` is slower
            for large tensors but gives the same values whatever ``device`` is (compare a GPU
            result with a CPU reference run on its own pack).
        max_bytes: refuse a graph whose pack (:func:`pack_bytes`) needs more bytes than this,
            before allocating anything; None: no limit.

    Returns:
        ``{uid: tensor}`` for every tensor the caller must pass to ``execute``.

    Raises:
        InvalidValueError: for a layout whose elements overlap (other than stride-0 broadcast),
            or a pack larger than ``max_bytes``.
    """
    _ready(graph)
    if max_bytes is not None:
        check_pack_size(graph, max_bytes, dtype_overrides)
    dev = torch.device(device if device is not None else "cpu")
    where = torch.device(draw_on) if draw_on is not None else dev
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    pack: dict[int, torch.Tensor] = {}
    for t in graph.input_tensors():
        assert t.uid is not None
        dtype = _override(dtype_overrides, graph, t)
        gen = torch.Generator(where).manual_seed((seed * 1_000_003 + t.uid) % (1 << 63))
        values = _values(_draw_for(graph, t), gen, t.dims, dtype)
        buffer = _allocate(t, dtype.to_torch(), dev)
        _fill(buffer, values, t)
        pack[t.uid] = buffer
    pack.update(make_outputs(graph, dev))
    return pack
