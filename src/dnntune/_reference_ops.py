"""The reference implementation of every operation: one small function per :class:`OpKind`.

Each function takes the node and its inputs (``field name -> tensor``, already converted to the
reference precision and shaped by logical dims; pass-by-value scalars arrive as one-element
tensors) and returns its outputs by field name. :data:`OPS` is the registry that
:func:`dnntune.reference.run` dispatches on; adding an operation means adding one function here.

The functions are written for clarity, not speed: plain PyTorch eager, asymmetric padding made
explicit with ``F.pad``, attention written out as ``softmax(q k^T * scale + mask) v``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch.nn import grad as conv_grad

from dnntune.errors import NotSupportedError
from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.conv import ConvMode
from dnntune.graph.ops.sdpa import causal_flags
from dnntune.graph.types import DataType, PointwiseMode, ReductionMode, ResampleMode

__all__ = ["OPS", "OpFn"]

Tensors = Mapping[str, torch.Tensor]
OpFn = Callable[[Node, Tensors], dict[str, torch.Tensor]]


# ---- convolution ------------------------------------------------------------------------------
def _spatial(node: Node, name: str, n: int, default: int) -> list[int]:
    value = node.params.get(name)
    return [default] * n if value is None else [int(v) for v in value]


def _conv_geometry(node: Node, n: int) -> tuple[list[int], list[int], list[int], list[int]]:
    return (
        _spatial(node, "pre_padding", n, 0),
        _spatial(node, "post_padding", n, 0),
        _spatial(node, "stride", n, 1),
        _spatial(node, "dilation", n, 1),
    )


def _pad_arg(pre: list[int], post: list[int]) -> list[int]:
    """F.pad wants (last dim pre, last dim post, second-to-last pre, ...)."""
    out: list[int] = []
    for p, q in zip(reversed(pre), reversed(post), strict=True):
        out += [p, q]
    return out


def _maybe_flip(w: torch.Tensor, node: Node) -> torch.Tensor:
    """CONVOLUTION mode is cross-correlation with the filter flipped in every spatial dim."""
    if node.params.get("conv_mode") is ConvMode.CONVOLUTION:
        return w.flip(list(range(2, w.dim())))
    return w


_CONV = {2: F.conv2d, 3: F.conv3d}
_CONV_INPUT_GRAD = {2: conv_grad.conv2d_input, 3: conv_grad.conv3d_input}
_CONV_WEIGHT_GRAD = {2: conv_grad.conv2d_weight, 3: conv_grad.conv3d_weight}


def _conv_fprop(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x, w = t["x_tensor_uid"], t["w_tensor_uid"]
    n = x.dim() - 2
    pre, post, stride, dilation = _conv_geometry(node, n)
    groups = x.shape[1] // w.shape[1]
    y = _CONV[n](
        F.pad(x, _pad_arg(pre, post)), _maybe_flip(w, node), None, stride, 0, dilation, groups
    )
    return {"y_tensor_uid": y}


def _conv_dgrad(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    # dx is the gradient of the padded input, cropped back: this keeps asymmetric padding exact.
    dy, w = t["dy_tensor_uid"], t["w_tensor_uid"]
    dx_attr = node.outputs["dx_tensor_uid"]
    assert dx_attr is not None
    n = dy.dim() - 2
    pre, post, stride, dilation = _conv_geometry(node, n)
    dx_dims = dx_attr.dims
    groups = dx_dims[1] // w.shape[1]
    padded = [dx_dims[0], dx_dims[1], *(dx_dims[2 + i] + pre[i] + post[i] for i in range(n))]
    dx_padded = _CONV_INPUT_GRAD[n](padded, _maybe_flip(w, node), dy, stride, 0, dilation, groups)
    crop = tuple(slice(pre[i], pre[i] + dx_dims[2 + i]) for i in range(n))
    return {"dx_tensor_uid": dx_padded[(slice(None), slice(None), *crop)]}


def _conv_wgrad(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    dy, x = t["dy_tensor_uid"], t["x_tensor_uid"]
    dw_attr = node.outputs["dw_tensor_uid"]
    assert dw_attr is not None
    n = x.dim() - 2
    pre, post, stride, dilation = _conv_geometry(node, n)
    groups = x.shape[1] // dw_attr.dims[1]
    dw = _CONV_WEIGHT_GRAD[n](
        F.pad(x, _pad_arg(pre, post)), dw_attr.dims, dy, stride, 0, dilation, groups
    )
    # y = corr(x, flip(w)) gives dL/dw = flip(dL/d flip(w)).
    return {"dw_tensor_uid": _maybe_flip(dw, node)}


# ---- matmul -----------------------------------------------------------------------------------
def _matmul(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    return {"c_tensor_uid": torch.matmul(t["a_tensor_uid"], t["b_tensor_uid"])}


# ---- pointwise --------------------------------------------------------------------------------
def _param(node: Node, name: str, default: float) -> float:
    value = node.params.get(name)
    return default if value is None else float(value)


def _relu(node: Node, x: torch.Tensor) -> torch.Tensor:
    # Below lower_clip the line continues with slope lower_clip_slope (leaky relu at 0 by
    # default); above upper_clip the output is clamped. Defaults give max(x, 0).
    lower = _param(node, "relu_lower_clip", 0.0)
    upper = _param(node, "relu_upper_clip", math.inf)
    slope = _param(node, "relu_lower_clip_slope", 0.0)
    if slope == 0.0:  # the flat line, written out: 0 * (-inf - lower) would be NaN
        below = torch.where(torch.isnan(x), x, torch.full_like(x, lower))
    else:
        below = lower + slope * (x - lower)
    y = torch.where(x > lower, x, below)
    return torch.clamp(y, max=upper) if upper != math.inf else y


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _elu(node: Node, x: torch.Tensor) -> torch.Tensor:
    alpha = _param(node, "elu_alpha", 1.0)
    return torch.where(x > 0, x, alpha * torch.expm1(x))


def _softplus(node: Node, x: torch.Tensor) -> torch.Tensor:
    # log(1 + exp(beta x)) / beta, written with logaddexp so that large x does not overflow.
    beta = _param(node, "softplus_beta", 1.0)
    return torch.logaddexp(beta * x, torch.zeros_like(x)) / beta


def _swish(node: Node, x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(_param(node, "swish_beta", 1.0) * x)


def _select(node: Node, a: torch.Tensor, b: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    # cuDNN's BINARY_SELECT: out = in_2 ? in_0 : in_1 (in_2 is the predicate, non-zero = true).
    # cuDNN's own causal-mask samples select(scores, mask_value, row >= col) this way.
    return torch.where(cond != 0, a, b)


def _compare(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[..., torch.Tensor]:
    """Comparisons yield 1.0 / 0.0 in the computation dtype."""

    def apply(node: Node, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fn(a, b).to(a.dtype)

    return apply


def _plain(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Adapt a function of tensors only (no node parameters)."""

    def apply(node: Node, *args: torch.Tensor) -> torch.Tensor:
        return fn(*args)

    return apply


_POINTWISE: dict[PointwiseMode, Callable[..., torch.Tensor]] = {
    PointwiseMode.ADD: _plain(torch.add),
    PointwiseMode.SUB: _plain(torch.sub),
    PointwiseMode.MUL: _plain(torch.mul),
    PointwiseMode.DIV: _plain(torch.div),
    PointwiseMode.MAX: _plain(torch.maximum),
    PointwiseMode.MIN: _plain(torch.minimum),
    PointwiseMode.POW: _plain(torch.pow),
    PointwiseMode.RELU_FWD: _relu,
    PointwiseMode.GELU_FWD: _plain(lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))),
    PointwiseMode.GELU_APPROX_TANH_FWD: _plain(_gelu_tanh),
    PointwiseMode.TANH_FWD: _plain(torch.tanh),
    PointwiseMode.SIGMOID_FWD: _plain(torch.sigmoid),
    PointwiseMode.SWISH_FWD: _swish,
    PointwiseMode.ELU_FWD: _elu,
    PointwiseMode.SOFTPLUS_FWD: _softplus,
    PointwiseMode.EXP: _plain(torch.exp),
    PointwiseMode.LOG: _plain(torch.log),
    PointwiseMode.NEG: _plain(torch.neg),
    PointwiseMode.ABS: _plain(torch.abs),
    PointwiseMode.SQRT: _plain(torch.sqrt),
    PointwiseMode.RSQRT: _plain(torch.rsqrt),
    PointwiseMode.IDENTITY: _plain(lambda x: x),
    PointwiseMode.RECIPROCAL: _plain(torch.reciprocal),
    PointwiseMode.SIN: _plain(torch.sin),
    PointwiseMode.COS: _plain(torch.cos),
    PointwiseMode.CEIL: _plain(torch.ceil),
    PointwiseMode.FLOOR: _plain(torch.floor),
    PointwiseMode.ERF: _plain(torch.erf),
    PointwiseMode.CMP_EQ: _compare(torch.eq),
    PointwiseMode.CMP_NEQ: _compare(torch.ne),
    PointwiseMode.CMP_GT: _compare(torch.gt),
    PointwiseMode.CMP_GE: _compare(torch.ge),
    PointwiseMode.CMP_LT: _compare(torch.lt),
    PointwiseMode.CMP_LE: _compare(torch.le),
    PointwiseMode.BINARY_SELECT: _select,
}

_PW_FIELDS = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")


def _pointwise(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    mode: PointwiseMode = node.params["operation"]
    fn = _POINTWISE.get(mode)
    if fn is None:  # pragma: no cover - every mode is listed; guards a new enum member
        raise NotSupportedError(
            f"node {node.name!r}: the reference has no pointwise mode {mode.json_name}; "
            "add it to dnntune._reference_ops._POINTWISE"
        )
    args = [t[f] for f in _PW_FIELDS[: mode.arity]]
    return {"out_0_tensor_uid": fn(node, *args)}


# ---- reduction --------------------------------------------------------------------------------
def _prod(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    for d in dims:
        x = x.prod(d, keepdim=True)
    return x


_REDUCE: dict[ReductionMode, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    ReductionMode.ADD: lambda x, d: x.sum(d, keepdim=True),
    ReductionMode.MUL: _prod,
    ReductionMode.MAX: lambda x, d: x.amax(d, keepdim=True),
    ReductionMode.MIN: lambda x, d: x.amin(d, keepdim=True),
    ReductionMode.AVG: lambda x, d: x.mean(d, keepdim=True),
    ReductionMode.NORM1: lambda x, d: x.abs().sum(d, keepdim=True),
    ReductionMode.NORM2: lambda x, d: x.square().sum(d, keepdim=True).sqrt(),
    ReductionMode.AMAX: lambda x, d: x.abs().amax(d, keepdim=True),
}


def _reduction(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    y_attr = node.outputs["y_tensor_uid"]
    assert y_attr is not None
    # A leading size-1 axis is always reduced too, so "reduce nothing" (y dims == x dims) still
    # applies the mode's elementwise part (|x| for AMAX/NORM1/NORM2) and torch never sees an
    # empty dim list (which would mean "reduce everything").
    dims = [0] + [
        i + 1
        for i, (xd, yd) in enumerate(zip(x.shape, y_attr.dims, strict=True))
        if yd == 1 and xd != 1
    ]
    return {"y_tensor_uid": _REDUCE[node.params["mode"]](x.unsqueeze(0), dims).squeeze(0)}


# ---- resample (pooling) -----------------------------------------------------------------------
def _windows(x: torch.Tensor, window: list[int], stride: list[int]) -> torch.Tensor:
    """A view [N, C, *out, *window] of every pooling window (no copy)."""
    n = len(window)
    for i in range(n):
        x = x.unfold(2 + i, window[i], stride[i])
    return x


def _resample(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    n = x.dim() - 2
    window = _spatial(node, "window", n, 1)
    stride = _spatial(node, "stride", n, 1)
    pad = _pad_arg(_spatial(node, "pre_padding", n, 0), _spatial(node, "post_padding", n, 0))
    win_dims = list(range(2 + n, 2 + 2 * n))
    mode: ResampleMode = node.params["mode"]
    if mode is ResampleMode.MAXPOOL:
        y = _windows(F.pad(x, pad, value=-math.inf), window, stride).amax(win_dims)
    elif mode is ResampleMode.AVGPOOL_INCLUDE_PADDING:
        y = _windows(F.pad(x, pad), window, stride).mean(win_dims)
    else:  # AVGPOOL_EXCLUDE_PADDING: divide by the number of real (unpadded) elements
        total = _windows(F.pad(x, pad), window, stride).sum(win_dims)
        ones = F.pad(torch.ones_like(x[:1, :1]), pad)
        count = _windows(ones, window, stride).sum(win_dims)
        y = total / count
    return {"y_tensor_uid": y}


# ---- normalisation ----------------------------------------------------------------------------
def _norm_dims(node: Node, x: torch.Tensor) -> list[int]:
    count = node.params.get("normalized_dim_count") or (x.dim() - 1)
    return list(range(x.dim() - int(count), x.dim()))


def _layernorm(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    dims = _norm_dims(node, x)
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).square().mean(dims, keepdim=True)  # biased, as every framework does
    inv_var = torch.rsqrt(var + t["epsilon_tensor_uid"])
    y = (x - mean) * inv_var * t["scale_tensor_uid"] + t["bias_tensor_uid"]
    return {"y_tensor_uid": y, "mean_tensor_uid": mean, "inv_variance_tensor_uid": inv_var}


def _rmsnorm(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    inv_rms = torch.rsqrt(
        x.square().mean(_norm_dims(node, x), keepdim=True) + t["epsilon_tensor_uid"]
    )
    y = x * inv_rms * t["scale_tensor_uid"]
    if "bias_tensor_uid" in t:
        y = y + t["bias_tensor_uid"]
    return {"y_tensor_uid": y, "inv_rms_tensor_uid": inv_rms}


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel tensor (any dims holding C values) as [1, C, 1, ...] to broadcast over x."""
    return t.reshape(1, x.shape[1], *([1] * (x.dim() - 2)))


def _batchnorm(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    dims = [0, *range(2, x.dim())]
    count = x.numel() // x.shape[1]
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).square().mean(dims, keepdim=True)
    inv_var = torch.rsqrt(var + t["epsilon_tensor_uid"])
    scale, bias = _per_channel(t["scale_tensor_uid"], x), _per_channel(t["bias_tensor_uid"], x)
    out = {
        "y_tensor_uid": (x - mean) * inv_var * scale + bias,
        "mean_tensor_uid": mean,
        "inv_variance_tensor_uid": inv_var,
    }
    if "prev_running_mean_tensor_uid" in t:
        # Running statistics follow cuDNN and PyTorch: an exponential average with factor
        # momentum, and the *unbiased* batch variance (count / (count - 1)) for the variance.
        momentum = t["momentum_tensor_uid"]
        unbiased = var * (count / max(count - 1, 1))
        prev_mean = _per_channel(t["prev_running_mean_tensor_uid"], x)
        prev_var = _per_channel(t["prev_running_variance_tensor_uid"], x)
        out["next_running_mean_tensor_uid"] = (1 - momentum) * prev_mean + momentum * mean
        out["next_running_variance_tensor_uid"] = (1 - momentum) * prev_var + momentum * unbiased
    return out


def _batchnorm_inference(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    x = t["x_tensor_uid"]
    mean, inv_var, scale, bias = (
        _per_channel(t[f], x)
        for f in (
            "mean_tensor_uid",
            "inv_variance_tensor_uid",
            "scale_tensor_uid",
            "bias_tensor_uid",
        )
    )
    return {"y_tensor_uid": (x - mean) * inv_var * scale + bias}


def _batchnorm_backward(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    # The gradient of y = (x - mean) * inv_var * scale + bias where mean and inv_var are the
    # batch statistics of x (the saved ones are taken as given, as cuDNN does).
    dy, x = t["dy_tensor_uid"], t["x_tensor_uid"]
    mean, inv_var, scale = (
        _per_channel(t[f], x)
        for f in ("mean_tensor_uid", "inv_variance_tensor_uid", "scale_tensor_uid")
    )
    dims = [0, *range(2, x.dim())]
    count = x.numel() // x.shape[1]
    x_hat = (x - mean) * inv_var
    dbias = dy.sum(dims, keepdim=True)
    dscale = (dy * x_hat).sum(dims, keepdim=True)
    dx = scale * inv_var / count * (count * dy - dbias - x_hat * dscale)
    return {"dx_tensor_uid": dx, "dscale_tensor_uid": dscale, "dbias_tensor_uid": dbias}


# ---- attention --------------------------------------------------------------------------------
_SDPA_SCORE_BUDGET = 1 << 27  # score elements per query block; bounds the reference's memory


def _sdpa(node: Node, t: Tensors) -> dict[str, torch.Tensor]:
    q, k, v = t["q_tensor_uid"], t["k_tensor_uid"], t["v_tensor_uid"]
    b, h, sq, d = q.shape
    skv = k.shape[2]
    # Grouped-query attention: kv head j serves the h / hk consecutive query heads j*g .. j*g+g-1.
    group = h // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = node.params.get("attn_scale_value")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask = t.get("attn_mask_tensor_uid")
    mask_attr = node.inputs.get("attn_mask_tensor_uid")
    mask_is_bool = mask_attr is not None and mask_attr.data_type is DataType.BOOLEAN
    top_left, bottom_right = causal_flags(node)

    block = max(1, min(sq, _SDPA_SCORE_BUDGET // max(1, b * h * skv)))
    outs, stats = [], []
    for start in range(0, sq, block):
        stop = min(sq, start + block)
        rows = torch.arange(start, stop, device=q.device)[:, None]
        cols = torch.arange(skv, device=q.device)[None, :]
        scores = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2)) * scale
        keep = torch.ones_like(scores, dtype=torch.bool)
        if top_left:
            keep = keep & (cols <= rows)
        if bottom_right:
            keep = keep & (cols <= rows + (skv - sq))
        if mask is not None:
            m = mask.expand(b, h, sq, skv)[:, :, start:stop]
            if mask_is_bool:
                keep = keep & (m != 0)
            else:
                scores = scores + m
        scores = scores.masked_fill(~keep, -math.inf)
        o, lse = _softmax_v(scores, v)
        outs.append(o)
        stats.append(lse)
    return {"o_tensor_uid": torch.cat(outs, dim=2), "stats_tensor_uid": torch.cat(stats, dim=2)}


def _softmax_v(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(scores) @ v, log-sum-exp of each row), written out.

    A row whose every score is masked (-inf) gives output 0 and log-sum-exp -inf, instead of
    the NaN (0/0) of a plain softmax: what PyTorch's scaled_dot_product_attention gives since
    2.5 (its math and flash kernels, checked on 2.13's CPU), flash-attention kernels, and cuDNN
    frontend's test reference. Every engine that runs such a graph is held to it
    (tests/providers/test_sdpa_rows_without_keys.py).
    """
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(-1, keepdim=True)
    p = torch.where(total > 0, e / total, torch.zeros_like(e))
    return torch.matmul(p, v), row_max + torch.log(total)


OPS: dict[OpKind, OpFn] = {
    OpKind.CONV_FPROP: _conv_fprop,
    OpKind.CONV_DGRAD: _conv_dgrad,
    OpKind.CONV_WGRAD: _conv_wgrad,
    OpKind.MATMUL: _matmul,
    OpKind.POINTWISE: _pointwise,
    OpKind.REDUCTION: _reduction,
    OpKind.RESAMPLE: _resample,
    OpKind.LAYERNORM: _layernorm,
    OpKind.RMSNORM: _rmsnorm,
    OpKind.BATCHNORM: _batchnorm,
    OpKind.BATCHNORM_INFERENCE: _batchnorm_inference,
    OpKind.BATCHNORM_BACKWARD: _batchnorm_backward,
    OpKind.SDPA: _sdpa,
}
"""The reference function of every operation kind (a contract: one entry per OpKind)."""
