"""The living definition of every operation: the graph run in plain PyTorch eager, no tricks.

Every engine's answer is checked against :func:`run` (seed 004: a faster candidate is kept only
if its output matches the reference within the data type's tolerance). The reference is written
to be obviously right, not fast:

* Precision: float64 on the CPU when the problem is small (every tensor below
  :data:`FLOAT64_MAX_ELEMENTS` = 2**22 elements), float32 otherwise, and always float64 when a
  tensor or a data type of the graph is double. Inputs are read exactly (half, bfloat16 and fp8
  convert losslessly); intermediates stay in that precision, never rounded to the intermediate
  type. A tensor whose type differs from the one the graph's types give it (an identity node's
  output set to bfloat16, a bfloat16 output of a float graph) is a cast: what reads it reads
  the value rounded to that type, as cuDNN frontend's samples compute it.
* No TF32: on CUDA, TF32 for matmul and cuDNN convolutions is switched off for the duration of
  :func:`run` and restored afterwards.
* One small function per :class:`~dnntune.graph.OpKind` (``dnntune._reference_ops.OPS``);
  nodes run in ``graph.topological_nodes()`` order.

Also here: per-dtype tolerances and :func:`compare` (from ``_reference_tolerance``) and
:func:`make_inputs` / :func:`make_outputs` to build variant packs, and :func:`pack_bytes` /
:func:`check_pack_size` for what a pack costs before it is made (from ``_reference_inputs``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from dnntune._reference_check import (
    OutputCheck,
    OutputsCheck,
    check_outputs,
    data_scale,
    tolerance_within,
)
from dnntune._reference_inputs import (
    DEFAULT_MAX_PACK_BYTES,
    check_pack_size,
    make_inputs,
    make_outputs,
    pack_bytes,
)
from dnntune._reference_ops import OPS
from dnntune._reference_tolerance import (
    Comparison,
    Tolerance,
    compare,
    default_tolerance,
    reduction_length,
    tolerance_for,
)
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = [
    "DEFAULT_MAX_PACK_BYTES",
    "FLOAT64_MAX_ELEMENTS",
    "Comparison",
    "OutputCheck",
    "OutputsCheck",
    "Tolerance",
    "check_outputs",
    "check_pack_size",
    "compare",
    "data_scale",
    "default_tolerance",
    "make_inputs",
    "make_outputs",
    "pack_bytes",
    "reduction_length",
    "reference_dtype",
    "run",
    "tolerance_for",
    "tolerance_within",
]

logger = logging.getLogger(__name__)

#: on the CPU, graphs whose every tensor has fewer elements than this run in float64
FLOAT64_MAX_ELEMENTS = 1 << 22


def reference_dtype(
    graph: OpGraph,
    device: str | torch.device,
    precision: torch.dtype | DataType | None = None,
) -> torch.dtype:
    """The dtype :func:`run` computes in (float32 or float64); see the module docstring.

    Args:
        graph: the graph.
        device: where the computation runs.
        precision: an explicit choice (float32 or float64) that overrides the rule.
    """
    if precision is not None:
        dtype = precision.to_torch() if isinstance(precision, DataType) else precision
        if dtype not in (torch.float32, torch.float64):
            raise InvalidValueError(
                f"reference precision must be float32 or float64, got {dtype}; the reference "
                "never computes in a narrower type than the inputs"
            )
        return dtype
    declared = [t.data_type for t in graph.tensors]
    declared += [graph.io_data_type, graph.compute_data_type, graph.intermediate_data_type]
    if DataType.DOUBLE in declared:
        return torch.float64
    small = all(t.numel < FLOAT64_MAX_ELEMENTS for t in graph.tensors)
    return torch.float64 if torch.device(device).type == "cpu" and small else torch.float32


@contextlib.contextmanager
def _exact_float32() -> Iterator[None]:
    """Switch TF32 off for matmul and cuDNN convolutions; restore the caller's settings after."""
    with warnings.catch_warnings():
        # Newer torch versions may warn about the legacy flags; they still work, and the
        # reference must not turn a warning into an error in strict test suites.
        warnings.simplefilter("ignore")
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _pack_by_uid(graph: OpGraph, variant_pack: Mapping[Any, Any]) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for key, value in variant_pack.items():
        if key is None:  # an optional tensor left out, skipped as execute() skips it
            continue
        if isinstance(key, TensorAttributes):
            if key.uid is None:
                graph.assign_uids()
            uid = key.uid
        elif isinstance(key, int) and not isinstance(key, bool):
            uid = key
        else:
            raise InvalidValueError(
                f"variant pack keys must be TensorAttributes or int uids, got {key!r}"
            )
        assert uid is not None
        out[uid] = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return out


def _logical(tensor: TensorAttributes, value: torch.Tensor) -> torch.Tensor:
    """The buffer viewed by the tensor's logical dims.

    A buffer already shaped by the dims is used as is (its own strides say where each element
    lives). A flat (1-D) buffer holding the tensor's storage is viewed through its strides.
    """
    if list(value.shape) == tensor.dims:
        return value
    if value.dim() == 1 and value.numel() >= tensor.storage_size():
        return value.as_strided(tensor.dims, tensor.strides)
    raise InvalidValueError(
        f"variant pack: {tensor.describe()}: buffer has shape {list(value.shape)}; pass a tensor "
        f"with dims {tensor.dims} (strides {tensor.strides}) or a flat buffer of at least "
        f"{tensor.storage_size()} elements"
    )


def _fit(
    node: Node, field_name: str, tensor: TensorAttributes, value: torch.Tensor
) -> torch.Tensor:
    """A node result shaped by the output tensor's dims (broadcast or reshaped if needed)."""
    if list(value.shape) == tensor.dims:
        return value
    if value.numel() == tensor.numel:
        return value.reshape(tensor.dims)
    try:
        return value.expand(tensor.dims)
    except RuntimeError:
        raise InvalidValueError(
            f"node {node.name!r} ({node.kind.value}): {field_name}: the reference computed shape "
            f"{list(value.shape)} but {tensor.describe()} declares dims {tensor.dims}; fix the "
            "output dims"
        ) from None


def run(
    graph: OpGraph,
    variant_pack: Mapping[Any, Any],
    *,
    device: str | torch.device | None = None,
    precision: torch.dtype | DataType | None = None,
) -> dict[int, torch.Tensor]:
    """Evaluate ``graph`` on the inputs of ``variant_pack`` and return every non-virtual output.

    Args:
        graph: the graph (validated here if it is not yet).
        variant_pack: ``{uid or TensorAttributes: tensor}``; every input tensor must be present,
            shaped by its logical dims (or a flat buffer read through the strides). Output
            buffers may be present; they are ignored and never written.
        device: where to compute; default the device of the first input.
        precision: float32 or float64 to override :func:`reference_dtype`'s rule.

    Returns:
        ``{uid: tensor}`` for every tensor of ``graph.output_tensors()``, in the reference
        precision, on ``device``, contiguous and shaped by the tensor's dims.

    Raises:
        InvalidValueError: an input is missing or its buffer does not fit the tensor.
        NotSupportedError: the graph has an operation the reference does not know.
    """
    if not graph.is_validated:
        graph.validate()
    pack = _pack_by_uid(graph, variant_pack)
    inputs = graph.input_tensors()
    missing = [t for t in inputs if t.uid not in pack]
    if missing:
        listing = ", ".join(f"{t.uid} ({t.name})" for t in missing)
        raise InvalidValueError(
            f"reference: variant pack is missing input tensor uid(s) {listing}; "
            "make_inputs(graph) builds a complete pack"
        )
    if device is None:
        device = pack[inputs[0].uid].device if inputs else torch.device("cpu")  # type: ignore[index]
    dev = torch.device(device)
    dtype = reference_dtype(graph, dev, precision)
    logger.debug("reference: running graph %r in %s on %s", graph.name, dtype, dev)

    values: dict[int, torch.Tensor] = {}
    for t in inputs:
        # Always a copy: no result may alias the caller's buffers (an identity node would).
        values[id(t)] = _logical(t, pack[t.uid]).to(device=dev, dtype=dtype, copy=True)  # type: ignore[index]
    for t in graph.iter_scalars():
        values[id(t)] = torch.full(t.dims or [1], float(t.value), dtype=dtype, device=dev)  # type: ignore[arg-type]

    with torch.no_grad(), _exact_float32():
        for node in graph.topological_nodes():
            fn = OPS.get(node.kind)
            if fn is None:
                raise NotSupportedError(
                    f"reference: node {node.name!r}: no reference for {node.kind.value}; add one "
                    "to dnntune._reference_ops.OPS"
                )
            args = {f: values[id(t)] for f, t in node.inputs.items() if t is not None}
            results = fn(node, args)
            for field_name, produced in node.outputs.items():
                if produced is not None:
                    value = _fit(node, field_name, produced, results[field_name])
                    kind = produced.data_type
                    if kind is DataType.BOOLEAN and value.is_floating_point():
                        # a boolean holds whether the value is nonzero (C's and PyTorch's
                        # conversion): 0.5 is True, where truncating it first made it False
                        value = (value != 0).to(value.dtype)
                    elif kind is not None and not kind.is_floating and value.is_floating_point():
                        # an integer tensor holds what a conversion to it keeps (toward zero,
                        # as C's and PyTorch's): 7 / 2 is 3 in an INT32 output, not 3.5
                        value = value.trunc()
                    elif kind is not None and kind != graph.default_data_type(produced):
                        value = _cast(value, kind)
                    values[id(produced)] = value
    out: dict[int, torch.Tensor] = {}
    for t in graph.output_tensors():
        assert t.uid is not None
        out[t.uid] = _stored(values[id(t)], t.data_type).contiguous()
    return out


def _cast(value: torch.Tensor, kind: DataType) -> torch.Tensor:
    """``value`` rounded to ``kind``, in ``value``'s own dtype: a tensor whose type the caller
    chose, other than the graph's type for it, is a cast (cuDNN frontend's mixed-precision
    idiom, an identity node's output set to bfloat16; a bfloat16 output that a layer norm
    reads), and what reads it reads the cast value. Unrounded, the reference failed the
    engines that cast (TORCH_ENGINE: 0.12 off on a 128-deep matmul of bfloat16-cast float
    inputs) and passed one that fused the cast away."""
    try:
        target = kind.to_torch()
    except (KeyError, ValueError):  # a type PyTorch has no dtype for: left as computed
        return value
    if not value.is_floating_point() or target.itemsize >= value.element_size():
        return value
    return value.to(target).to(value.dtype)


def _stored(value: torch.Tensor, kind: DataType | None) -> torch.Tensor:
    """``value`` as an output of type ``kind`` holds it, in ``value``'s own dtype: an integer
    wraps as a conversion to it does (-6 in a uint8 is 250), and a float beyond the type's
    largest finite value is an infinity (-82324 in a half is -inf). Without this the check blamed
    engines that stored the right value (new-user audit, session 56). Rounding within the type's
    range is left to the comparison's tolerance."""
    if kind is None or kind is DataType.BOOLEAN or not value.is_floating_point():
        return value
    try:
        target = kind.to_torch()
    except (KeyError, ValueError):  # a type PyTorch has no dtype for: compared as computed
        return value
    if not kind.is_floating:
        # through int64, whose conversion to a narrower integer wraps (defined behaviour)
        wide = value.clamp(-(2.0**63), 2.0**63 - 1024).to(torch.int64)
        return wide.to(target).to(value.dtype)
    if kind not in (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT):
        return value  # the fp8 types: overflow saturates or is NaN by format, not inf
    limit = torch.finfo(target).max
    if limit >= torch.finfo(value.dtype).max:
        return value
    return torch.where(value.abs() > limit, value.sign() * math.inf, value)
