"""Graphs for PyTorch calls: one builder per functional op, from the call's real tensors.

Dims, strides and dtypes come from the tensors (``tensor_like``), so a channels-last input
makes a channels-last graph. Per-channel vectors are viewed as [1, C, 1, 1] (no copy).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dnntune.frontend import Graph
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode, ResampleMode
from dnntune.torch._pytorch_ops import QUICK_GELU_BETA
from dnntune.torch.runtime import GraphBuild

__all__ = [
    "memory_format_of",
    "ACTIVATIONS",
    "SWISH_BETAS",
    "batch_norm_graph",
    "conv2d_graph",
    "conv_dgrad_graph",
    "conv_wgrad_graph",
    "layout_like",
    "linear_graph",
    "matmul_graph",
    "norm_graph",
    "pool_graph",
    "sdpa_graph",
]

ACTIVATIONS: dict[str, PointwiseMode] = {
    "relu": PointwiseMode.RELU_FWD,
    "gelu": PointwiseMode.GELU_FWD,
    "gelu_tanh": PointwiseMode.GELU_APPROX_TANH_FWD,
    "silu": PointwiseMode.SWISH_FWD,
    "quick_gelu": PointwiseMode.SWISH_FWD,
    "sigmoid": PointwiseMode.SIGMOID_FWD,
    "tanh": PointwiseMode.TANH_FWD,
}
#: the slope of the activations that are a swish of another slope than 1 (SWISH_FWD's beta)
SWISH_BETAS: dict[str, float] = {"quick_gelu": QUICK_GELU_BETA}


def _graph(name: str, dtype: torch.dtype) -> Graph:
    io = DataType.from_torch(dtype)
    return Graph(
        name=name,
        io_data_type=io,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )


def channel_view(vec: torch.Tensor, rank: int) -> torch.Tensor:
    """A [C] vector as [1, C, 1, ...] of the given rank (a view)."""
    return vec.view(1, -1, *([1] * (rank - 2)))


def _epilogue(
    g: Graph,
    y: TensorAttributes,
    inputs: list[TensorAttributes],
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str | None,
    bias_name: str = "B",
) -> TensorAttributes:
    if bias is not None:
        b = g.tensor_like(bias, bias_name)
        inputs.append(b)
        y = g.pointwise(y, b, mode=PointwiseMode.ADD)
    if residual is not None:
        r = g.tensor_like(residual, "R")
        inputs.append(r)
        y = g.pointwise(y, r, mode=PointwiseMode.ADD)
    if activation is not None:
        beta = SWISH_BETAS.get(activation)
        if beta is None:
            y = g.pointwise(y, mode=ACTIVATIONS[activation])
        else:
            y = g.pointwise(y, mode=ACTIVATIONS[activation], swish_beta=beta)
    return y


def conv2d_graph(
    x: torch.Tensor,
    w: torch.Tensor,
    bias_view: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    activation: str | None,
    residual: torch.Tensor | None,
    post: Sequence[int] | None = None,
) -> GraphBuild:
    """conv (+ bias, residual, activation); ``padding`` before each spatial dim, and after it
    too unless ``post`` is given (``padding="same"`` with an even kernel pads one more after)."""
    g = _graph("torch_conv2d", x.dtype)
    xt, wt = g.tensor_like(x, "X"), g.tensor_like(w, "W")
    inputs = [xt, wt]
    y = g.conv_fprop(
        xt,
        wt,
        stride=list(stride),
        dilation=list(dilation),
        pre_padding=list(padding),
        post_padding=list(padding if post is None else post),
    )
    y = _epilogue(g, y, inputs, bias_view, residual, activation)
    y.set_output(True)
    return GraphBuild(g, inputs, [y])


def conv_dgrad_graph(
    dy: torch.Tensor,
    w: torch.Tensor,
    x_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    post: Sequence[int] | None = None,
) -> GraphBuild:
    g = _graph("torch_conv2d_dgrad", dy.dtype)
    dyt, wt = g.tensor_like(dy, "DY"), g.tensor_like(w, "W")
    dx = g.conv_dgrad(
        dyt,
        wt,
        pre_padding=list(padding),
        post_padding=list(padding if post is None else post),
        stride=list(stride),
        dilation=list(dilation),
        dx_dims=list(x_shape),
    )
    dx.set_output(True)
    return GraphBuild(g, [dyt, wt], [dx])


def conv_wgrad_graph(
    dy: torch.Tensor,
    x: torch.Tensor,
    w_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    post: Sequence[int] | None = None,
) -> GraphBuild:
    g = _graph("torch_conv2d_wgrad", dy.dtype)
    dyt, xt = g.tensor_like(dy, "DY"), g.tensor_like(x, "X")
    dw = g.conv_wgrad(
        dyt,
        xt,
        pre_padding=list(padding),
        post_padding=list(padding if post is None else post),
        stride=list(stride),
        dilation=list(dilation),
        dw_dims=list(w_shape),
    )
    dw.set_output(True)
    return GraphBuild(g, [dyt, xt], [dw])


def matmul_graph(a: torch.Tensor, b: torch.Tensor, name: str = "torch_matmul") -> GraphBuild:
    g = _graph(name, a.dtype)
    at, bt = g.tensor_like(a, "A"), g.tensor_like(b, "B")
    c = g.matmul(at, bt)
    c.set_output(True)
    return GraphBuild(g, [at, bt], [c])


def linear_graph(
    x2d: torch.Tensor,
    w_t: torch.Tensor,
    bias_row: torch.Tensor | None,
    activation: str | None,
    residual2d: torch.Tensor | None = None,
    multiplier2d: torch.Tensor | None = None,
) -> GraphBuild:
    """x W^T (+ bias, residual, activation), times ``multiplier2d`` last where given."""
    g = _graph("torch_linear", x2d.dtype)
    at, bt = g.tensor_like(x2d, "A"), g.tensor_like(w_t, "B")
    inputs = [at, bt]
    c = g.matmul(at, bt)
    c = _epilogue(g, c, inputs, bias_row, residual2d, activation, bias_name="BIAS")
    if multiplier2d is not None:
        m = g.tensor_like(multiplier2d, "M")
        inputs.append(m)
        c = g.pointwise(c, m, mode=PointwiseMode.MUL)
    c.set_output(True)
    return GraphBuild(g, inputs, [c])


def sdpa_graph(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
) -> GraphBuild:
    g = _graph("torch_sdpa", q.dtype)
    qt, kt, vt = g.tensor_like(q, "Q"), g.tensor_like(k, "K"), g.tensor_like(v, "V")
    inputs = [qt, kt, vt]
    mt = None
    if mask is not None:
        mt = g.tensor_like(mask, "MASK")
        inputs.append(mt)
    (o,) = g.sdpa(qt, kt, vt, attn_mask=mt, causal_mask=causal, attn_scale=scale)
    dims = [*q.shape[:3], v.shape[3]]
    o.set_dims(dims).set_strides(layout_like(q, dims)).set_output(True)
    return GraphBuild(g, inputs, [o])


def memory_format_of(t: torch.Tensor) -> torch.memory_format:
    """``torch.channels_last`` for a 4-d tensor laid out so (and not also plain contiguous),
    else ``torch.contiguous_format``: the layout a tensor made from ``t`` should keep."""
    if (
        t.dim() == 4
        and t.is_contiguous(memory_format=torch.channels_last)
        and not t.is_contiguous()
    ):
        return torch.channels_last
    return torch.contiguous_format


def layout_like(q: torch.Tensor, dims: Sequence[int]) -> list[int]:
    """Strides for an attention output of ``dims`` laid out in memory as ``q`` is, as
    PyTorch's fused attention kernels allocate theirs.

    A transformer's query is usually a view of its QKV projection, [B, S, H, D] in memory
    viewed as [B, H, S, D]; the block then transposes the output back and reshapes it to
    [B, S, H*D], a free view only when the output is laid out that way too. A row-major
    [B, H, S, D] output made that reshape a copy in each block (ViT-B/16 on the H200: 11 more
    copies than PyTorch's forward, 160 µs of a 3.4 ms replay; with this layout dnntune's replay
    went from 0.96x to 1.00x of PyTorch's). The head dimension stays innermost; a query whose
    head dimension is not gives a row-major output.
    """
    strides = q.stride()
    order = sorted(range(len(dims)), key=lambda i: -strides[i])  # stable: ties keep dim order
    if order[-1] != len(dims) - 1:
        order = list(range(len(dims)))
    out = [0] * len(dims)
    step = 1
    for i in reversed(order):
        out[i] = step
        step *= dims[i]
    return out


def norm_graph(
    kind: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    count: int,
    eps: float,
) -> GraphBuild:
    g = _graph(f"torch_{kind}", x.dtype)
    xt, wt = g.tensor_like(x, "X"), g.tensor_like(weight, "SCALE")
    inputs = [xt, wt]
    bt = None
    if bias is not None:
        bt = g.tensor_like(bias, "BIAS")
        inputs.append(bt)
    if kind == "layer_norm":
        assert bt is not None
        (y,) = g.layernorm(
            xt, wt, bt, eps, forward_phase=NormFwdPhase.INFERENCE, normalized_dim_count=count
        )
    else:
        (y,) = g.rmsnorm(
            xt, wt, eps, bt, forward_phase=NormFwdPhase.INFERENCE, normalized_dim_count=count
        )
    y.set_output(True)
    return GraphBuild(g, inputs, [y])


def batch_norm_graph(
    x: torch.Tensor,
    mean: torch.Tensor,
    inv_var: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
) -> GraphBuild:
    g = _graph("torch_batch_norm", x.dtype)
    ts = [
        g.tensor_like(t, n)
        for t, n in (
            (x, "X"),
            (mean, "MEAN"),
            (inv_var, "INV_VAR"),
            (scale, "SCALE"),
            (bias, "BIAS"),
        )
    ]
    y = g.batchnorm_inference(*ts)
    y.set_output(True)
    return GraphBuild(g, ts, [y])


def pool_graph(
    x: torch.Tensor,
    mode: ResampleMode,
    window: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> GraphBuild:
    g = _graph("torch_pool2d", x.dtype)
    xt = g.tensor_like(x, "X")
    y = g.resample(xt, mode=mode, window=list(window), stride=list(stride), padding=list(padding))
    y.set_output(True)
    return GraphBuild(g, [xt], [y])
