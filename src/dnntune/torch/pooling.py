"""Pooling ops backed by dnntune (``max_pool2d``, ``avg_pool2d``), re-exported by
:mod:`dnntune.torch.functional`. Inference ops: with gradients needed they run PyTorch's op."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.graph.types import ResampleMode
from dnntune.torch._calls import GRADIENT_ROUTE, _grad_enabled, _pytorch_forced, prepared_call
from dnntune.torch._calls import grad_wanted as _grad_wanted
from dnntune.torch._calls import guarded as _guarded
from dnntune.torch._calls import pair as _pair
from dnntune.torch._support import recorded, tracing
from dnntune.torch.autograd import _sig
from dnntune.torch.graphs import pool_graph
from dnntune.torch.norms import _kind_reason
from dnntune.torch.runtime import NATIVE, kernel_for, native_memo

__all__ = ["avg_pool2d", "max_pool2d"]

#: per op, the signature it ran last (:class:`_memo.Recent`)
_pool_sites = {"max_pool2d": native_memo.sites(), "avg_pool2d": native_memo.sites()}


def _has_items(value: Any) -> bool:
    """An int, or a non-empty sequence: PyTorch's pooling takes an empty one (``()``, ``[]``)
    as "the kernel size"."""
    return isinstance(value, int) or len(value) > 0


# ---- pooling ---------------------------------------------------------------------------------
def _pool_lookup(op: str, input: torch.Tensor, options: tuple[Any, ...]) -> tuple[Any, Any]:
    """(memo key, what it runs) of a pooling call: the key is its raw arguments; (None, None)
    when one is unhashable or no tensor is given, or while PyTorch's ops are forced."""
    if _pytorch_forced.get():
        return None, None
    sites = _pool_sites[op]
    recent = sites.get(0)  # one entry per op: the signature it ran last
    if recent is not None and recent.fits(options, input):
        return None, recent.call
    try:
        if input.is_neg():
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and input.requires_grad
        key = (
            op,
            type(input),  # a subclass, a nested or fake tensor: another signature
            input.shape,
            input.stride(),
            input.dtype,
            input.device,
            options,
            grad,
        )
        known = native_memo.lookup(key)
        if known is not None:
            native_memo.keep(sites, 0, key, (input,), options, known)
        return key, known
    except (AttributeError, TypeError, RuntimeError):  # no tensor, an unhashable argument (a
        # list), a tensor without shape or strides (nested, sparse CSR)
        return None, None


def _pool(
    op: str,
    mode: ResampleMode,
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None,
    padding: int | Sequence[int],
    fallback: Callable[[], torch.Tensor],
    extra: str | None,
    memo: tuple[Any, ...] | None,
) -> torch.Tensor:
    """The first call of a pooling signature (or one that is not memoized): checks, the
    kernel, and the prepared call remembered under ``memo``."""
    kind = _kind_reason(memo, [input])  # before any shape is read
    if kind is not None:
        return _guarded(op, [input], fallback, fallback, kind)
    window = _pair(kernel_size, "kernel_size")
    st = _pair(kernel_size if stride is None or not _has_items(stride) else stride, "stride")
    pad = _pair(padding, "padding")

    key = (op, _sig(input), window, st, pad, mode.value)

    def run() -> torch.Tensor:
        kernel = kernel_for(key, lambda: pool_graph(input, mode, window, st, pad), [input])
        if memo is not None:
            native_memo.note(memo, kernel)
        if kernel.native:
            return fallback()
        y = kernel(input)[0]
        if memo is not None:
            native_memo.remember(memo, prepared_call(kernel, (input,), (input,), _same))
        return y

    if _grad_wanted(input):
        # first: a training step's pooling runs PyTorch's op whatever its options (a
        # ``ceil_mode`` pool warned in every training run; new-user audit)
        extra = GRADIENT_ROUTE
    elif extra is None and input.dim() != 4:
        extra = f"only 4-D input is supported, got {input.dim()}-D"
    return _guarded(op, [input], run, fallback, extra, memo)


def _unbatched(input: Any) -> bool:
    """An unbatched image [C, H, W], which ``nn.MaxPool2d`` and ``nn.AvgPool2d`` take: it runs
    as a batch of one, as PyTorch runs it (a view each way), as a conv's does. It fell back
    with a warning ("only 4-D input is supported, got 3-D") before a new-user audit, for a
    single image through an optimized CNN whose convs ran it quietly. A plain strided tensor
    only: other kinds (nested, sparse, subclasses) keep their own route, PyTorch's op."""
    plain = type(input) is torch.Tensor and input.layout == torch.strided
    return plain and not input.is_nested and input.dim() == 3


def _same(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x,)


def max_pool2d(
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> torch.Tensor:
    """``F.max_pool2d`` (dilation 1, floor mode; other options run in PyTorch)."""
    options = (kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    if tracing():  # PyTorch's op, or under torch.fx this call (as functional.conv2d's)
        node = recorded(max_pool2d, input, *options)
        return node if node is not None else F.max_pool2d(input, *options)  # type: ignore[call-overload]
    memo, known = _pool_lookup("max_pool2d", input, options)
    if known is not None and known is not NATIVE:
        return known(input)  # a signature seen before: its prepared call

    def fallback() -> torch.Tensor:
        return F.max_pool2d(  # type: ignore[call-overload]
            input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
        )

    if known is NATIVE:
        return fallback()
    extra = None
    if _pair(dilation, "dilation") != (1, 1) or ceil_mode or return_indices:
        extra = "dilation, ceil_mode and return_indices are not supported"
    elif _unbatched(input):
        return max_pool2d(input.unsqueeze(0), kernel_size, stride, padding).squeeze(0)
    return _pool(
        "max_pool2d",
        ResampleMode.MAXPOOL,
        input,
        kernel_size,
        stride,
        padding,
        fallback,
        extra,
        memo,
    )


def avg_pool2d(
    input: torch.Tensor,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> torch.Tensor:
    """``F.avg_pool2d`` (floor mode, no divisor override; other options run in PyTorch)."""
    options = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    if tracing():  # PyTorch's op, or under torch.fx this call (as functional.conv2d's)
        node = recorded(avg_pool2d, input, *options)
        return node if node is not None else F.avg_pool2d(input, *options)  # type: ignore[arg-type]
    memo, known = _pool_lookup("avg_pool2d", input, options)
    if known is not None and known is not NATIVE:
        return known(input)  # a signature seen before: its prepared call

    def fallback() -> torch.Tensor:
        return F.avg_pool2d(
            input,
            kernel_size,  # type: ignore[arg-type]
            stride,  # type: ignore[arg-type]
            padding,  # type: ignore[arg-type]
            ceil_mode,
            count_include_pad,
            divisor_override,
        )

    if known is NATIVE:
        return fallback()
    extra = None
    if ceil_mode or divisor_override is not None:
        extra = "ceil_mode and divisor_override are not supported"
    elif _unbatched(input):
        batched = avg_pool2d(
            input.unsqueeze(0), kernel_size, stride, padding, False, count_include_pad
        )
        return batched.squeeze(0)
    mode = (
        ResampleMode.AVGPOOL_INCLUDE_PADDING
        if count_include_pad
        else ResampleMode.AVGPOOL_EXCLUDE_PADDING
    )
    return _pool("avg_pool2d", mode, input, kernel_size, stride, padding, fallback, extra, memo)
