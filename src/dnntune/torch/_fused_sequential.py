"""A fused ``nn.Sequential``: each ``Conv2d, BatchNorm2d[, activation]`` run of its children
folded into the conv, and each ``Linear|Conv2d, activation`` pair one graph, in the
Sequential's own forward (:func:`fuse_sequential`); and the layer a Sequential branch ends with,
whose epilogue can take a residual add (:func:`tail_layer`). Used by
:mod:`dnntune.torch.fusion` and :mod:`dnntune.torch._fused_calls`."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

from torch import nn

from dnntune.torch._activations import activation_name
from dnntune.torch._fused_parts import (
    CONVS,
    LINEARS,
    NORMS,
    activation_now,
    eval_identity,
    hooked,
)
from dnntune.torch._subclass import ORIGIN, shared_stand_in
from dnntune.torch._support import pytorch_route

__all__ = [
    "SequentialFusion",
    "Step",
    "end_of_layers",
    "fuse_sequential",
    "run_before",
    "tail_layer",
]

# ---- nn.Sequential ----------------------------------------------------------------------------
# A step of a fused Sequential: (kind, layer, batch norm, activation module, activation name).
_PLAIN, _CONV_BN, _ACT = 0, 1, 2
Step = tuple[int, nn.Module, "nn.Module | None", "nn.Module | None", "str | None"]


class SequentialFusion(NamedTuple):
    """One fused run of a Sequential's children (:func:`fuse_sequential`), by child name."""

    layer: str  #: the Conv2d or Linear
    folded: str | None  #: the BatchNorm2d folded into the conv
    act: str | None  #: the activation module whose activation is the layer's epilogue
    activation: str | None  #: that activation ("relu", "gelu", ...)


def fuse_sequential(seq: nn.Sequential) -> list[SequentialFusion]:
    """Fold each ``Conv2d, BatchNorm2d[, activation]`` run of ``seq``'s children into the conv,
    and each ``Linear|Conv2d, activation`` pair into the layer's graph, in ``seq``'s own
    forward: its class is swapped for one that calls the layer's fused method there (eval
    mode; each module's own ``training`` flag, padding mode and batch-norm statistics decide,
    and anything the fused call declines runs the children as PyTorch does). The children
    themselves are not changed, so a child also called elsewhere runs as it is there. Only
    children of exactly PyTorch's classes (or dnntune's in their place) are fused: a subclass
    runs its own forward. A Sequential subclass with its own forward is left alone; children
    added, removed or replaced later make the forward run them all as PyTorch does. A
    Sequential fused by an earlier ``optimize`` (under dnntune's wrappers of its forward) has
    its steps made again, and keeps its class.

    Returns: what is fused (for the report).
    """
    fused_before = _fused_forward(type(seq))
    if fused_before is None:
        return []
    names = list(seq._modules)
    children = list(seq._modules.values())
    steps: list[Step] = []
    fused: list[SequentialFusion] = []
    i = 0
    while i < len(children):
        child, nxt = children[i], children[i + 1] if i + 1 < len(children) else None
        if type(child) in CONVS and type(nxt) in NORMS:
            after = children[i + 2] if i + 2 < len(children) else None
            act = activation_name(after) if after is not None else None
            steps.append((_CONV_BN, child, nxt, after if act else None, act))
            fused.append(
                SequentialFusion(names[i], names[i + 1], names[i + 2] if act else None, act)
            )
            i += 3 if act else 2
            continue
        act = activation_name(nxt) if nxt is not None else None
        if (type(child) in CONVS or type(child) in LINEARS) and act is not None:
            steps.append((_ACT, child, None, nxt, act))
            fused.append(SequentialFusion(names[i], None, names[i + 1], act))
            i += 2
            continue
        steps.append((_PLAIN, child, None, None, None))
        i += 1
    if not fused:
        seq.__dict__.pop("_dnntune_steps", None)  # a fused forward runs the children as they are
        return []
    seq.__dict__["_dnntune_steps"] = (tuple(children), tuple(steps))
    if not fused_before:
        seq.__class__ = shared_stand_in(
            type(seq), "_dnntune_sequential", {"forward": _sequential_forward}
        )
    return fused


def _fused_forward(cls: type) -> bool | None:
    """Whether a Sequential of class ``cls`` runs the fused forward already (True: an earlier
    ``optimize`` fused it, also under dnntune's wrappers of its forward, such as the routing
    or CUDA-graph ones), can be given it (False: ``nn.Sequential``'s own forward), or neither
    (None: a forward of its own, or one dnntune wrapped unfused, which a fused class on top
    would drop)."""
    if getattr(cls, "forward", None) is nn.Sequential.forward:
        return False
    while ORIGIN in cls.__dict__:  # dnntune's classes down to the user's
        if cls.__dict__.get("forward") is _sequential_forward:
            return True
        cls = cls.__dict__[ORIGIN]
    return None


def _steps_of(seq: nn.Module) -> tuple[Step, ...] | None:
    """The fused steps of ``seq`` (:func:`fuse_sequential`), or None: not fused, or its
    children changed since."""
    plan = seq.__dict__.get("_dnntune_steps")
    if plan is None or plan[0] != tuple(seq._modules.values()):
        return None
    steps: tuple[Step, ...] = plan[1]
    return steps


def run_before(branch: nn.Module, layers: list[nn.Module], at: int, x: Any) -> Any:
    """``branch``'s children before ``layers[at]`` on ``x``, through its fused steps when
    they end right there (a bottleneck body's conv, batch norm and ReLU stay one graph)."""
    steps = _steps_of(branch)
    if steps is not None:
        done = 0
        for count, step in enumerate(steps):
            if done == at:
                return _run_steps(steps[:count], x)
            done += 1 + (step[2] is not None) + (step[3] is not None)
    for layer in layers[:at]:
        x = layer(x)
    return x


def _sequential_forward(self: nn.Sequential, input: Any) -> Any:
    # its children changed since optimize(), or the forward runs on PyTorch's route
    steps = None if pytorch_route.on else _steps_of(self)
    if steps is None:
        return nn.Sequential.forward(self, input)
    return _run_steps(steps, input)


def _run_steps(steps: tuple[Step, ...], input: Any) -> Any:
    for kind, layer, bn, act_module, act in steps:
        if kind == _PLAIN:
            input = layer(input)
            continue
        out = None
        ok, act = activation_now(act, act_module)
        if not ok or hooked(layer, bn, act_module):
            pass  # a hook of the user's must see each module's own call; or the activation
            # module computes no activation dnntune fuses now
        elif kind == _CONV_BN:
            method = getattr(layer, "fused_bn", None)
            if method is not None:
                out = method(input, bn, act)
        else:
            method = getattr(layer, "fused_activation", None)
            if method is not None:
                assert act is not None
                out = method(input, act)
        if out is not None:
            input = out
            continue
        input = layer(input)  # declined: each module as PyTorch runs it
        if bn is not None:
            input = bn(input)
        if act_module is not None:
            input = act_module(input)
    return input


def tail_layer(branch: nn.Module) -> nn.Module | None:
    """The layer a branch ends with, whose epilogue can take the residual add: a Conv2d, or a
    Sequential ending in Conv2d [+ BatchNorm2d], in Linear, or in such a Sequential
    (torchvision's MBConv block ends in a ``Conv2dNormActivation`` without an activation),
    then any modules that are the identity in eval mode (torchvision's MLP blocks end in
    ``Linear, Dropout``)."""
    if type(branch) in CONVS:
        return branch
    if not _plain_sequential(branch):
        return None
    layers = list(branch)[: end_of_layers(branch)]
    if not layers:
        return None
    if isinstance(layers[-1], nn.Sequential):
        return tail_layer(layers[-1])
    if type(layers[-1]) in NORMS:
        layers = layers[:-1]
        return layers[-1] if layers and type(layers[-1]) in CONVS else None
    return layers[-1] if type(layers[-1]) in (*CONVS, *LINEARS) else None


def end_of_layers(seq: nn.Sequential) -> int:
    """How many of ``seq``'s children come before its trailing eval-identity modules."""
    children = list(seq)
    end = len(children)
    while end > 0 and eval_identity(children[end - 1]):
        end -= 1
    return end


def _plain_sequential(module: nn.Module) -> TypeGuard[nn.Sequential]:
    """A non-empty Sequential that runs its children one after the other: nn.Sequential's own
    forward or dnntune's fused one (a subclass with a forward of its own runs as it is)."""
    return (
        isinstance(module, nn.Sequential)
        and len(module) > 0
        and type(module).forward in (nn.Sequential.forward, _sequential_forward)
    )
