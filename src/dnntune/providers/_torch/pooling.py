"""Resample (pooling) as ATen calls, writing the caller's buffer directly where it can.

A pooling graph is usually one node whose output is the caller's buffer, so the cost of a plan
is the pooling kernel plus whatever is done to land its result there. Eager code pays only the
kernel; a functional call followed by ``copy_`` pays a second pass over the output (for a 3x3
stride-1 pool, as much traffic again as the pool). So each form below writes the caller's
buffer with the op's ``out=`` variant when the types agree:

* global pooling (the window is the whole spatial extent, no padding): ``mean`` / ``amax`` over
  the spatial dims, as ``F.adaptive_avg_pool2d(x, 1)`` does for ResNet's global pool;
* average pooling: ``avg_pool{2,3}d(..., out=y)``;
* max pooling on CUDA: ``max_pool{2,3}d_with_indices(..., out=(y, indices))``. CUDA's
  ``F.max_pool2d`` computes the indices too (ATen has no index-free CUDA max pool), so this
  is the eager kernel itself; the indices land in a per-call scratch tensor, as eager's do. The
  CPU has an index-free max pool, so there the functional form plus ``copy_`` stays cheaper.

``out=`` is used only where the caller's buffer has the layout the op gives its result (found
once, on the meta device): a pooling kernel handed another layout either computes into a
temporary and copies (no gain) or, as the CPU's ``avg_pool3d`` does with a channels-last
buffer, writes it as if it were its own layout (wrong values).

fp16/bf16 data pools in its own type (the max is exact; ATen's average pools accumulate in
float32), except on the CPU, which has no fp16/bf16 3-D average pool: those run in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.graph.node import Node
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import ResampleMode
from dnntune.providers._torch.conv import _pad_arg
from dnntune.providers._torch.program import LowerContext, Reader, Slots, Step, is_low_precision

__all__ = ["lower_resample"]

Fn = Callable[..., Any]

_MAX_POOL: dict[int, Fn] = {2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL: dict[int, Fn] = {2: torch._C._nn.avg_pool2d, 3: torch._C._nn.avg_pool3d}
_MAX_POOL_WITH_INDICES: dict[int, Fn] = {
    2: torch._C._nn.max_pool2d_with_indices,
    3: torch._C._nn.max_pool3d_with_indices,
}


def _spatial(node: Node, name: str, n: int, default: int) -> list[int]:
    value = node.params.get(name)
    return [default] * n if value is None else [int(v) for v in value]


def _meta_input(
    ctx: LowerContext, x_t: TensorAttributes, dtype: torch.dtype, pad: list[int] | None, fill: float
) -> torch.Tensor:
    """A meta tensor laid out as the pooling op will see ``x`` (cast, then padded)."""
    x = torch.empty_strided(x_t.dims, x_t.strides, dtype=ctx.dtype(x_t), device="meta")
    x = x.to(dtype)
    return x if pad is None else F.pad(x, pad, value=fill)


def _direct_out(
    ctx: LowerContext, y_t: TensorAttributes, dtype: torch.dtype, natural: torch.Tensor
) -> int | None:
    """The slot of the caller's buffer when an ``out=`` variant may write it: the types agree
    and the buffer is laid out as the op lays out its result (``natural``, a meta tensor)."""
    same = all(
        d == 1 or a == b for d, a, b in zip(y_t.dims, natural.stride(), y_t.strides, strict=True)
    )
    return ctx.out_buffer(y_t, dtype) if same else None


def max_pool_writes_indices(device: torch.device) -> bool:
    """Whether max pooling on ``device`` goes through ``max_pool*d_with_indices(out=...)``.

    True wherever ``F.max_pool2d`` itself computes indices (every device but the CPU).
    """
    return device.type != "cpu"


def lower_resample(ctx: LowerContext, node: Node) -> Step:
    x_t, y_t = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x_t is not None and y_t is not None
    n = len(x_t.dims) - 2
    window = _spatial(node, "window", n, 1)
    stride = _spatial(node, "stride", n, 1)
    pre, post = _spatial(node, "pre_padding", n, 0), _spatial(node, "post_padding", n, 0)
    mode: ResampleMode = node.params["mode"]
    if window == list(x_t.dims[2:]) and not any(pre) and not any(post):
        return _global_pool(ctx, node, mode)
    # the CPU has no fp16/bf16 3-D average pooling: pool those in float32
    upcast = (
        ctx.device.type == "cpu"
        and n == 3
        and mode is not ResampleMode.MAXPOOL
        and is_low_precision(ctx.dtype(x_t))
    )
    dtype = torch.float32 if upcast else ctx.dtype(x_t)
    read = ctx.read(x_t, dtype if upcast else None)
    symmetric = pre == post
    pad = None if symmetric else _pad_arg(pre, post)
    padding = pre if symmetric else [0] * n
    fill = -math.inf if mode is ResampleMode.MAXPOOL else 0.0
    meta_x = _meta_input(ctx, x_t, dtype, pad, fill)
    if pad is not None:
        # asymmetric padding: pad explicitly (max pads with -inf), then pool without padding
        read = _padded(read, pad, fill)
    if mode is ResampleMode.MAXPOOL:
        return _max_pool(ctx, node, read, meta_x, window, stride, padding)
    return _avg_pool(ctx, node, read, meta_x, window, stride, padding, pad)


def _padded(read: Reader, pad: list[int], fill: float) -> Reader:
    def read_padded(slots: Slots) -> torch.Tensor:
        return F.pad(read(slots), pad, value=fill)

    return read_padded


def _global_pool(ctx: LowerContext, node: Node, mode: ResampleMode) -> Step:
    """A window covering every spatial element: one reduction over the spatial dims."""
    x_t, y_t = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x_t is not None and y_t is not None
    dims = tuple(range(2, len(x_t.dims)))
    reduce = torch.amax if mode is ResampleMode.MAXPOOL else torch.mean
    read = ctx.read(x_t)
    natural = reduce(_meta_input(ctx, x_t, ctx.dtype(x_t), None, 0.0), dims, keepdim=True)
    out = _direct_out(ctx, y_t, ctx.dtype(x_t), natural)
    if out is not None:

        def global_pool_out(slots: Slots) -> None:
            reduce(read(slots), dims, keepdim=True, out=slots[out])

        return global_pool_out
    write = ctx.write(y_t)

    def global_pool(slots: Slots) -> None:
        write(slots, reduce(read(slots), dims, keepdim=True))

    return global_pool


def _max_pool(
    ctx: LowerContext,
    node: Node,
    read: Reader,
    meta_x: torch.Tensor,
    window: list[int],
    stride: list[int],
    padding: list[int],
) -> Step:
    y_t = node.outputs["y_tensor_uid"]
    assert y_t is not None
    n = len(window)
    pool_out = _MAX_POOL_WITH_INDICES[n]
    dilation = [1] * n
    out = None
    if max_pool_writes_indices(ctx.device):
        natural, _ = pool_out(meta_x, window, stride, padding, dilation, False)
        out = _direct_out(ctx, y_t, meta_x.dtype, natural)
    if out is not None:
        device = ctx.device

        def maxpool_out(slots: Slots) -> None:
            # the kernel resizes the empty index tensor to the layout it wants (never a copy)
            indices = torch.empty(0, dtype=torch.int64, device=device)
            pool_out(
                read(slots), window, stride, padding, dilation, False, out=(slots[out], indices)
            )

        return maxpool_out
    max_pool = _MAX_POOL[n]
    write = ctx.write(y_t)

    def maxpool(slots: Slots) -> None:
        write(slots, max_pool(read(slots), window, stride, padding))

    return maxpool


def _avg_pool(
    ctx: LowerContext,
    node: Node,
    read: Reader,
    meta_x: torch.Tensor,
    window: list[int],
    stride: list[int],
    padding: list[int],
    pad: list[int] | None,
) -> Step:
    x_t, y_t = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x_t is not None and y_t is not None
    mode: ResampleMode = node.params["mode"]
    avg_pool = _AVG_POOL[len(window)]
    # explicitly padded input: every window has the full size, so count the padding and, to
    # exclude it, rescale by (window size / real elements), a constant map built here once
    include = mode is ResampleMode.AVGPOOL_INCLUDE_PADDING or pad is not None
    dtype = meta_x.dtype
    rescale = None
    if pad is not None and mode is ResampleMode.AVGPOOL_EXCLUDE_PADDING:
        rescale = _exclusion_rescale(x_t.dims[2:], pad, window, stride).to(ctx.device, dtype)
    if rescale is None:
        natural = avg_pool(meta_x, window, stride, padding, False, include)
        out = _direct_out(ctx, y_t, dtype, natural)
    else:
        # the rescaling multiply (a TensorIterator op) writes any layout correctly
        out = ctx.out_buffer(y_t, dtype)
    if out is not None and rescale is None:

        def avgpool_out(slots: Slots) -> None:
            avg_pool(read(slots), window, stride, padding, False, include, None, out=slots[out])

        return avgpool_out
    if out is not None:
        assert rescale is not None
        scale = rescale

        def avgpool_rescaled_out(slots: Slots) -> None:
            y = avg_pool(read(slots), window, stride, padding, False, include)
            torch.mul(y, scale, out=slots[out])

        return avgpool_rescaled_out
    write = ctx.write(y_t)

    def avgpool(slots: Slots) -> None:
        y = avg_pool(read(slots), window, stride, padding, False, include)
        write(slots, y if rescale is None else y * rescale)

    return avgpool


def _exclusion_rescale(
    spatial: list[int], pad: list[int], window: list[int], stride: list[int]
) -> torch.Tensor:
    """[1, 1, *out] map of (window size / real elements in the window), in float64."""
    ones = F.pad(torch.ones([1, 1, *spatial], dtype=torch.float64), pad)
    count = _AVG_POOL[len(window)](ones, window, stride, 0) * math.prod(window)
    return math.prod(window) / count
