"""What a fused call runs (the functions a rewritten forward calls, and a fused
``nn.Sequential``'s forward): in eval mode the layer's fused graph, and otherwise, or where a
module has a forward hook of the user's, each module as PyTorch calls it. Re-exported by
:mod:`dnntune.torch.fusion`, which decides where these calls go."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import torch
from torch import nn

from dnntune.torch import functional as dtf
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch._pytorch_ops import epilogue as _pytorch_epilogue
from dnntune.torch._subclass import ORIGIN, shared_stand_in
from dnntune.torch._timm import norm_act_class
from dnntune.torch._transformers import conv1d_like
from dnntune.torch.modules import SWAPS, activation_name

__all__ = [
    "SequentialFusion",
    "Step",
    "eval_identity",
    "fuse_sequential",
    "fused_activation",
    "fused_conv1d_activation",
    "fused_conv_bn",
    "fused_conv_bn_tail",
    "fused_conv_norm_act",
    "fused_linear_tail",
    "fused_tail",
    "hooked",
    "norm_act",
    "plain",
    "tail_layer",
]

#: the classes a fused call stands for: PyTorch's own, or dnntune's module class in its place
#: (a subclass, such as a LoRA linear, a weight-standardized conv or timm's ``BatchNormAct2d``,
#: has a forward of its own, which a fused call would skip: it runs as it is written)
_CONVS = (nn.Conv2d, SWAPS[nn.Conv2d])
_LINEARS = (nn.Linear, SWAPS[nn.Linear])
_NORMS = (nn.BatchNorm2d, SWAPS[nn.BatchNorm2d])
_EXACT: dict[type[nn.Module], tuple[type[nn.Module], ...]] = {
    nn.Conv2d: _CONVS,
    nn.Linear: _LINEARS,
    nn.BatchNorm2d: _NORMS,
}


def plain(module: object, cls: type[nn.Module]) -> bool:
    """Whether ``module``'s class is exactly ``cls`` (``nn.Conv2d``, ``nn.Linear``,
    ``nn.BatchNorm2d``) or dnntune's module class for it: the only modules a fused call runs in
    place of their own forward."""
    return type(module) in _EXACT[cls]


def tail_layer(branch: nn.Module) -> nn.Module | None:
    """The layer a branch ends with, whose epilogue can take the residual add: a Conv2d, or a
    Sequential ending in Conv2d [+ BatchNorm2d], in Linear, or in such a Sequential
    (torchvision's MBConv block ends in a ``Conv2dNormActivation`` without an activation),
    then any modules that are the identity in eval mode (torchvision's MLP blocks end in
    ``Linear, Dropout``)."""
    if type(branch) in _CONVS:
        return branch
    if not _plain_sequential(branch):
        return None
    layers = list(branch)[: _end(branch)]
    if not layers:
        return None
    if isinstance(layers[-1], nn.Sequential):
        return tail_layer(layers[-1])
    if type(layers[-1]) in _NORMS:
        layers = layers[:-1]
        return layers[-1] if layers and type(layers[-1]) in _CONVS else None
    return layers[-1] if type(layers[-1]) in (*_CONVS, *_LINEARS) else None


def _end(seq: nn.Sequential) -> int:
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
    eval mode (a subclass may do anything in its own forward)."""
    cls = type(module)
    return cls in _EVAL_IDENTITIES or (cls.__module__, cls.__qualname__) in (
        _EVAL_IDENTITIES_ELSEWHERE
    )


def _skippable(between: nn.Module | None) -> bool:
    """Whether the eval-identity module a fused call stands for may be skipped now: in eval
    mode, with no hook of the user's."""
    return between is None or (not between.training and not hooked(between))


def _then(y: torch.Tensor, between: nn.Module | None) -> torch.Tensor:
    """``between(y)`` as the forward calls it (an unfused call), or ``y``."""
    return y if between is None else between(y)


def hooked(*modules: nn.Module | None) -> bool:
    """Whether one of ``modules`` has hooks of the user's, forward or backward
    (``register_full_backward_hook``, a Grad-CAM's or saliency tool's), or a global one is set:
    a fused call would skip them, so those modules run one by one, as PyTorch calls them.
    dnntune registers no hook of its own (``modules.ATTRIBUTED``)."""
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


def _now(activation: str | None, act_module: nn.Module | None) -> tuple[bool, str | None]:
    """Whether the call may run fused, and the activation it fuses: what ``act_module``
    computes now (a GELU's ``approximate`` can be set after ``optimize``, a child replaced),
    or, for a function the forward called (``act_module`` None), ``activation`` as traced.
    A module that no longer computes an activation dnntune fuses runs unfused."""
    if act_module is None:
        return True, activation
    now = activation_name(act_module)
    return now is not None, now


def _finish(y: torch.Tensor, activation: str | None, act_module: nn.Module | None) -> Any:
    """The activation after an unfused call: the module the forward called (its hooks run),
    else the function it called."""
    if act_module is not None:
        return act_module(y)
    return _pytorch_epilogue(y, None, activation)


def fused_tail(
    branch: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(between(branch(x)) + residual)`` for a Conv2d or Sequential branch, with
    its last layer (:func:`tail_layer`) running the add and activation as its fused epilogue
    in eval mode (else PyTorch's ops, unchanged). ``act_module``: the activation module the
    forward called (None: a function); ``between``: an eval-identity module the forward called
    on the branch's output (:func:`eval_identity`), run as it is outside eval mode."""
    ok, act = _now(activation, act_module)
    # the residual may be a number (``relu(conv(x) + shift)``, ``shift`` an argument of the
    # forward): no residual of a graph's, PyTorch's add takes it
    if (
        ok
        and isinstance(residual, torch.Tensor)
        and not branch.training
        and _skippable(between)
        and not hooked(act_module)
    ):
        out = _fused_branch(branch, x, residual, act)
        if out is not None:
            return out
    return _finish(_then(branch(x), between) + residual, activation, act_module)


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
    end = _end(branch)
    if not all(_skippable(m) for m in layers[end:]):
        return None
    if isinstance(layers[end - 1], nn.Sequential):
        y = _run_before(branch, layers, end - 1, x)
        return _fused_branch(layers[end - 1], y, residual, act)
    if type(layer) in _LINEARS:
        if hooked(layer):
            return None
        return fused(_run_before(branch, layers, end - 1, x), residual, act)
    # the branch's batch norm after its last conv, folded by the conv (given explicitly: the
    # conv itself keeps no state of the Sequential it sits in)
    at, bn = (end - 2, layers[end - 1]) if type(layers[end - 1]) in _NORMS else (end - 1, None)
    if hooked(layer, bn):
        return None
    return fused(_run_before(branch, layers, at, x), residual, act, bn)


def fused_linear_tail(
    layer: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(between(layer(x)) + residual)`` for a Linear child, the add (and
    activation) fused into its GEMM's epilogue in eval mode (else PyTorch's ops, unchanged)."""
    fused = getattr(layer, "fused_tail", None)
    ok, act = _now(activation, act_module)
    if (
        ok
        and fused is not None
        and isinstance(residual, torch.Tensor)
        and _skippable(between)
        and not hooked(layer, act_module)
    ):
        out = fused(x, residual, act)
        if out is not None:
            return out
    return _finish(_then(layer(x), between) + residual, activation, act_module)


def fused_conv_bn_tail(
    conv: nn.Module,
    bn: nn.Module | None,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(between(bn(conv(x))) + residual)`` for a conv and batch norm called one
    after the other (torchvision's blocks), fused like :func:`fused_tail` in eval mode."""
    fused = getattr(conv, "fused_tail", None)
    ok, act = _now(activation, act_module)
    if (
        ok
        and fused is not None
        and isinstance(residual, torch.Tensor)
        and not conv.training
        and (bn is None or not bn.training)
        and (bn is None or not norm_act_class(type(bn)) or norm_act(bn) == (True, None))
        and _skippable(between)
        and not hooked(conv, bn, act_module)
    ):
        out = fused(x, residual, act, bn)
        if out is not None:
            return out
    y = conv(x)
    if bn is not None:
        y = bn(y)
    return _finish(_then(y, between) + residual, activation, act_module)


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
    ok, act = _now(activation, act_module)
    if ok and fused is not None and not hooked(conv, bn, act_module):
        out = fused(x, bn, act)
        if out is not None:
            return out
    return _finish(bn(conv(x)), activation, act_module)


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
    ok, act = _now(activation, act_module)
    if ok and act is not None and fused is not None and not hooked(layer, act_module):
        out = fused(x, act)
        if out is not None:
            return out
    return _finish(layer(x), activation, act_module)


def fused_conv1d_activation(
    layer: nn.Module, x: torch.Tensor, activation: str, act_module: nn.Module | None = None
) -> torch.Tensor:
    """``activation(layer(x))`` for transformers' ``Conv1D`` child (GPT-2's ``c_fc`` before its
    GELU, written out in eight elementwise ops in eager): in eval mode one dnntune linear on
    the transposed weight with the activation as its epilogue, else the modules as PyTorch
    calls them (also where the layer is no longer exactly a ``Conv1D``, or has a hook)."""
    ok, act = _now(activation, act_module)
    if (
        ok
        and act is not None
        and not layer.training
        and conv1d_like(layer)
        and not hooked(layer, act_module)
        and not layer.__dict__.get(PYTORCH_FLAG)
    ):
        params = layer.__dict__["_parameters"]
        return dtf.linear(x, params["weight"].t(), params["bias"], activation=act)
    return _finish(layer(x), activation, act_module)


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
        if type(child) in _CONVS and type(nxt) in _NORMS:
            after = children[i + 2] if i + 2 < len(children) else None
            act = activation_name(after) if after is not None else None
            steps.append((_CONV_BN, child, nxt, after if act else None, act))
            fused.append(
                SequentialFusion(names[i], names[i + 1], names[i + 2] if act else None, act)
            )
            i += 3 if act else 2
            continue
        act = activation_name(nxt) if nxt is not None else None
        if (type(child) in _CONVS or type(child) in _LINEARS) and act is not None:
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


def _run_before(branch: nn.Module, layers: list[nn.Module], at: int, x: Any) -> Any:
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
    steps = _steps_of(self)
    if steps is None:
        return nn.Sequential.forward(self, input)  # its children changed since optimize()
    return _run_steps(steps, input)


def _run_steps(steps: tuple[Step, ...], input: Any) -> Any:
    for kind, layer, bn, act_module, act in steps:
        if kind == _PLAIN:
            input = layer(input)
            continue
        out = None
        ok, act = _now(act, act_module)
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
