"""Functional ops backed by dnntune: the same signatures and results as ``torch.nn.functional``.

Each call builds a graph for its shapes/strides/dtypes on first sight, picks the plan by the
configured policy, caches it, and later calls only run the plan. Calls dnntune cannot run
(other devices or dtypes, options it does not model) fall back to PyTorch's op with a one-time
:class:`DnnTuneFallbackWarning`; a user's forward pass never crashes because of dnntune.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch._prims_common import suggest_memory_format

from dnntune.torch._attention import scaled_dot_product_attention
from dnntune.torch._calls import _grad_enabled, _pytorch_forced, prepared_call
from dnntune.torch._calls import autocast_on as _autocast
from dnntune.torch._calls import check_activation as _check_activation
from dnntune.torch._calls import declined as _declined
from dnntune.torch._calls import grad_wanted as _grad_wanted
from dnntune.torch._calls import guarded as _guarded
from dnntune.torch._calls import mixed as _mixed
from dnntune.torch._calls import pair as _pair
from dnntune.torch._padding import string_padding
from dnntune.torch._pytorch_ops import TORCH_ACTIVATIONS
from dnntune.torch._pytorch_ops import conv2d_torch as _conv2d_torch
from dnntune.torch._pytorch_ops import epilogue as _epilogue
from dnntune.torch._pytorch_ops import linear_torch as _linear_torch
from dnntune.torch._support import lazy_view, recorded, tracing, unsupported_kind
from dnntune.torch.autograd import (
    Conv2dFunction,
    LinearFunction,
    _sig,
    conv2d_kernel,
)
from dnntune.torch.graphs import linear_graph
from dnntune.torch.norms import batch_norm, layer_norm, rms_norm
from dnntune.torch.pooling import avg_pool2d, max_pool2d
from dnntune.torch.runtime import NATIVE, Kernel, kernel_for, native_memo

_log = logging.getLogger(__name__)
#: per op, the id of the call's weight -> the signature it ran last
_conv2d_sites = native_memo.sites()
_linear_sites = native_memo.sites()

__all__ = [
    "TORCH_ACTIVATIONS",
    "avg_pool2d",
    "batch_norm",
    "conv2d",
    "layer_norm",
    "linear",
    "max_pool2d",
    "rms_norm",
    "scaled_dot_product_attention",
]


# ---- convolution ---------------------------------------------------------------------------
def conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.conv2d`` plus optional fused ``residual`` add and ``activation`` (relu, gelu, ...).

    ``padding`` is as ``F.conv2d``'s: ints, or ``"valid"`` (none) or ``"same"`` (stride 1;
    an even kernel pads one more after, right and bottom, as PyTorch does). Groups are
    taken from the weight's shape (``groups`` is checked against it). Training (autograd) is
    supported without a residual and with no activation or relu; other fusions run the
    epilogue in PyTorch when gradients are needed.
    """
    # while PyTorch records the program (compile, export, jit.trace): PyTorch's op; under
    # torch.fx's symbolic trace: this call, as one node of the graph
    if tracing():
        args = (input, weight, bias, stride, padding, dilation, groups)
        node = recorded(conv2d, *args, activation=activation, residual=residual)
        return node if node is not None else _conv2d_torch(*args, activation, residual)
    if _pytorch_forced.get() or _autocast():  # PyTorch's op (autocast: it casts as PyTorch's)
        return _conv2d_torch(
            input, weight, bias, stride, padding, dilation, groups, activation, residual
        )
    options = (stride, padding, dilation, groups, activation)
    recent = _conv2d_sites.get(id(weight))
    if recent is not None and recent.fits(options, input, weight, bias, residual):
        if recent.call is NATIVE:
            return _conv2d_torch(
                input, weight, bias, stride, padding, dilation, groups, activation, residual
            )
        return recent.call(input, weight, bias, residual)
    memo: tuple[Any, ...] | None
    try:  # the raw arguments as one flat key: a signature seen before skips every check below
        if lazy_view(input, weight, bias, residual):
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and (
            input.requires_grad
            or weight.requires_grad
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad)
        )
        memo = (
            "conv2d",
            type(input),  # a subclass, a nested or fake tensor: another signature
            input.shape,
            input.stride(),
            input.dtype,
            input.device,
            type(weight),
            weight.shape,
            weight.stride(),
            weight.dtype,
            weight.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            stride,
            padding,
            dilation,
            groups,
            activation,
            None if residual is None else _sig(residual),
            grad,
        )
        known = native_memo.lookup(memo)
    except (AttributeError, TypeError, RuntimeError):  # no tensor, an unhashable argument (a
        # list), a tensor without shape or strides (nested, sparse CSR)
        memo, known = None, None
        grad = _grad_wanted(input, weight, bias, residual)
    if known is not None:
        given = (input, weight, bias, residual)
        native_memo.keep(_conv2d_sites, id(weight), memo, given, options, known)
        if known is NATIVE:  # this signature's winner is PyTorch's own op (seen before)
            return _conv2d_torch(
                input, weight, bias, stride, padding, dilation, groups, activation, residual
            )
        return known(input, weight, bias, residual)
    _check_activation(activation)

    def fallback() -> torch.Tensor:
        return _conv2d_torch(
            input, weight, bias, stride, padding, dilation, groups, activation, residual
        )

    tensors = [input, weight, bias, residual]
    kind = unsupported_kind(tensors)  # before any shape is read
    if kind is not None:
        return _declined("conv2d", memo, tensors, fallback, kind)
    if input.dim() == 3 and (residual is None or residual.dim() == 3):
        # an unbatched image [C, H, W], which nn.Conv2d takes: a batch of one, as PyTorch
        # runs it (a view each way). It fell back with a warning ("only 4-D") before a
        # new-user audit, for a single image through an optimized model
        batched = conv2d(
            input.unsqueeze(0),
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
            activation=activation,
            residual=None if residual is None else residual.unsqueeze(0),
        )
        return batched.squeeze(0)
    s, d = _pair(stride, "stride"), _pair(dilation, "dilation")
    if input.dim() != 4:
        extra = f"only 4-D (batched NCHW) input is supported, got {input.dim()}-D"
        return _guarded("conv2d", tensors, fallback, fallback, extra)
    if weight.shape[1] * groups != input.shape[1]:
        # PyTorch's own error, as eager's ("expected input[2, 3, 5, 5] to have 4 channels, but
        # got 3 channels"): an optimized model fed an image of the wrong channel count raised
        # a ValueError that blamed ``groups=1`` (new-user audit)
        return fallback()
    if _mixed(input, weight, bias) or (bias is not None and bias.shape != weight.shape[:1]):
        return fallback()  # PyTorch's own error (dnntune's graph would broadcast or cast)
    post: tuple[int, ...] | None = None  # the padding after, where it is not ``p``
    if isinstance(padding, str):  # "valid", "same": explicit padding per side
        sides = string_padding(padding, weight.shape[2:], s, d)
        if sides is None:
            return fallback()  # PyTorch's own error (another string, "same" with a stride)
        p = sides[0]
        post = None if sides[1] == p else sides[1]  # "same", an even kernel: one more after
    else:
        p = _pair(padding, "padding")

    def run() -> torch.Tensor:
        # PyTorch's rule: a channels-last weight makes a channels-last convolution, its input
        # converted (``model.to(memory_format=torch.channels_last)`` fed NCHW images): the
        # output is channels-last, so the next layers are too. Kept NCHW, every later
        # convolution of such a model ran NCHW against channels-last weights, unlike eager
        # and the converse: a channels-last input makes a channels-last weight, as PyTorch's
        # cuDNN call makes one (session 35: cuDNN's heuristic plan for such a half-precision
        # convolution with a residual epilogue, its filter left NCHW, returned wrong numbers)
        to_cl = _channels_last_wanted(input, weight)
        w_cl = not to_cl and _channels_last_wanted(weight, input)
        views = (
            _conv_views_channels_last
            if to_cl
            else _conv_views_weight_channels_last
            if w_cl
            else _conv_views
        )
        x = input.contiguous(memory_format=torch.channels_last) if to_cl else input
        w = weight.contiguous(memory_format=torch.channels_last) if w_cl else weight
        if grad:
            fused_relu = residual is None and activation == "relu"
            bias_view = bias.view(1, -1, 1, 1) if bias is not None else None
            act = "relu" if fused_relu else None
            kernel = conv2d_kernel(x, w, bias_view, s, p, d, act, None, post)[0]
            if memo is not None:
                native_memo.note(memo, kernel)
            if kernel.native:
                # the forward's winner is PyTorch's own op: train through it and PyTorch's
                # autograd (the same kernels, without this layer's per-call overhead)
                return fallback()
            y = Conv2dFunction.apply(x, w, bias, s, p, d, fused_relu, kernel, post)
            if fused_relu or (residual is None and activation is None):
                return y
            return _epilogue(y, residual, activation)
        bias_view = bias.view(1, -1, 1, 1) if bias is not None else None
        kernel, inputs = conv2d_kernel(x, w, bias_view, s, p, d, activation, residual, post)
        if memo is not None:
            native_memo.note(memo, kernel)
        if kernel.native:
            return fallback()  # PyTorch's own op won: call it as eager code does
        y = kernel(*inputs)[0]
        if memo is not None:
            raw = (input, weight, bias, residual)
            derived = (x, w, bias_view, residual)
            native_memo.remember(memo, prepared_call(kernel, raw, derived, views))
        return y

    return _guarded("conv2d", tensors, run, fallback, memo=memo)


def _conv_views(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    """The kernel's inputs from conv2d's raw tensors (the bias as [1, C, 1, 1])."""
    return (x, w, None if b is None else b.view(1, -1, 1, 1), r)


def _conv_views_channels_last(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    """As :func:`_conv_views`, the input made channels-last (its weight is)."""
    return _conv_views(x.contiguous(memory_format=torch.channels_last), w, b, r)


def _conv_views_weight_channels_last(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    """As :func:`_conv_views`, the weight made channels-last (its input is)."""
    return _conv_views(x, w.contiguous(memory_format=torch.channels_last), b, r)


def _channels_last_wanted(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A channels-last weight and an input that is not: PyTorch then runs the convolution
    channels-last, its input converted, and so does dnntune (decided once per signature; the
    input is converted on each call, as PyTorch converts it). With the arguments swapped: a
    channels-last input and a weight that is not, the weight then converted."""
    channels_last = torch.channels_last
    return suggest_memory_format(w) is channels_last and (
        suggest_memory_format(x) is not channels_last
    )


# ---- linear ---------------------------------------------------------------------------------
def linear_kernel(
    x2d: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual2d: torch.Tensor | None = None,
    multiplier2d: torch.Tensor | None = None,
) -> tuple[Kernel, list[torch.Tensor]]:
    """The kernel selected for this linear's signature and the inputs it takes."""
    w_t = w.t()
    bias_row = bias.view(1, -1) if bias is not None else None
    key: tuple[Any, ...] = (
        "linear",
        _sig(x2d),
        _sig(w_t),
        _sig(bias_row),
        activation,
        _sig(residual2d),
    )
    if multiplier2d is not None:  # (the keys of plain linears as they were)
        key += ("multiplier", _sig(multiplier2d))
    inputs = [t for t in (x2d, w_t, bias_row, residual2d, multiplier2d) if t is not None]
    kernel = kernel_for(
        key,
        lambda: linear_graph(x2d, w_t, bias_row, activation, residual2d, multiplier2d),
        inputs,
    )
    return kernel, inputs


def _rows(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` as a [rows, cols] matrix whose rows are contiguous (a view when possible)."""
    t2d = t.reshape(rows, cols)
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


def linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    multiplier: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear`` (y = x W^T + b) with an optional fused ``residual`` add (a tensor of the
    output's shape, added before the activation), ``activation`` and ``multiplier`` (a tensor
    of the output's shape the result is multiplied by, last: a gated MLP's ``up_proj(x) *
    act(gate_proj(x))`` as one graph)."""
    if tracing():  # PyTorch's op, or under torch.fx this call (as conv2d's)
        node = recorded(
            linear,
            input,
            weight,
            bias,
            activation=activation,
            residual=residual,
            multiplier=multiplier,
        )
        if node is not None:
            return node
        return _linear_torch(input, weight, bias, activation, residual, multiplier)
    if _pytorch_forced.get() or _autocast():  # PyTorch's op (autocast: it casts as PyTorch's)
        return _linear_torch(input, weight, bias, activation, residual, multiplier)
    recent = _linear_sites.get(id(weight))
    if recent is not None and recent.fits((activation,), input, weight, bias, residual, multiplier):
        if recent.call is NATIVE:
            return _linear_torch(input, weight, bias, activation, residual, multiplier)
        return recent.call(input, weight, bias, residual, multiplier)
    memo: tuple[Any, ...] | None
    try:  # the raw arguments as one flat key: a signature seen before skips every check below
        if lazy_view(input, weight, bias, residual, multiplier):
            raise TypeError("a lazy view: no memo")
        grad = _grad_enabled() and (
            input.requires_grad
            or weight.requires_grad
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad)
            or (multiplier is not None and multiplier.requires_grad)
        )
        memo = (
            "linear",
            type(input),  # a subclass, a nested or fake tensor: another signature
            input.shape,
            input.stride(),
            input.dtype,
            input.device,
            type(weight),
            weight.shape,
            weight.stride(),
            weight.dtype,
            weight.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            activation,
            None if residual is None else _sig(residual),
            None if multiplier is None else _sig(multiplier),
            grad,
        )
        known = native_memo.lookup(memo)
    except (AttributeError, TypeError, RuntimeError):  # as conv2d's
        memo, known = None, None
        grad = _grad_wanted(input, weight, bias, residual, multiplier)
    if known is not None:
        given = (input, weight, bias, residual, multiplier)
        native_memo.keep(_linear_sites, id(weight), memo, given, (activation,), known)
        if known is NATIVE:  # this signature's winner is PyTorch's own op (seen before)
            return _linear_torch(input, weight, bias, activation, residual, multiplier)
        return known(input, weight, bias, residual, multiplier)
    _check_activation(activation)

    def fallback() -> torch.Tensor:
        return _linear_torch(input, weight, bias, activation, residual, multiplier)

    tensors = [input, weight, bias, residual, multiplier]
    kind = unsupported_kind(tensors)  # before any shape is read
    if kind is not None:
        return _declined("linear", memo, tensors, fallback, kind)
    if _mixed(input, weight, bias) or _mixed(input, multiplier):
        return fallback()  # PyTorch's own error or type promotion (dnntune's graph would cast)

    def run() -> torch.Tensor:
        lead = input.shape[:-1]
        x2d = input.reshape(-1, input.shape[-1])
        if x2d.stride(-1) != 1:
            x2d = x2d.contiguous()
        if grad:
            fused_relu = residual is None and activation == "relu"
            act = "relu" if fused_relu else None
            kernel = linear_kernel(x2d, weight, bias, act)[0]
            if memo is not None:
                native_memo.note(memo, kernel)
            if kernel.native:
                return fallback()  # PyTorch's op won the forward: its autograd, no overhead
            y = LinearFunction.apply(x2d, weight, bias, fused_relu, kernel)
            if not fused_relu:
                if residual is not None:
                    y = y + residual.reshape(y.shape)
                y = TORCH_ACTIVATIONS[activation](y) if activation else y
            if multiplier is not None:
                y = y * multiplier.reshape(y.shape)
            return y.reshape(*lead, weight.shape[0])
        rows, cols = x2d.shape[0], weight.shape[0]
        r2d = None if residual is None else _rows(residual, rows, cols)
        m2d = None if multiplier is None else _rows(multiplier, rows, cols)
        kernel, inputs = linear_kernel(x2d, weight, bias, activation, r2d, m2d)
        if memo is not None:
            native_memo.note(memo, kernel)
        if kernel.native:
            return fallback()  # PyTorch's own op won: call it as eager code does
        y = kernel(*inputs)[0]
        out_shape = (*lead, cols)
        if memo is not None:
            raw = (input, weight, bias, residual, multiplier)
            derived = (x2d, inputs[1], None if bias is None else inputs[2], r2d, m2d)
            k = input.shape[-1]

            def views(
                x: torch.Tensor,
                w: torch.Tensor,
                b: torch.Tensor | None,
                r: torch.Tensor | None,
                m: torch.Tensor | None,
            ) -> tuple[torch.Tensor | None, ...]:
                x2 = _rows(x, rows, k)
                r2 = None if r is None else _rows(r, rows, cols)
                m2 = None if m is None else _rows(m, rows, cols)
                return (x2, w.t(), None if b is None else b.view(1, -1), r2, m2)

            native_memo.remember(memo, prepared_call(kernel, raw, derived, views, out_shape))
        return y.reshape(out_shape)

    if input.dim() == 0:
        return fallback()  # PyTorch's own error
    if input.numel() == 0:
        # an empty batch (a detector's frame with no boxes): PyTorch's op returns the empty
        # result; an expected route, quiet, as conv2d's, the norms' and attention's (it warned
        # "empty input" and used up that warning; a new-user audit)
        _log.debug("dnntune.torch.linear: an empty tensor: PyTorch's own op")
        return fallback()
    extra = None
    out_shape = (*input.shape[:-1], weight.shape[0])
    for name, operand in (("residual", residual), ("multiplier", multiplier)):
        if operand is not None and operand.shape != out_shape:
            extra = f"{name} of shape {tuple(operand.shape)} is not the output's shape {out_shape}"
    return _guarded("linear", tensors, run, fallback, extra, memo)
