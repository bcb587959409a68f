"""Convolution forward, data gradient and weight gradient as ATen calls (2-D and 3-D, grouped).

Symmetric padding goes to the convolution itself; the asymmetric part is added with ``F.pad``
(forward, weight gradient) or cropped from the gradient of the padded input (data gradient).
``CONVOLUTION`` mode is cross-correlation with the filter flipped in every spatial dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dnntune.graph.node import Node
from dnntune.graph.ops.conv import ConvMode, conv_geometry
from dnntune.providers._torch.program import LowerContext, Slots, Step

__all__ = ["lower_conv_dgrad", "lower_conv_fprop", "lower_conv_wgrad"]

_CONV = {2: torch.conv2d, 3: torch.conv3d}


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


def lower_conv_fprop(ctx: LowerContext, node: Node) -> Step:
    x_t, w_t, y_t = (
        node.inputs["x_tensor_uid"],
        node.inputs["w_tensor_uid"],
        node.outputs["y_tensor_uid"],
    )
    assert x_t is not None and w_t is not None and y_t is not None
    n = len(x_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    groups = x_t.dims[1] // w_t.dims[1]
    dtype = ctx.promote(x_t, w_t)
    fmt = ctx.memory_format(n + 2)
    read_x, read_w = ctx.read(x_t, dtype, fmt), ctx.read(w_t, dtype, fmt)
    write = ctx.write(y_t)
    conv = _CONV[n]
    padding, pad = _split_padding(pre, post)
    flip = _flip_dims(node, n + 2)

    if pad is None and flip is None:

        def conv_fprop(slots: Slots) -> None:
            write(
                slots, conv(read_x(slots), read_w(slots), None, stride, padding, dilation, groups)
            )

        return conv_fprop

    def conv_fprop_general(slots: Slots) -> None:
        x, w = read_x(slots), read_w(slots)
        if pad is not None:
            x = F.pad(x, pad)
        if flip is not None:
            w = w.flip(flip)
        write(slots, conv(x, w, None, stride, padding, dilation, groups))

    return conv_fprop_general


def lower_conv_dgrad(ctx: LowerContext, node: Node) -> Step:
    dy_t, w_t = node.inputs["dy_tensor_uid"], node.inputs["w_tensor_uid"]
    dx_t = node.outputs["dx_tensor_uid"]
    assert dy_t is not None and w_t is not None and dx_t is not None
    n = len(dy_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    groups = dx_t.dims[1] // w_t.dims[1]
    dtype = ctx.promote(dy_t, w_t)
    fmt = ctx.memory_format(n + 2)
    read_dy, read_w = ctx.read(dy_t, dtype, fmt), ctx.read(w_t, dtype, fmt)
    write = ctx.write(dx_t)
    flip = _flip_dims(node, n + 2)
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
    shape_only = torch.empty(1, dtype=dtype, device=ctx.device).expand(input_dims)
    zeros = [0] * n
    mask = (True, False, False)

    def conv_dgrad(slots: Slots) -> None:
        w = read_w(slots)
        if flip is not None:
            w = w.flip(flip)
        dx = torch.ops.aten.convolution_backward(
            read_dy(slots),
            shape_only,
            w,
            None,
            stride,
            padding,
            dilation,
            False,
            zeros,
            groups,
            mask,
        )[0]
        write(slots, dx if crop is None else dx[crop])

    return conv_dgrad


def lower_conv_wgrad(ctx: LowerContext, node: Node) -> Step:
    dy_t, x_t = node.inputs["dy_tensor_uid"], node.inputs["x_tensor_uid"]
    dw_t = node.outputs["dw_tensor_uid"]
    assert dy_t is not None and x_t is not None and dw_t is not None
    n = len(x_t.dims) - 2
    pre, post, stride, dilation = conv_geometry(node, n)
    groups = x_t.dims[1] // dw_t.dims[1]
    dtype = ctx.promote(dy_t, x_t)
    fmt = ctx.memory_format(n + 2)
    read_dy, read_x = ctx.read(dy_t, dtype, fmt), ctx.read(x_t, dtype, fmt)
    write = ctx.write(dw_t)
    flip = _flip_dims(node, n + 2)
    padding, pad = _split_padding(pre, post)
    # convolution_backward reads only the shape of the weight for the weight gradient
    shape_only = torch.empty(1, dtype=dtype, device=ctx.device).expand(dw_t.dims)
    zeros = [0] * n
    mask = (False, True, False)

    def conv_wgrad(slots: Slots) -> None:
        x = read_x(slots)
        if pad is not None:
            x = F.pad(x, pad)
        dw = torch.ops.aten.convolution_backward(
            read_dy(slots),
            x,
            shape_only,
            None,
            stride,
            padding,
            dilation,
            False,
            zeros,
            groups,
            mask,
        )[1]
        # y = corr(x, flip(w)) gives dL/dw = flip(dL/d flip(w))
        write(slots, dw if flip is None else dw.flip(flip))

    return conv_wgrad
