"""Shape helpers shared by the op specs: filling in inferred output tensors and checking them."""

from __future__ import annotations

from collections.abc import Sequence

from dnntune.graph.node import Node
from dnntune.graph.ops.base import node_error
from dnntune.graph.tensor import TensorAttributes, channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType

__all__ = ["check_rank", "fill_output", "is_channels_last", "set_stats_type", "spatial_list"]


def is_channels_last(tensor: TensorAttributes) -> bool:
    """True when the strides are NHWC-like (channel stride 1 with more than one channel)."""
    if len(tensor.dims) < 3 or tensor.dims[1] <= 1 or len(tensor.strides) != len(tensor.dims):
        return False
    return tensor.strides == channels_last_strides(tensor.dims)


def fill_output(
    node: Node, field_name: str, dims: Sequence[int], like: TensorAttributes | None = None
) -> None:
    """Give the output tensor its inferred dims (if unset) and check them (if set).

    Strides default to the layout of ``like`` (channels-last stays channels-last) or row-major,
    and follow the dims in that layout if the caller sets other dims (``set_dims``).
    """
    tensor = node.outputs.get(field_name)
    if tensor is None:
        return
    dims = [int(d) for d in dims]
    if not tensor.dims:
        tensor.dims = dims
        tensor.strides = []
    elif tensor.dims != dims:
        # an output's dims are inferred once, when its node is added: a later set_dims on an
        # input left them as they were, and this message named nothing the caller had set
        raise node_error(
            node,
            field_name,
            f"dims {tensor.dims} do not match the inferred dims {dims}; an output's dims are "
            "inferred when its node is added and do not follow a later set_dims on its "
            f"inputs: set them to {dims} (set_dims), or build the graph again",
        )
    if not tensor.strides:
        if like is not None and is_channels_last(like) and len(dims) == len(like.dims):
            tensor.strides = channels_last_strides(dims)
            tensor._auto_strides = "channels_last"
        else:
            tensor.strides = contiguous_strides(dims)
            tensor._auto_strides = "row_major"


def set_stats_type(node: Node, field_name: str) -> None:
    """Statistics outputs (mean, inverse variance, softmax stats) are float32 unless given."""
    stat = node.outputs.get(field_name)
    if stat is not None and (stat.data_type is None or stat._auto_data_type):
        stat._infer_data_type(DataType.FLOAT, by_op=True)


def check_rank(node: Node, field_name: str, tensor: TensorAttributes, ranks: Sequence[int]) -> None:
    if len(tensor.dims) not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise node_error(node, field_name, f"expected rank {allowed}, got dims {tensor.dims}")


def spatial_list(node: Node, name: str, n: int, default: int, minimum: int) -> list[int]:
    """A per-spatial-dim parameter list, defaulted and checked (length n, each >= minimum)."""
    value = node.params.get(name)
    if value is None:
        value = node.infer(name, [default] * n)
    if len(value) != n:
        raise node_error(
            node, name, f"expected {n} values (one per spatial dim), got {list(value)}"
        )
    if any(v < minimum for v in value):
        raise node_error(node, name, f"every value must be >= {minimum}, got {list(value)}")
    return list(value)
