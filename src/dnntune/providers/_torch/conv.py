"""Convolution forward, data gradient and weight gradient as ATen calls (2-D and 3-D, grouped).

Symmetric padding goes to the convolution itself; the asymmetric part is added with ``F.pad``
(forward, weight gradient) or cropped from the gradient of the padded input (data gradient).
``CONVOLUTION`` mode is cross-correlation with the filter flipped in every spatial dim.

With ``LoweringOptions.patch_gemm`` a forward convolution over non-overlapping patches (stride
equal to the filter in every spatial dim, no padding, no dilation, one group: a ViT's or a
Swin's patch embedding) runs as one GEMM: the patches are gathered into rows (one copy of the
input) and multiplied by the flattened filter, the bias in the GEMM's epilogue
(:func:`patch_conv`). On the H100 cuDNN and PyTorch ran ViT-B/16's 3-channel bf16 patch
embedding with a non-tensor-core kernel (``precomputed_convolve_sgemm``, 275 us of a 3.26 ms
forward at batch 32) where the GEMM has K = 3 * 16 * 16 = 768.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.conv import ConvMode, conv_geometry
from dnntune.graph.tensor import TensorAttributes
from dnntune.providers._torch.program import LowerContext, Reader, Slots, Step, Writer

__all__ = [
    "ConvParts",
    "conv_parts",
    "is_patch_conv",
    "lower_conv_dgrad",
    "lower_conv_fprop",
    "lower_conv_wgrad",
    "patch_conv",
]

_CONV = {2: torch.conv2d, 3: torch.conv3d}
_RANKS = (4, 5)


def _pad_arg(pre: list[int], post: list[int]) -> list[int]:
    """``F.pad`` order: last dim (pre, post), then the dim before it, ..."""
    out: list[int] = []
    for p, q in zip(reversed(pre), reversed(post), strict=True):
        out += [p, q]
    return out


def _split_padding(pre: list[int], post: list[int]) -> tuple[list[int], list[int] | None]:
    """(symmetric padding for the conv, extra ``F.pad`` argument or None)."""
    common = [min(p, q) for p, q in zip(pre, post, strict=True)]
    extra_pre = [p - c for p, c in zip(pre, common, strict=True)]
    extra_post = [q - c for q, c in zip(post, common, strict=True)]
    if not any(extra_pre) and not any(extra_post):
        return common, None
    return common, _pad_arg(extra_pre, extra_post)


def _flip_dims(node: Node, rank: int) -> list[int] | None:
    if node.params.get("conv_mode") is ConvMode.CONVOLUTION:
        return list(range(2, rank))
    return None


def is_patch_conv(node: Node) -> bool:
    """``node`` is a forward cross-correlation over non-overlapping patches: stride equal to
    the filter in every spatial dim, no padding, no dilation, one group."""
    if node.kind is not OpKind.CONV_FPROP or node.params.get("conv_mode") is ConvMode.CONVOLUTION:
        return False
    x_t, w_t = node.inputs.get("x_tensor_uid"), node.inputs.get("w_tensor_uid")
    if x_t is None or w_t is None or len(x_t.dims) != len(w_t.dims) or len(x_t.dims) not in _RANKS:
        return False
    n = len(x_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    return (
        x_t.dims[1] == w_t.dims[1]
        and not any(pre)
        and not any(post)
        and all(d == 1 for d in dilation)
        and list(stride) == list(w_t.dims[2:])
    )


def patch_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """``conv2d``/``conv3d`` (same arguments) of a patch convolution (:func:`is_patch_conv`) as
    one GEMM: ``[N * patches, C * prod(k)] @ [C * prod(k), O]`` with the bias in its epilogue.

    The result is laid out channels-last (the GEMM's rows are the output pixels); its values
    are those of the convolution in NCHW order, and a writer copies it into the caller's
    layout. Rows and columns past the last whole patch are dropped, as the convolution drops
    them."""
    n, c = x.shape[0], x.shape[1]
    k = list(w.shape[2:])
    o = w.shape[0]
    outs = [size // kk for size, kk in zip(x.shape[2:], k, strict=True)]
    x = x[(slice(None), slice(None), *(slice(0, p * kk) for p, kk in zip(outs, k, strict=True)))]
    split: list[int] = []
    for p, kk in zip(outs, k, strict=True):
        split += [p, kk]
    rank = len(k)
    # [N, C, o1, k1, o2, k2, ...] -> [N, o1, o2, ..., C, k1, k2, ...]
    order = [0, *(2 + 2 * i for i in range(rank)), 1, *(3 + 2 * i for i in range(rank))]
    rows = x.reshape(n, c, *split).permute(order).reshape(-1, w[0].numel())
    flat = w.reshape(o, -1).t()
    y = rows @ flat if bias is None else torch.addmm(bias, rows, flat)
    # [N, o1, o2, ..., O] viewed as [N, O, o1, o2, ...]
    return y.view(n, *outs, o).permute(0, rank + 1, *range(1, rank + 1))


ConvParts = tuple[
    Callable[..., torch.Tensor], Reader, Reader, list[int], list[int], list[int], int, torch.dtype
]


def conv_parts(ctx: LowerContext, node: Node) -> ConvParts | None:
    """(conv function, x and w readers, stride, padding, dilation, groups, compute dtype) of a
    forward convolution that is one ATen call (symmetric padding, cross-correlation); None for
    one that needs ``F.pad`` or a flipped filter."""
    x_t, w_t = node.inputs["x_tensor_uid"], node.inputs["w_tensor_uid"]
    assert x_t is not None and w_t is not None
    n = len(x_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    padding, pad = _split_padding(pre, post)
    if pad is not None or _flip_dims(node, n + 2) is not None:
        return None
    dtype = ctx.promote(x_t, w_t)
    fmt = ctx.memory_format(n + 2)
    read_x, read_w = ctx.read(x_t, dtype, fmt), ctx.read(w_t, dtype, fmt)
    groups = x_t.dims[1] // w_t.dims[1]
    conv = patch_conv if ctx.options.patch_gemm and is_patch_conv(node) else _CONV[n]
    return conv, read_x, read_w, stride, padding, dilation, groups, dtype


def lower_conv_fprop(ctx: LowerContext, node: Node) -> Step:
    y_t = node.outputs["y_tensor_uid"]
    assert y_t is not None
    write = ctx.write(y_t)
    parts = conv_parts(ctx, node)
    if parts is not None:
        conv, read_x, read_w, stride, padding, dilation, groups, _ = parts

        def conv_fprop(slots: Slots) -> None:
            write(
                slots, conv(read_x(slots), read_w(slots), None, stride, padding, dilation, groups)
            )

        return conv_fprop

    x_t, w_t = node.inputs["x_tensor_uid"], node.inputs["w_tensor_uid"]
    assert x_t is not None and w_t is not None
    n = len(x_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    groups = x_t.dims[1] // w_t.dims[1]
    dtype = ctx.promote(x_t, w_t)
    fmt = ctx.memory_format(n + 2)
    read_x, read_w = ctx.read(x_t, dtype, fmt), ctx.read(w_t, dtype, fmt)
    conv = _CONV[n]
    padding, pad = _split_padding(pre, post)
    flip = _flip_dims(node, n + 2)

    def conv_fprop_general(slots: Slots) -> None:
        x, w = read_x(slots), read_w(slots)
        if pad is not None:
            x = F.pad(x, pad)
        if flip is not None:
            w = w.flip(flip)
        write(slots, conv(x, w, None, stride, padding, dilation, groups))

    return conv_fprop_general


@dataclass
class _Gradient:
    """What both gradient lowerings read from their node: ``dy`` and the other operand (read
    in their promoted type and memory format), the result, the geometry and the flip."""

    dy: TensorAttributes
    other: TensorAttributes
    out: TensorAttributes
    n: int
    pre: list[int]
    post: list[int]
    stride: list[int]
    dilation: list[int]
    dtype: torch.dtype
    read_dy: Reader
    read_other: Reader
    write: Writer
    flip: list[int] | None
    #: convolution_backward's output padding (none), built once per lowering. A plain field:
    #: ``functools.cached_property`` takes an RLock on Python 3.11, which torch.compile's
    #: Dynamo cannot trace, so TORCH_COMPILE_ENGINE failed every gradient graph there
    zeros: list[int]


def _gradient(
    ctx: LowerContext,
    node: Node,
    other: str,
    out: str,
    widen: Callable[[torch.dtype], torch.dtype] | None = None,
) -> _Gradient:
    """What a gradient lowering reads; ``widen`` maps the operands' promoted type to the type
    the ATen call must compute in, where that differs (see :func:`_wgrad_dtype`)."""
    dy_t, other_t = node.inputs["dy_tensor_uid"], node.inputs[other]
    out_t = node.outputs[out]
    assert dy_t is not None and other_t is not None and out_t is not None
    n = len(dy_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    dtype = ctx.promote(dy_t, other_t)
    if widen is not None:
        dtype = widen(dtype)
    fmt = ctx.memory_format(n + 2)
    return _Gradient(
        dy_t,
        other_t,
        out_t,
        n,
        pre,
        post,
        stride,
        dilation,
        dtype,
        ctx.read(dy_t, dtype, fmt),
        ctx.read(other_t, dtype, fmt),
        ctx.write(out_t),
        _flip_dims(node, n + 2),
        [0] * n,
    )


def _convolution_backward(
    grad: _Gradient,
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    padding: list[int],
    groups: int,
    mask: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, ...]:
    out: tuple[torch.Tensor, ...] = torch.ops.aten.convolution_backward(
        dy, x, w, None, grad.stride, padding, grad.dilation, False, grad.zeros, groups, mask
    )
    return out


def lower_conv_dgrad(ctx: LowerContext, node: Node) -> Step:
    grad = _gradient(ctx, node, "w_tensor_uid", "dx_tensor_uid")
    dx_t, n, pre, post = grad.out, grad.n, grad.pre, grad.post
    groups = dx_t.dims[1] // grad.other.dims[1]
    # The data gradient of a convolution over the padded input, cropped back to dx: exact for
    # any padding. With symmetric padding the convolution pads itself and nothing is cropped.
    symmetric = pre == post
    padding = pre if symmetric else [0] * n
    input_dims = (
        list(dx_t.dims)
        if symmetric
        else [*dx_t.dims[:2], *(dx_t.dims[2 + i] + pre[i] + post[i] for i in range(n))]
    )
    crop = (
        None
        if symmetric
        else (
            slice(None),
            slice(None),
            *(slice(pre[i], pre[i] + dx_t.dims[2 + i]) for i in range(n)),
        )
    )
    # convolution_backward reads only the shape of the input for the data gradient
    shape_only = torch.empty(1, dtype=grad.dtype, device=ctx.device).expand(input_dims)
    read_dy, read_w, write, flip = grad.read_dy, grad.read_other, grad.write, grad.flip
    mask = (True, False, False)

    def conv_dgrad(slots: Slots) -> None:
        w = read_w(slots)
        if flip is not None:
            w = w.flip(flip)
        dx = _convolution_backward(grad, read_dy(slots), shape_only, w, padding, groups, mask)[0]
        write(slots, dx if crop is None else dx[crop])

    return conv_dgrad


def _wgrad_dtype(device: torch.device) -> Callable[[torch.dtype], torch.dtype]:
    """The type a weight gradient computes in on ``device``, given its operands' type.

    PyTorch's CPU weight gradient of a float16 convolution (torch 2.13: no oneDNN half kernel
    on most CPUs, so the slow path) adds each sample's gradient into the float16 result: the
    sum over the batch is rounded to 10 mantissa bits at every step, and its error grows with
    the batch (1.25 % RMS of DW at a batch of 4096, conformance case c00132 of seed 2212; 0.18 %
    at 64), where cuDNN, Triton and the reference accumulate in float32. Such a call reads its
    operands in float32 and the result is rounded to float16 once, when it is written.
    bfloat16 goes through oneDNN, which accumulates in float32 (0.14 % at a batch of 4096).
    """

    def widen(dtype: torch.dtype) -> torch.dtype:
        if device.type == "cpu" and dtype is torch.float16:
            return torch.float32
        return dtype

    return widen


def _nchw_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` in strides PyTorch reads as NCHW. ``contiguous()`` is not enough: a tensor with one
    channel (or a 1x1 image) is contiguous in both layouts, and PyTorch reads channels-last
    strides there as channels-last (a single-channel 12x12 input at stride 2 kept its wrong
    weight gradient; session 33)."""
    if suggest_memory_format(t) is torch.channels_last:
        return t.clone(memory_format=torch.contiguous_format)
    return t.contiguous()


def lower_conv_wgrad(ctx: LowerContext, node: Node) -> Step:
    grad = _gradient(ctx, node, "x_tensor_uid", "dw_tensor_uid", _wgrad_dtype(ctx.device))
    dw_t = grad.out
    groups = grad.other.dims[1] // dw_t.dims[1]
    padding, pad = _split_padding(grad.pre, grad.post)
    # convolution_backward reads only the shape of the weight for the weight gradient
    shape_only = torch.empty(1, dtype=grad.dtype, device=ctx.device).expand(dw_t.dims)
    read_dy, read_x, write, flip = grad.read_dy, grad.read_other, grad.write, grad.flip
    mask = (False, True, False)
    # PyTorch's CPU kernel for a bfloat16 weight gradient of a grouped, dilated convolution
    # in channels-last layout returns wrong values (torch 2.13: error above the gradient's own
    # magnitude, where the same call in NCHW is exact to bfloat16): such calls read NCHW copies
    # and its float32 kernel for a channels-last weight gradient of a strided convolution
    # writes past its buffers once the image is large enough (torch 2.13: a 1x1 filter over
    # 1x8192 at stride (1, 2), or 64x512 at stride (2, 2), corrupts the heap and aborts the
    # process; conformance seed 2313, case c00873, a float16 wgrad that computes in float32):
    # such calls read NCHW copies too
    nchw = ctx.device.type == "cpu" and (
        (grad.dtype is torch.bfloat16 and groups > 1 and any(d > 1 for d in grad.dilation))
        or (grad.dtype is torch.float32 and any(s > 1 for s in grad.stride))
    )

    def conv_wgrad(slots: Slots) -> None:
        x, dy = read_x(slots), read_dy(slots)
        if pad is not None:
            x = F.pad(x, pad)
        if nchw:
            x, dy = _nchw_strides(x), _nchw_strides(dy)
        dw = _convolution_backward(grad, dy, x, shape_only, padding, groups, mask)[1]
        # y = corr(x, flip(w)) gives dL/dw = flip(dL/d flip(w))
        write(slots, dw if flip is None else dw.flip(flip))

    return conv_wgrad
