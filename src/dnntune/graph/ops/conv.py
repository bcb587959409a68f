"""Convolution forward, data gradient and weight gradient (2-D and 3-D, grouped)."""

from __future__ import annotations

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind, node_error, require
from dnntune.graph.ops.shapes import check_rank, fill_output, spatial_list
from dnntune.graph.types import _JsonEnum

__all__ = ["CONV_FPROP", "CONV_DGRAD", "CONV_WGRAD", "ConvMode", "conv_geometry"]


class ConvMode(_JsonEnum):
    """Convolution mode; hipDNN writes these in upper case."""

    CROSS_CORRELATION = 1
    CONVOLUTION = 2

    @property
    def json_name(self) -> str:
        return self.name


# hipDNN's reader requires all five keys under "parameters".
_PARAMS = (
    Param(
        "conv_mode",
        ParamKind.ENUM,
        ConvMode.CROSS_CORRELATION,
        ConvMode,
        json_required=True,
        enum_style="upper",
    ),
    Param("pre_padding", ParamKind.INT_LIST, json_required=True),
    Param("post_padding", ParamKind.INT_LIST, json_required=True),
    Param("stride", ParamKind.INT_LIST, json_required=True),
    Param("dilation", ParamKind.INT_LIST, json_required=True),
)


def conv_geometry(node: Node, n_spatial: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """(pre_padding, post_padding, stride, dilation), defaulted and checked."""
    pre = spatial_list(node, "pre_padding", n_spatial, 0, 0)
    post = spatial_list(node, "post_padding", n_spatial, 0, 0)
    stride = spatial_list(node, "stride", n_spatial, 1, 1)
    dilation = spatial_list(node, "dilation", n_spatial, 1, 1)
    return pre, post, stride, dilation


def _out_size(node: Node, size: int, k: int, pre: int, post: int, s: int, d: int) -> int:
    span = size + pre + post - d * (k - 1) - 1
    if span < 0:
        raise node_error(
            node,
            "w_tensor_uid",
            f"filter extent {d * (k - 1) + 1} is larger than the padded input {size + pre + post}",
        )
    return span // s + 1


def _check_groups(node: Node, c: int, cg: int, k: int) -> int:
    if cg <= 0 or c % cg != 0:
        raise node_error(
            node, "w_tensor_uid", f"input channels {c} are not a multiple of filter channels {cg}"
        )
    groups = c // cg
    if k % groups != 0:
        raise node_error(
            node, "w_tensor_uid", f"output channels {k} are not a multiple of groups {groups}"
        )
    return groups


def _check_fprop(node: Node) -> None:
    x, w = require(node, "x_tensor_uid"), require(node, "w_tensor_uid")
    check_rank(node, "x_tensor_uid", x, (4, 5))
    check_rank(node, "w_tensor_uid", w, (len(x.dims),))
    n_sp = len(x.dims) - 2
    pre, post, stride, dil = conv_geometry(node, n_sp)
    _check_groups(node, x.dims[1], w.dims[1], w.dims[0])
    out = [
        _out_size(node, x.dims[2 + i], w.dims[2 + i], pre[i], post[i], stride[i], dil[i])
        for i in range(n_sp)
    ]
    fill_output(node, "y_tensor_uid", [x.dims[0], w.dims[0], *out], like=x)


def _check_dgrad(node: Node) -> None:
    dy, w = require(node, "dy_tensor_uid"), require(node, "w_tensor_uid")
    check_rank(node, "dy_tensor_uid", dy, (4, 5))
    check_rank(node, "w_tensor_uid", w, (len(dy.dims),))
    n_sp = len(dy.dims) - 2
    pre, post, stride, dil = conv_geometry(node, n_sp)
    dx = require(node, "dx_tensor_uid")
    if not dx.dims:
        # Without explicit dims assume one group and the smallest input that fits.
        spatial = [
            (dy.dims[2 + i] - 1) * stride[i] - pre[i] - post[i] + dil[i] * (w.dims[2 + i] - 1) + 1
            for i in range(n_sp)
        ]
        if any(d < 1 for d in spatial):
            raise node_error(
                node, "dy_tensor_uid", f"no input size gives dy {dy.dims}; pass dx dims"
            )
        fill_output(node, "dx_tensor_uid", [dy.dims[0], w.dims[1], *spatial], like=dy)
    check_rank(node, "dx_tensor_uid", dx, (len(dy.dims),))
    if dy.dims[1] != w.dims[0]:
        raise node_error(
            node, "dy_tensor_uid", f"channels {dy.dims[1]} != filter count {w.dims[0]}"
        )
    if dx.dims[0] != dy.dims[0]:
        raise node_error(node, "dx_tensor_uid", f"batch {dx.dims[0]} != dy batch {dy.dims[0]}")
    _check_groups(node, dx.dims[1], w.dims[1], w.dims[0])
    for i in range(n_sp):
        expect = _out_size(node, dx.dims[2 + i], w.dims[2 + i], pre[i], post[i], stride[i], dil[i])
        if expect != dy.dims[2 + i]:
            raise node_error(
                node,
                "dx_tensor_uid",
                f"spatial dim {i} of {dx.dims} gives output {expect}, but dy has {dy.dims[2 + i]}",
            )
    fill_output(node, "dx_tensor_uid", dx.dims, like=dy)


def _check_wgrad(node: Node) -> None:
    dy, x = require(node, "dy_tensor_uid"), require(node, "x_tensor_uid")
    check_rank(node, "x_tensor_uid", x, (4, 5))
    check_rank(node, "dy_tensor_uid", dy, (len(x.dims),))
    n_sp = len(x.dims) - 2
    pre, post, stride, dil = conv_geometry(node, n_sp)
    dw = require(node, "dw_tensor_uid")
    if not dw.dims:
        ks = [
            (x.dims[2 + i] + pre[i] + post[i] - 1 - (dy.dims[2 + i] - 1) * stride[i]) // dil[i] + 1
            for i in range(n_sp)
        ]
        if any(k < 1 for k in ks):
            raise node_error(
                node, "dy_tensor_uid", f"dims {dy.dims} are too large for x {x.dims} and stride"
            )
        fill_output(node, "dw_tensor_uid", [dy.dims[1], x.dims[1], *ks], like=x)
    check_rank(node, "dw_tensor_uid", dw, (len(x.dims),))
    if dw.dims[0] != dy.dims[1]:
        raise node_error(
            node, "dw_tensor_uid", f"filter count {dw.dims[0]} != dy channels {dy.dims[1]}"
        )
    if x.dims[0] != dy.dims[0]:
        raise node_error(node, "dy_tensor_uid", f"batch {dy.dims[0]} != x batch {x.dims[0]}")
    _check_groups(node, x.dims[1], dw.dims[1], dw.dims[0])
    for i in range(n_sp):
        expect = _out_size(node, x.dims[2 + i], dw.dims[2 + i], pre[i], post[i], stride[i], dil[i])
        if expect != dy.dims[2 + i]:
            raise node_error(
                node,
                "dy_tensor_uid",
                f"spatial dim {i} is {dy.dims[2 + i]}, but x {x.dims} and filter {dw.dims} "
                f"give {expect}",
            )
    fill_output(node, "dw_tensor_uid", dw.dims, like=x)


CONV_FPROP = OpSpec(
    kind=OpKind.CONV_FPROP,
    json_type="ConvolutionFwdAttributes",
    builder_name="conv_fprop",
    inputs=("x_tensor_uid", "w_tensor_uid"),
    outputs=("y_tensor_uid",),
    params=_PARAMS,
    priority=70,
    check=_check_fprop,
    float_fields=("x_tensor_uid", "w_tensor_uid", "y_tensor_uid"),
)
CONV_DGRAD = OpSpec(
    kind=OpKind.CONV_DGRAD,
    json_type="ConvolutionBwdAttributes",
    builder_name="conv_dgrad",
    inputs=("dy_tensor_uid", "w_tensor_uid"),
    outputs=("dx_tensor_uid",),
    params=_PARAMS,
    priority=70,
    check=_check_dgrad,
    float_fields=("dy_tensor_uid", "w_tensor_uid", "dx_tensor_uid"),
)
CONV_WGRAD = OpSpec(
    kind=OpKind.CONV_WGRAD,
    json_type="ConvolutionWrwAttributes",
    builder_name="conv_wgrad",
    inputs=("dy_tensor_uid", "x_tensor_uid"),
    outputs=("dw_tensor_uid",),
    params=_PARAMS,
    priority=70,
    check=_check_wgrad,
    float_fields=("dy_tensor_uid", "x_tensor_uid", "dw_tensor_uid"),
)
