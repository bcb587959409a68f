"""What a fused call runs (the functions a rewritten forward calls): in eval mode the layer's
fused graph, and otherwise, or where a module has a forward hook of the user's, each module as
PyTorch calls it. A fused ``nn.Sequential``'s forward is in ``_fused_sequential.py``, what both
share in ``_fused_parts.py``; :mod:`dnntune.torch.fusion` decides where these calls go."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dnntune.torch._activations import activation_name
from dnntune.torch._fused_parts import (
    LINEARS,
    NORMS,
    activation_now,
    eval_identity,
    finish,
    hooked,
    plus,
    skippable,
    then,
)
from dnntune.torch._fused_sequential import end_of_layers, run_before, tail_layer
from dnntune.torch._timm import norm_act_class

__all__ = [
    "fused_activation",
    "fused_conv_bn",
    "fused_conv_bn_tail",
    "fused_conv_norm_act",
    "fused_linear_tail",
    "fused_product",
    "fused_tail",
    "norm_act",
]


def fused_tail(
    branch: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: tuple[nn.Module, ...] = (),
    residual_first: bool = False,
) -> torch.Tensor:
    """``activation(between(branch(x)) + residual)`` for a Conv2d or Sequential branch, with
    its last layer (:func:`tail_layer`) running the add and activation as its fused epilogue
    in eval mode (else PyTorch's ops, unchanged). ``act_module``: the activation module the
    forward called (None: a function); ``between``: the eval-identity modules the forward
    called on the branch's output (:func:`eval_identity`), run as they are outside eval mode."""
    ok, act = activation_now(activation, act_module)
    # the residual may be a number (``relu(conv(x) + shift)``, ``shift`` an argument of the
    # forward): no residual of a graph's, PyTorch's add takes it
    if (
        ok
        and isinstance(residual, torch.Tensor)
        and not branch.training
        and skippable(between)
        and not hooked(act_module)
    ):
        out = _fused_branch(branch, x, residual, act)
        if out is not None:
            return out
    return finish(plus(then(branch(x), between), residual, residual_first), activation, act_module)


def _fused_branch(
    branch: nn.Module, x: torch.Tensor, residual: torch.Tensor, act: str | None
) -> torch.Tensor | None:
    """``act(branch(x) + residual)`` through the fused epilogue of the branch's last layer, or
    None (declined: the caller runs PyTorch's ops). A Sequential runs its children before that
    layer (through its own fused steps), or before its last child, a Sequential, and recurses
    into it; its trailing eval-identity modules are skipped while in eval mode."""
    layer = tail_layer(branch)
    fused = getattr(layer, "fused_tail", None)
    if layer is None or fused is None or hooked(branch):
        return None
    if not isinstance(branch, nn.Sequential):  # the conv itself
        return fused(x, residual, act, None)
    layers = list(branch)
    end = end_of_layers(branch)
    if not skippable(tuple(layers[end:])):
        return None
    if isinstance(layers[end - 1], nn.Sequential):
        y = run_before(branch, layers, end - 1, x)
        return _fused_branch(layers[end - 1], y, residual, act)
    if type(layer) in LINEARS:
        if hooked(layer):
            return None
        return fused(run_before(branch, layers, end - 1, x), residual, act)
    # the branch's batch norm after its last conv, folded by the conv (given explicitly: the
    # conv itself keeps no state of the Sequential it sits in)
    at, bn = (end - 2, layers[end - 1]) if type(layers[end - 1]) in NORMS else (end - 1, None)
    if hooked(layer, bn):
        return None
    return fused(run_before(branch, layers, at, x), residual, act, bn)


def fused_linear_tail(
    layer: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: tuple[nn.Module, ...] = (),
    residual_first: bool = False,
) -> torch.Tensor:
    """``activation(between(layer(x)) + residual)`` for a Linear child, the add (and
    activation) fused into its GEMM's epilogue in eval mode (else PyTorch's ops, unchanged)."""
    fused = getattr(layer, "fused_tail", None)
    ok, act = activation_now(activation, act_module)
    if (
        ok
        and fused is not None
        and isinstance(residual, torch.Tensor)
        and skippable(between)
        and not hooked(layer, act_module)
    ):
        out = fused(x, residual, act)
        if out is not None:
            return out
    return finish(plus(then(layer(x), between), residual, residual_first), activation, act_module)


def fused_conv_bn_tail(
    conv: nn.Module,
    bn: nn.Module | None,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: tuple[nn.Module, ...] = (),
    residual_first: bool = False,
) -> torch.Tensor:
    """``activation(between(bn(conv(x))) + residual)`` for a conv and batch norm called one
    after the other (torchvision's blocks), fused like :func:`fused_tail` in eval mode."""
    fused = getattr(conv, "fused_tail", None)
    ok, act = activation_now(activation, act_module)
    if (
        ok
        and fused is not None
        and isinstance(residual, torch.Tensor)
        and not conv.training
        and (bn is None or not bn.training)
        and (bn is None or not norm_act_class(type(bn)) or norm_act(bn) == (True, None))
        and skippable(between)
        and not hooked(conv, bn, act_module)
    ):
        out = fused(x, residual, act, bn)
        if out is not None:
            return out
    y = conv(x)
    if bn is not None:
        y = bn(y)
    return finish(plus(then(y, between), residual, residual_first), activation, act_module)


def fused_conv_bn(
    conv: nn.Module,
    bn: nn.Module,
    x: torch.Tensor,
    activation: str | None,
    act_module: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(bn(conv(x)))`` for a conv and batch norm called one after the other, the
    batch norm folded into the conv (and the activation its epilogue) in eval mode, else
    PyTorch's ops, unchanged."""
    fused = getattr(conv, "fused_bn", None)
    ok, act = activation_now(activation, act_module)
    if ok and fused is not None and not hooked(conv, bn, act_module):
        out = fused(x, bn, act)
        if out is not None:
            return out
    return finish(bn(conv(x)), activation, act_module)


def norm_act(bn: nn.Module) -> tuple[bool, str | None]:
    """Whether timm's ``BatchNormAct2d`` ``bn`` is now its batch norm (fixed statistics: the
    caller's fold decides) followed by an activation dnntune fuses, and that activation (None:
    its ``act`` is the identity): its ``drop`` the identity in eval mode, its ``act`` a module
    whose activation dnntune runs as an epilogue or ``nn.Identity``, neither with a hook of the
    user's nor in training mode."""
    children = bn._modules
    drop, act = children.get("drop"), children.get("act")
    if drop is not None and (not eval_identity(drop) or drop.training or hooked(drop)):
        return False, None
    if act is None or type(act) is nn.Identity:
        return not hooked(act), None
    name = activation_name(act)
    return name is not None and not hooked(act), name


def fused_conv_norm_act(conv: nn.Module, bn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``bn(conv(x))`` for a conv and timm's ``BatchNormAct2d`` called right after it: in eval
    mode the batch norm folded into the conv and its activation the conv's epilogue, one graph
    (timm's EfficientNet, RegNet and CSP blocks: three passes over the output in eager), else
    the two modules as PyTorch calls them."""
    fused = getattr(conv, "fused_bn", None)
    if fused is not None and norm_act_class(type(bn)) and not hooked(conv, bn):
        ok, act = norm_act(bn)
        out = fused(x, bn, act) if ok else None
        if out is not None:
            return out
    return bn(conv(x))


def fused_activation(
    layer: nn.Module, x: torch.Tensor, activation: str, act_module: nn.Module | None = None
) -> torch.Tensor:
    """``activation(layer(x))`` for a Linear or Conv2d child, the activation fused into the
    layer's graph in eval mode (else PyTorch's ops, unchanged)."""
    fused = getattr(layer, "fused_activation", None)
    ok, act = activation_now(activation, act_module)
    if ok and act is not None and fused is not None and not hooked(layer, act_module):
        out = fused(x, act)
        if out is not None:
            return out
    return finish(layer(x), activation, act_module)


def fused_product(
    layer: nn.Module, x: torch.Tensor, other: Any, layer_first: bool = False
) -> torch.Tensor:
    """``other * layer(x)`` (``layer(x) * other`` with ``layer_first``) for a Linear child, the
    multiply fused into the layer's graph in eval mode (a gated MLP's ``act(gate(x)) *
    up(x)``: the up projection's epilogue multiplies by the activated gate); else PyTorch's
    ops, unchanged."""
    fused = getattr(layer, "fused_multiply", None)
    if fused is not None and isinstance(other, torch.Tensor) and not hooked(layer):
        out = fused(x, other)
        if out is not None:
            return out
    y = layer(x)
    return y * other if layer_first else other * y
