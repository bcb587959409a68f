"""Training support: conv2d and linear whose backward runs dnntune dgrad/wgrad/matmul graphs.

A backward chooses its kernels under the settings its forward ran under (kept on the autograd
context): autograd runs it after the model's forward has returned, outside the scope that put
the model's settings in force (:func:`dnntune.torch.config.enter_scope`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from dnntune.torch.config import current, enter_scope, exit_scope
from dnntune.torch.graphs import (
    conv2d_graph,
    conv_dgrad_graph,
    conv_wgrad_graph,
    matmul_graph,
    memory_format_of,
)
from dnntune.torch.runtime import Kernel, kernel_for

__all__ = ["Conv2dFunction", "LinearFunction", "conv2d_kernel", "matmul"]


def _sig(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    if t is None:
        return None
    # torch.Size, stride tuples, dtypes and devices are hashable: no conversions on the hot path
    return (t.shape, t.stride(), t.dtype, t.device)


def conv2d_kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    bias_view: torch.Tensor | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    activation: str | None,
    residual: torch.Tensor | None,
    post: tuple[int, ...] | None = None,
) -> tuple[Kernel, list[torch.Tensor]]:
    """The kernel selected for this convolution's signature and the inputs it takes.
    ``padding`` is the padding before each spatial dim, and after it too unless ``post``
    says otherwise (``padding="same"`` with an even kernel)."""
    key = (
        "conv2d",
        _sig(x),
        _sig(w),
        _sig(bias_view),
        stride,
        padding,
        dilation,
        activation,
        _sig(residual),
        post,
    )
    inputs = [t for t in (x, w, bias_view, residual) if t is not None]
    kernel = kernel_for(
        key,
        lambda: conv2d_graph(
            x, w, bias_view, stride, padding, dilation, activation, residual, post
        ),
        inputs,
    )
    return kernel, inputs


@contextlib.contextmanager
def _forward_settings(ctx: Any) -> Iterator[None]:
    """The settings the forward of ``ctx`` ran under, in force for its backward's kernel
    choices (dgrad, wgrad): a model optimized with its own policy or override file chose its
    backward kernels under the process's settings (an audit: another file read and written,
    another policy, than its forward's)."""
    token = enter_scope(ctx.settings)
    try:
        yield
    finally:
        exit_scope(token)


def matmul(a: torch.Tensor, b: torch.Tensor, name: str) -> torch.Tensor:
    key = (name, _sig(a), _sig(b))
    kernel = kernel_for(key, lambda: matmul_graph(a, b, name), [a, b])
    return kernel(a, b)[0]


class Conv2dFunction(torch.autograd.Function):
    """conv2d (+bias, +relu) forward on dnntune; backward on dnntune dgrad and wgrad graphs,
    or, when the backward itself is recorded (``create_graph=True``: a double backward will
    follow), on PyTorch's differentiable ops."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        stride: tuple[int, ...],
        padding: tuple[int, ...],
        dilation: tuple[int, ...],
        relu: bool,
        kernel: Kernel,
        post: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        # ``kernel``: what conv2d_kernel selected for these arguments (the caller looked it up
        # to decide between this function and PyTorch's op; it takes x, w and the bias view);
        # ``post``: the padding after each spatial dim where it is not ``padding`` (as there)
        bias_view = bias.view(1, -1, 1, 1) if bias is not None else None
        y = kernel(*(t for t in (x, w, bias_view) if t is not None))[0]
        ctx.save_for_backward(x, w, y if relu else None)
        ctx.conf = (stride, padding, dilation, bias is not None, relu, post)
        ctx.settings = current()  # its backward chooses under them (:func:`_forward_settings`)
        return y

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        (dy,) = grads
        x, w, y = ctx.saved_tensors
        stride, padding, dilation, has_bias, relu, post = ctx.conf
        if relu:
            dy = _relu_backward(dy, y)
        if torch.is_grad_enabled():
            # create_graph: a double backward follows (a gradient penalty), which needs these
            # gradients as functions of x, w and dy: PyTorch's differentiable ops
            dx, dw = _differentiable_grads(ctx.needs_input_grad, x, w, dy, ctx.conf)
            db = dy.sum(dim=(0, 2, 3)) if has_bias and ctx.needs_input_grad[2] else None
            return dx, dw, db, *(None,) * 6
        dy = dy.contiguous(memory_format=memory_format_of(x))
        dx = dw = db = None
        geometry = (stride, padding, dilation, post)
        with _forward_settings(ctx):
            if ctx.needs_input_grad[0]:
                key = ("conv2d_dgrad", _sig(dy), _sig(w), tuple(x.shape), *geometry)
                k = kernel_for(key, lambda: conv_dgrad_graph(dy, w, x.shape, *geometry), [dy, w])
                dx = k(dy, w)[0]
            if ctx.needs_input_grad[1]:
                key = ("conv2d_wgrad", _sig(dy), _sig(x), tuple(w.shape), *geometry)
                k = kernel_for(key, lambda: conv_wgrad_graph(dy, x, w.shape, *geometry), [dy, x])
                dw = k(dy, x)[0]
        if has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, 2, 3))
        return dx, dw, db, None, None, None, None, None, None


def _differentiable_grads(
    needs: tuple[bool, ...],
    x: torch.Tensor,
    w: torch.Tensor,
    dy: torch.Tensor,
    conf: tuple[Any, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx, dw) from PyTorch's differentiable ops. Padding that differs after a dim
    (``padding="same"``, an even kernel), which those ops do not take, is applied to ``x``
    itself: dx is the padded input's gradient, cropped back."""
    stride, padding, dilation, _, _, post = conf
    groups = x.shape[1] // w.shape[1]
    grad = torch.nn.grad
    if post is None:
        return (
            grad.conv2d_input(x.shape, w, dy, stride, padding, dilation, groups)
            if needs[0]
            else None,
            grad.conv2d_weight(x, w.shape, dy, stride, padding, dilation, groups)
            if needs[1]
            else None,
        )
    (top, left), (bottom, right) = padding, post
    padded = torch.nn.functional.pad(x, (left, right, top, bottom))
    dx = dw = None
    if needs[0]:
        dxp = grad.conv2d_input(padded.shape, w, dy, stride, 0, dilation, groups)
        dx = dxp[:, :, top : top + x.shape[2], left : left + x.shape[3]]
    if needs[1]:
        dw = grad.conv2d_weight(padded, w.shape, dy, stride, 0, dilation, groups)
    return dx, dw


def _relu_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``dy`` where the ReLU's output ``y`` is positive, else 0: one kernel, as eager's ReLU
    backward (``dy * (y > 0)`` took three: compare, cast, multiply)."""
    out: torch.Tensor = torch.ops.aten.threshold_backward(dy, y, 0)
    return out


class LinearFunction(torch.autograd.Function):
    """x @ w.T (+bias, +relu) on dnntune; backward: dx = dy @ w and dw = dy.T @ x on dnntune."""

    @staticmethod
    def forward(
        ctx: Any,
        x2d: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        relu: bool,
        kernel: Kernel,
    ) -> torch.Tensor:
        # ``kernel``: what linear_kernel selected (it takes x2d, w^T and the bias as a row)
        bias_row = bias.view(1, -1) if bias is not None else None
        y = kernel(*(t for t in (x2d, w.t(), bias_row) if t is not None))[0]
        ctx.save_for_backward(x2d, w, y if relu else None)
        # the bias's own shape: F.linear takes any bias that broadcasts over the output's last
        # dim ([out], [1, out]), and its gradient has that shape (audit, session 18)
        ctx.conf = (None if bias is None else bias.shape, relu)
        ctx.settings = current()  # as Conv2dFunction's
        return y

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        (dy,) = grads
        x2d, w, y = ctx.saved_tensors
        bias_shape, relu = ctx.conf
        has_bias = bias_shape is not None
        if relu:
            dy = _relu_backward(dy, y)
        if torch.is_grad_enabled():  # create_graph: PyTorch's differentiable ops (as conv's)
            needs = ctx.needs_input_grad
            return (
                dy @ w if needs[0] else None,
                dy.t() @ x2d if needs[1] else None,
                dy.sum(dim=0).reshape(bias_shape) if has_bias and needs[2] else None,
                None,
                None,
            )
        dy = dy.contiguous()
        dx = dw = db = None
        with _forward_settings(ctx):
            if ctx.needs_input_grad[0]:
                dx = matmul(dy, w.contiguous(), "torch_linear_dgrad")
            if ctx.needs_input_grad[1]:
                dw = matmul(dy.t(), x2d.contiguous(), "torch_linear_wgrad")
        if has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=0).reshape(bias_shape)
        return dx, dw, db, None, None
