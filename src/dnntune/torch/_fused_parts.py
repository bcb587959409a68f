"""What every fused call shares: which modules a fused call may stand for (exactly PyTorch's
class, or dnntune's in its place), which return their input unchanged in eval mode, whether a
hook of the user's is set (then the modules run one by one), and the activation an activation
module computes now. Used by :mod:`dnntune.torch._fused_calls` and
:mod:`dnntune.torch._fused_sequential`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dnntune.torch._activations import activation_name
from dnntune.torch._pytorch_ops import epilogue as _pytorch_epilogue
from dnntune.torch.modules import SWAPS

__all__ = [
    "CONVS",
    "LINEARS",
    "NORMS",
    "activation_now",
    "eval_identity",
    "finish",
    "hooked",
    "plain",
    "plus",
    "skippable",
    "then",
]

#: the classes a fused call stands for: PyTorch's own, or dnntune's module class in its place
#: (a subclass, such as a LoRA linear, a weight-standardized conv or timm's ``BatchNormAct2d``,
#: has a forward of its own, which a fused call would skip: it runs as it is written)
CONVS = (nn.Conv2d, SWAPS[nn.Conv2d])
LINEARS = (nn.Linear, SWAPS[nn.Linear])
NORMS = (nn.BatchNorm2d, SWAPS[nn.BatchNorm2d])
_EXACT: dict[type[nn.Module], tuple[type[nn.Module], ...]] = {
    nn.Conv2d: CONVS,
    nn.Linear: LINEARS,
    nn.BatchNorm2d: NORMS,
}


def plain(module: object, cls: type[nn.Module]) -> bool:
    """Whether ``module``'s class is exactly ``cls`` (``nn.Conv2d``, ``nn.Linear``,
    ``nn.BatchNorm2d``) or dnntune's module class for it: the only modules a fused call runs in
    place of their own forward."""
    return type(module) in _EXACT[cls]


#: modules that return their input unchanged in eval mode (dropout, stochastic depth), which a
#: block may call between its branch and the residual add (torchvision's MBConv:
#: ``result = self.stochastic_depth(self.block(input)); result += input``); PyTorch's by
#: class, those of libraries dnntune does not import by module and name
_EVAL_IDENTITIES: tuple[type[nn.Module], ...] = (
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
_EVAL_IDENTITIES_ELSEWHERE = frozenset(
    {
        ("torchvision.ops.stochastic_depth", "StochasticDepth"),
        ("timm.layers.drop", "DropPath"),
        ("timm.models.layers.drop", "DropPath"),
    }
)


def eval_identity(module: nn.Module) -> bool:
    """Whether ``module`` is exactly one of the classes that return their input unchanged in
    eval mode (a subclass may do anything in its own forward, and so may a forward set on the
    instance)."""
    if "forward" in module.__dict__:
        return False
    cls = type(module)
    return cls in _EVAL_IDENTITIES or (cls.__module__, cls.__qualname__) in (
        _EVAL_IDENTITIES_ELSEWHERE
    )


def skippable(between: tuple[nn.Module, ...]) -> bool:
    """Whether the eval-identity modules a fused call stands for may be skipped now: each in
    eval mode, with no hook of the user's and no forward set on the instance since
    ``optimize`` (:func:`hooked`; new-user audit, session 55: a Dropout's patched forward was
    skipped, an error of 0.66)."""
    return all(not m.training for m in between) and not hooked(*between)


def then(y: torch.Tensor, between: tuple[nn.Module, ...]) -> torch.Tensor:
    """``y`` through the eval-identity modules ``between``, as the forward calls them (an
    unfused call)."""
    for m in between:
        y = m(y)
    return y


def plus(y: torch.Tensor, residual: torch.Tensor | float, residual_first: bool) -> Any:
    """The residual add of an unfused call, its operands in the forward's order: eager's add
    lays its output out as its first tensor operand (a residual of another layout than the
    branch's output)."""
    return residual + y if residual_first else y + residual


def hooked(*modules: nn.Module | None) -> bool:
    """Whether one of ``modules`` has hooks of the user's, forward or backward
    (``register_full_backward_hook``, a Grad-CAM's or saliency tool's), or a global one is set,
    or was given a forward of its own on the instance (``layer.forward = ...``; new-user
    audit, session 55: a fused Linear's or conv's skipped, errors of 0.3 to 1.7): a fused call
    would skip them, so those modules run one by one, as PyTorch calls them. dnntune registers
    no hook of its own (``modules.ATTRIBUTED``) and sets no forward on an instance."""
    if any(_GLOBAL_HOOKS):  # C-level truth tests of PyTorch's global hook dicts
        return True
    for m in modules:
        if m is None:
            continue
        attrs = m.__dict__  # every module's own hook dicts: one subscript each
        if (
            attrs["_backward_hooks"]
            or attrs["_backward_pre_hooks"]
            or attrs["_forward_hooks"]
            or attrs["_forward_pre_hooks"]
            or "forward" in attrs
        ):
            return True
    return False


#: PyTorch's global module hooks, forward and backward (``register_module_forward_hook``,
#: ``register_module_full_backward_hook`` and their pre-hooks)
_GLOBAL_HOOKS = tuple(
    getattr(nn.modules.module, name)
    for name in (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    if isinstance(getattr(nn.modules.module, name, None), dict)
)


def activation_now(activation: str | None, act_module: nn.Module | None) -> tuple[bool, str | None]:
    """Whether the call may run fused, and the activation it fuses: what ``act_module``
    computes now (a GELU's ``approximate`` can be set after ``optimize``, a child replaced),
    or, for a function the forward called (``act_module`` None), ``activation`` as traced.
    A module that no longer computes an activation dnntune fuses runs unfused."""
    if act_module is None:
        return True, activation
    now = activation_name(act_module)
    return now is not None, now


def finish(y: torch.Tensor, activation: str | None, act_module: nn.Module | None) -> Any:
    """The activation after an unfused call: the module the forward called (its hooks run),
    else the function it called."""
    if act_module is not None:
        return act_module(y)
    return _pytorch_epilogue(y, None, activation)
