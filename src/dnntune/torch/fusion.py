"""Fusion for ``optimize``: ``relu(conv_branch(x) + identity)`` as one conv graph, and
``act(linear_or_conv(x))`` as one graph.

A ResNet block ends with its last conv (and batch norm), an add of the shortcut and a ReLU. In
eager PyTorch those are three passes over the block's output; dnntune's conv graph takes the
residual and the activation as its epilogue (``dtt.conv2d(..., residual=, activation=)``), so
cuDNN runs them as one fused kernel.

Each submodule's own ``forward`` is traced with ``torch.fx`` (its children as leaves). Where the
trace shows ``act(add(branch(x), r))`` or ``add(branch(x), r)``, with ``branch`` a Conv2d or an
``nn.Sequential`` that ends in Conv2d (+ BatchNorm2d) and ``act`` a ReLU in any spelling
(``torch.relu``, ``F.relu``, ``nn.ReLU``, ``.relu()``, ``+=``/``add`` for the add), and no other
use of the intermediate values, the module's class is swapped for a subclass whose forward is
the rewritten trace. Modules that do not trace (data-dependent control flow) are left alone.

Where the trace shows ``bn(conv(x))`` or ``act(bn(conv(x)))`` with a Conv2d and a BatchNorm2d
child each used only there (torchvision's ``out = self.relu(self.bn1(self.conv1(x)))``), the
batch norm is folded into the conv's weights and the activation becomes its epilogue: one conv
instead of three passes (:func:`fused_conv_bn`).

Where the trace shows ``act(layer(x))`` with ``layer`` a Linear or Conv2d child used only there
(``F.silu(self.gate(h))``, ``F.gelu(self.fc1(x))``), the activation becomes the layer's
epilogue (:func:`fused_activation`).

The rewritten forward calls :func:`fused_tail`, which runs the fused conv in eval mode and the
original ops otherwise, so training and every fallback keep PyTorch's exact semantics.
Parameters, buffers and state_dict keys are untouched.
"""

from __future__ import annotations

import ast
import collections
import copy
import functools
import inspect
import logging
import operator
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from dnntune.torch._recorded import PLAIN_VALUES
from dnntune.torch.functional import TORCH_ACTIVATIONS
from dnntune.torch.modules import activation_name

__all__ = [
    "Fusion",
    "fuse_modules",
    "fused_activation",
    "fused_conv_bn",
    "fused_conv_bn_tail",
    "fused_linear_tail",
    "fused_tail",
    "OWN_HOOK",
    "fuse_sequential",
    "hooked",
]

_log = logging.getLogger(__name__)

_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
_RELU_FUNCTIONS = (torch.relu, F.relu, torch.relu_)


@dataclass
class Fusion:
    """One fused block: the module, the conv branch and the activation (None: add only)."""

    module: str
    branch: str
    activation: str | None
    residual: bool = True

    def __str__(self) -> str:
        add = " + residual add" if self.residual else ""
        act = f" + {self.activation}" if self.activation else ""
        return f"{self.module or '<root>'}: {self.branch}{add}{act}"


def _tail_conv(branch: nn.Module) -> nn.Conv2d | None:
    """The conv a branch ends with (Conv2d, or Sequential ending Conv2d [+ BatchNorm2d])."""
    if isinstance(branch, nn.Conv2d):
        return branch
    if not isinstance(branch, nn.Sequential) or len(branch) == 0:
        return None
    if type(branch).forward not in (nn.Sequential.forward, _sequential_forward):
        return None  # a Sequential subclass with a forward of its own: it runs as it is
    layers = list(branch)
    if isinstance(layers[-1], nn.BatchNorm2d):
        layers = layers[:-1]
    if layers and isinstance(layers[-1], nn.Conv2d):
        return layers[-1]
    return None


#: the attribute that marks a forward hook as dnntune's own (``optimize``'s attribution)
OWN_HOOK = "dnntune_own"


def hooked(*modules: nn.Module | None) -> bool:
    """Whether one of ``modules`` has forward hooks of the user's (or a global one is set): a
    fused call would skip them, so those modules run one by one, as PyTorch calls them.
    ``optimize``'s own attribution hooks (marked :data:`OWN_HOOK`) do not count."""
    if _GLOBAL_FORWARD_HOOKS and any(_GLOBAL_FORWARD_HOOKS):
        return True
    for m in modules:
        if m is None:
            continue
        attrs = m.__dict__
        for name in ("_forward_hooks", "_forward_pre_hooks"):
            hooks = attrs.get(name)
            if hooks and any(not getattr(h, OWN_HOOK, False) for h in hooks.values()):
                return True
    return False


#: PyTorch's global forward hooks and pre-hooks (``register_module_forward_hook``)
_GLOBAL_FORWARD_HOOKS = tuple(
    getattr(nn.modules.module, name)
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks")
    if isinstance(getattr(nn.modules.module, name, None), dict)
)


def _finish(y: torch.Tensor, activation: str | None, act_module: nn.Module | None) -> Any:
    """The activation after an unfused call: the module the forward called (its hooks run),
    else the function it called."""
    if act_module is not None:
        return act_module(y)
    return _epilogue(y, activation)


def fused_tail(
    branch: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor,
    activation: str | None,
    act_module: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(branch(x) + residual)`` for a Conv2d or Sequential branch, with its last
    conv running the add and activation as its fused epilogue in eval mode (else PyTorch's
    ops, unchanged). ``act_module``: the activation module the forward called (None: a
    function)."""
    conv = _tail_conv(branch)
    fused = getattr(conv, "fused_tail", None)
    if conv is not None and fused is not None and not branch.training:
        layers: list[nn.Module] = list(branch) if isinstance(branch, nn.Sequential) else [conv]
        at = layers.index(conv)
        # the branch's batch norm after its last conv, folded by the conv (given explicitly:
        # the conv itself keeps no state of the Sequential it sits in)
        bn = layers[at + 1] if at + 1 < len(layers) else None
        if not hooked(branch, conv, bn, act_module):
            y = _run_before(branch, layers, at, x)
            out = fused(y, residual, activation, bn)
            if out is not None:
                return out
    return _finish(branch(x) + residual, activation, act_module)


def fused_linear_tail(
    layer: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor,
    activation: str | None,
    act_module: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(layer(x) + residual)`` for a Linear child, the add (and activation) fused
    into its GEMM's epilogue in eval mode (else PyTorch's ops, unchanged)."""
    fused = getattr(layer, "fused_tail", None)
    if fused is not None and not hooked(layer, act_module):
        out = fused(x, residual, activation)
        if out is not None:
            return out
    return _finish(layer(x) + residual, activation, act_module)


def fused_conv_bn_tail(
    conv: nn.Module,
    bn: nn.Module | None,
    x: torch.Tensor,
    residual: torch.Tensor,
    activation: str | None,
    act_module: nn.Module | None = None,
) -> torch.Tensor:
    """``activation(bn(conv(x)) + residual)`` for a conv and batch norm called one after the
    other (torchvision's blocks), fused like :func:`fused_tail` in eval mode."""
    fused = getattr(conv, "fused_tail", None)
    if (
        fused is not None
        and not conv.training
        and (bn is None or not bn.training)
        and not hooked(conv, bn, act_module)
    ):
        out = fused(x, residual, activation, bn)
        if out is not None:
            return out
    y = conv(x)
    if bn is not None:
        y = bn(y)
    return _finish(y + residual, activation, act_module)


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
    if fused is not None and not hooked(conv, bn, act_module):
        out = fused(x, bn, activation)
        if out is not None:
            return out
    return _finish(bn(conv(x)), activation, act_module)


def fused_activation(
    layer: nn.Module, x: torch.Tensor, activation: str, act_module: nn.Module | None = None
) -> torch.Tensor:
    """``activation(layer(x))`` for a Linear or Conv2d child, the activation fused into the
    layer's graph in eval mode (else PyTorch's ops, unchanged)."""
    fused = getattr(layer, "fused_activation", None)
    if fused is not None and not hooked(layer, act_module):
        out = fused(x, activation)
        if out is not None:
            return out
    return _finish(layer(x), activation, act_module)


# ---- nn.Sequential ----------------------------------------------------------------------------
# A step of a fused Sequential: (kind, layer, batch norm, activation module, activation name).
_PLAIN, _CONV_BN, _ACT = 0, 1, 2
Step = tuple[int, nn.Module, "nn.Module | None", "nn.Module | None", "str | None"]


def fuse_sequential(seq: nn.Sequential) -> list[tuple[str, list[str]]]:
    """Fold each ``Conv2d, BatchNorm2d[, activation]`` run of ``seq``'s children into the conv,
    and each ``Linear|Conv2d, activation`` pair into the layer's graph, in ``seq``'s own
    forward: its class is swapped for one that calls the layer's fused method there (eval
    mode; each module's own ``training`` flag, padding mode and batch-norm statistics decide,
    and anything the fused call declines runs the children as PyTorch does). The children
    themselves are not changed, so a child also called elsewhere runs as it is there. A
    Sequential subclass with its own forward is left alone; children added, removed or
    replaced later make the forward run them all as PyTorch does.

    Returns: per fused layer, its child name and what was fused into it (for the report).
    """
    if type(seq).forward not in (nn.Sequential.forward, _sequential_forward):
        return []
    names = list(seq._modules)
    children = list(seq._modules.values())
    steps: list[Step] = []
    fused: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(children):
        child, nxt = children[i], children[i + 1] if i + 1 < len(children) else None
        if isinstance(child, nn.Conv2d) and isinstance(nxt, nn.BatchNorm2d):
            after = children[i + 2] if i + 2 < len(children) else None
            act = activation_name(after) if after is not None else None
            steps.append((_CONV_BN, child, nxt, after if act else None, act))
            what = [f"{names[i + 1]} (batchnorm, folded)"]
            if act:
                what.append(f"{names[i + 2]} ({act})")
            fused.append((names[i], what))
            i += 3 if act else 2
            continue
        act = activation_name(nxt) if nxt is not None else None
        if isinstance(child, nn.Conv2d | nn.Linear) and act is not None:
            steps.append((_ACT, child, None, nxt, act))
            fused.append((names[i], [f"{names[i + 1]} ({act})"]))
            i += 2
            continue
        steps.append((_PLAIN, child, None, None, None))
        i += 1
    if not fused:
        return []
    seq.__dict__["_dnntune_steps"] = (tuple(children), tuple(steps))
    if type(seq).forward is not _sequential_forward:
        cls = type(seq)
        seq.__class__ = type(
            cls.__name__,
            (cls,),
            {"forward": _sequential_forward, "__module__": cls.__module__},
        )
    return fused


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
        if hooked(layer, bn, act_module):
            pass  # a hook of the user's must see each module's own call
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


def _epilogue(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return TORCH_ACTIVATIONS[activation](y) if activation else y


class _ChildrenAsLeaves(fx.Tracer):
    """Trace only the root's own forward: every child module is one call."""

    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.root_module = root

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return m is not self.root_module


def _is_relu(node: fx.Node, module: nn.Module) -> bool:
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return len(node.args) == 1 and not node.kwargs.get("inplace", False)
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return len(node.args) == 1
    if node.op == "call_module":
        return isinstance(module.get_submodule(str(node.target)), nn.ReLU)
    return False


def _activation_of(node: fx.Node, module: nn.Module) -> str | None:
    """The dnntune activation ``node`` computes on its one tensor input, or None."""
    if node.op == "call_module":
        return activation_name(module.get_submodule(str(node.target)))
    if len(node.args) != 1:
        return None
    if node.op == "call_method":
        return {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}.get(str(node.target))
    if node.op != "call_function":
        return None
    if node.target is F.gelu:
        approximate = node.kwargs.get("approximate", "none")
        if set(node.kwargs) - {"approximate"} or approximate not in ("none", "tanh"):
            return None
        return "gelu_tanh" if approximate == "tanh" else "gelu"
    if set(node.kwargs) - {"inplace"}:
        return None
    target: Any = node.target
    return _ACTIVATION_FUNCTIONS.get(target)


_ACTIVATION_FUNCTIONS: dict[Any, str] = {
    torch.relu: "relu",
    F.relu: "relu",
    F.silu: "silu",
    torch.sigmoid: "sigmoid",
    torch.tanh: "tanh",
}


def _module_attr(graph: fx.Graph, node: fx.Node | None) -> fx.Node | None:
    """The module a ``call_module`` node calls, as a ``get_attr`` node (its hooks must still
    run when the fused call is declined), else None (a function or method)."""
    if node is None or node.op != "call_module":
        return None
    return graph.get_attr(str(node.target))


def _fuse_conv_bn(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str | None]]:
    """``bn(conv(x))`` (+ an activation) with a Conv2d and a BatchNorm2d child each used only
    there."""
    done: list[tuple[str, str | None]] = []
    for bn_node in list(graph.nodes):
        if bn_node.graph is not graph or not _module_call(bn_node, module, nn.BatchNorm2d):
            continue
        conv_node = bn_node.args[0]
        if not _module_call(conv_node, module, nn.Conv2d):
            continue
        user = next(iter(bn_node.users))
        activation = None
        if len(user.args) == 1 and user.args[0] is bn_node and not user.kwargs.keys() - {"inplace"}:
            activation = _activation_of(user, module)
        last = user if activation is not None else bn_node
        with graph.inserting_before(last):
            conv_attr = graph.get_attr(str(conv_node.target))
            bn_attr = graph.get_attr(str(bn_node.target))
            act_module = _module_attr(graph, user if activation is not None else None)
            fused = graph.call_function(
                fused_conv_bn, (conv_attr, bn_attr, conv_node.args[0], activation, act_module)
            )
        last.replace_all_uses_with(fused)
        for node in (user if activation is not None else None, bn_node, conv_node):
            if node is not None:
                graph.erase_node(node)
        done.append((f"{conv_node.target} + {bn_node.target}", activation))
    return done


def _fuse_activations(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str]]:
    """``act(layer(x))`` with ``layer`` a Linear or Conv2d child used only there."""
    done: list[tuple[str, str]] = []
    for act_node in list(graph.nodes):
        if act_node.op not in ("call_function", "call_method", "call_module"):
            continue
        if not act_node.args:
            continue
        layer = act_node.args[0]
        if not _module_call(layer, module, nn.Module):
            continue
        if not isinstance(module.get_submodule(str(layer.target)), nn.Linear | nn.Conv2d):
            continue
        activation = _activation_of(act_node, module)
        if activation is None:
            continue
        with graph.inserting_before(act_node):
            target = graph.get_attr(str(layer.target))
            act_module = _module_attr(graph, act_node)
            fused = graph.call_function(
                fused_activation, (target, layer.args[0], activation, act_module)
            )
        act_node.replace_all_uses_with(fused)
        graph.erase_node(act_node)
        graph.erase_node(layer)
        done.append((str(layer.target), activation))
    return done


def _is_add(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in _ADD_FUNCTIONS:
        return len(node.args) == 2 and not node.kwargs
    if node.op == "call_method" and node.target in ("add", "add_"):
        return len(node.args) == 2 and not node.kwargs
    return False


def _module_call(node: Any, module: nn.Module, kind: type[nn.Module]) -> bool:
    """``node`` is a one-input call of a ``kind`` child, used once."""
    return (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and len(node.users) == 1
        and len(node.args) == 1
        and not node.kwargs
        and isinstance(node.args[0], fx.Node)
        and isinstance(module.get_submodule(str(node.target)), kind)
    )


@dataclass
class _Branch:
    """The nodes a fused call replaces, ending in the value added to the residual."""

    nodes: list[fx.Node]  # first to last
    make: Callable[..., Any]
    targets: list[str]

    @property
    def input(self) -> fx.Node:
        value = self.nodes[0].args[0]
        assert isinstance(value, fx.Node)
        return value


def _branch_of(node: Any, module: nn.Module) -> _Branch | None:
    """The conv branch ``node`` is the end of: a Conv2d or Sequential child ending in a conv
    (+ batch norm), or a Conv2d child followed by a BatchNorm2d child."""
    if _module_call(node, module, nn.Module) and _tail_conv(module.get_submodule(str(node.target))):
        return _Branch([node], fused_tail, [str(node.target)])
    if _module_call(node, module, nn.Linear):
        return _Branch([node], fused_linear_tail, [str(node.target)])
    if _module_call(node, module, nn.BatchNorm2d):
        conv = node.args[0]
        if _module_call(conv, module, nn.Conv2d):
            return _Branch([conv, node], fused_conv_bn_tail, [str(conv.target), str(node.target)])
    return None


def _rewrite(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str | None]]:
    done: list[tuple[str, str | None]] = []
    for add in list(graph.nodes):
        if add.graph is not graph or not _is_add(add):
            continue
        a, b = add.args
        branch, residual = _branch_of(a, module), b
        if branch is None:
            branch, residual = _branch_of(b, module), a
        if branch is None or not isinstance(residual, fx.Node) or residual in branch.nodes:
            continue
        users = list(add.users)
        relu = users[0] if len(users) == 1 and _is_relu(users[0], module) else None
        last = relu if relu is not None else add
        activation = "relu" if relu is not None else None
        with graph.inserting_before(last):
            attrs = [graph.get_attr(t) for t in branch.targets]
            act_module = _module_attr(graph, relu)
            fused = graph.call_function(
                branch.make, (*attrs, branch.input, residual, activation, act_module)
            )
        last.replace_all_uses_with(fused)
        for node in (relu, add, *reversed(branch.nodes)):
            if node is not None:
                graph.erase_node(node)
        done.append((" + ".join(branch.targets), activation))
    return done


def _install(module: nn.Module, forward: Callable[..., Any]) -> None:
    """Give ``module`` the rewritten ``forward``, behind a :class:`TraceGuard`: a call it does
    not hold for runs the module's own forward."""
    cls = type(module)
    original = cls.forward

    def guarded(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        guard = self.__dict__.get(TRACE_GUARD)
        if guard is not None and guard.holds(self, args, kwargs):
            return forward(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    fused = type(
        cls.__name__,
        (cls,),
        {"forward": guarded, "_dnntune_residual_fused": True, "__module__": cls.__module__},
    )
    module.__dict__[TRACE_GUARD] = TraceGuard(module)
    module.__class__ = fused


#: what every module keeps in its ``__dict__`` (registries, hook flags, ``training``: the trace
#: held in both modes), which no forward reads as a setting of its own
_MODULE_OWN = frozenset(nn.Module().__dict__)
#: where a rewritten module keeps its :class:`TraceGuard`
TRACE_GUARD = "_dnntune_trace_guard"
#: argument types a trace reads as values (a proxy stands for them): anything else (None, a
#: tuple or list, an object) may have taken another branch of Python code than the trace did
_TRACED_ARGS = (torch.Tensor, int, float, bool)


class TraceGuard:
    """When a rewritten forward computes what the module's own forward would: a trace freezes
    the Python the forward ran, so it holds only while the module's own plain attributes
    (``self.scaling``, ``self.disable_adapter``, a function kept as ``self.act``) have the
    values they had at the trace, and only for arguments the trace stood for (tensors and
    numbers: an ``isinstance(x, tuple)`` branch was taken for a tensor)."""

    __slots__ = ("keys", "values")

    def __init__(self, module: nn.Module) -> None:
        attrs = module.__dict__
        self.keys = tuple(
            key
            for key, value in attrs.items()
            if key not in _MODULE_OWN
            and not key.startswith("_dnntune")
            and isinstance(value, PLAIN_VALUES)
        )
        self.values = tuple(attrs[k] for k in self.keys)

    def holds(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        for a in args:
            if not isinstance(a, _TRACED_ARGS):
                return False
        if kwargs and not all(isinstance(a, _TRACED_ARGS) for a in kwargs.values()):
            return False
        return tuple(map(module.__dict__.get, self.keys)) == self.values


def _not_traceable(module: nn.Module) -> str | None:
    """Why a trace of ``module.forward`` could silently specialise, or None.

    A trace turns ``if mask is not None:`` into the branch taken for a traced argument (a Proxy
    is never None), so a later call with ``mask=None`` would run the wrong code: forwards with
    a parameter that defaults to None, or with ``*args``/``**kwargs``, are not rewritten.
    """
    try:
        signature = inspect.signature(type(module).forward)
    except (TypeError, ValueError):
        return "its forward has no inspectable signature"
    why = _untraced_statements(type(module).forward)
    if why is not None:
        return why
    for p in list(signature.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return f"its forward takes {p}"
        if p.default is None:
            return f"its forward's {p.name} defaults to None"
    return None


@functools.lru_cache(maxsize=256)
def _untraced_statements(forward: Callable[..., Any]) -> str | None:
    """Why ``forward``'s source holds Python a trace would drop, or None: a ``with`` block
    (``torch.no_grad()``, ``torch.autocast``: a trace records the ops, not the mode they ran
    in) or a decorator (``@torch.no_grad()``). A forward whose source cannot be read is not
    rewritten either."""
    try:
        source = textwrap.dedent(inspect.getsource(forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return "its forward's source cannot be read"
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            return "its forward has a with-statement (a trace drops the mode it sets)"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list:
            return "its forward is decorated (a trace drops what the decorator does)"
    return None


def _trace_in_both_modes(module: nn.Module) -> fx.Graph | None:
    """The trace of ``module``'s own forward, or None when it differs between training and
    eval mode (Python code that branches on ``self.training`` would be frozen in one mode)."""
    modes = {m: m.training for m in module.modules()}
    # a forward that sets attributes (``self.cache = torch.cat(...)``) or fills a list or dict
    # of its modules (``self.kv.append(k)``) would keep the trace's proxies there: all of it is
    # put back after each trace, and such a forward is not fused
    state = _PythonState(list(modes))
    codes = []
    graphs = []
    changed = False
    try:
        for training in (True, False):
            for m in modes:  # the flag alone: a custom train() may do more than set it
                m.training = training
            try:
                graph = _ChildrenAsLeaves(module).trace(module)
            finally:
                changed = state.put_back() or changed
            codes.append(graph.python_code("self").src)
            graphs.append(graph)
    finally:
        for m, training in modes.items():
            m.training = training
    if changed:
        raise ValueError("its forward changes attributes, lists or dicts of its modules")
    if codes[0] != codes[1]:
        return None
    return graphs[1]


_CONTAINERS = (list, dict, set, collections.deque)


class _PythonState:
    """What a forward can change in its modules' Python state: their attribute, parameter and
    buffer dicts, and the lists, dicts, sets and deques they hold (by what they hold)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.slots = [(slots, dict(slots)) for m in modules for slots in _slots(m)]
        self.boxes = [
            (box, copy.copy(box))
            for m in modules
            for key, box in m.__dict__.items()
            if isinstance(box, _CONTAINERS) and not key.startswith("_")
        ]

    def put_back(self) -> bool:
        """Restore what changed; True if anything had."""
        changed = False
        for slots, before in self.slots:
            # each module's training flag is the trace's own doing (set per mode, put back)
            if slots.keys() != before.keys() or any(
                slots[k] is not v for k, v in before.items() if k != "training"
            ):
                changed = True
                training = slots.get("training")
                slots.clear()
                slots.update(before)
                if training is not None:
                    slots["training"] = training
        for box, held in self.boxes:
            if _held(box) != _held(held):
                changed = True
                if isinstance(box, list):
                    box[:] = held
                    continue
                box.clear()
                if isinstance(box, collections.deque):
                    box.extend(held)
                else:  # a dict or a set
                    box.update(held)
        return changed


def _held(box: Any) -> tuple[int, ...]:
    """What a container holds, by identity (keys and values for a dict)."""
    if isinstance(box, dict):
        return (*map(id, box), *map(id, box.values()))
    return tuple(map(id, box))


def _slots(module: nn.Module) -> tuple[dict[str, Any], ...]:
    """The dicts a forward can set a module's state in: attributes, parameters, buffers."""
    return (module.__dict__, module._parameters, module._buffers)


def fuse_modules(
    root: nn.Module, retarget: Mapping[Any, Callable[..., Any]] | None = None
) -> list[Fusion]:
    """Rewrite every submodule of ``root`` (and ``root``) whose forward ends a conv branch with
    a residual add (+ ReLU); call before the layers are swapped for dnntune's."""
    fusions: list[Fusion] = []
    for name, module in list(root.named_modules()):
        if isinstance(module, nn.Sequential) or not list(module.children()):
            continue
        if getattr(type(module), "_dnntune_residual_fused", False):
            continue
        why = _not_traceable(module)
        if why is not None:
            _log.debug("dnntune.torch: %s not fused: %s", name or "<root>", why)
            continue
        try:
            graph = _trace_in_both_modes(module)
        except Exception as exc:  # data-dependent control flow, unsupported Python, ...
            _log.debug("dnntune.torch: %s does not trace (%s); not fused", name or "<root>", exc)
            continue
        if graph is None:
            _log.debug("dnntune.torch: %s branches on self.training; not fused", name or "<root>")
            continue
        try:
            found = [Fusion(name, branch, act) for branch, act in _rewrite(graph, module)]
            found += [
                Fusion(name, layers, act, residual=False)
                for layers, act in _fuse_conv_bn(graph, module)
            ]
            found += [
                Fusion(name, layer, act, residual=False)
                for layer, act in _fuse_activations(graph, module)
            ]
            if not found:
                continue
            # the trace recorded the functions it saw; calls that optimize() routes to
            # dnntune (F.scaled_dot_product_attention, pooling) must keep going through the
            # router in the rewritten forward
            for node in graph.nodes:
                if node.op == "call_function" and retarget and node.target in retarget:
                    node.target = retarget[node.target]
            graph.lint()
            traced = fx.GraphModule(module, graph)
        except Exception as exc:  # a shape of graph this rewrite did not foresee: leave it
            _log.warning("dnntune.torch: residual fusion of %s failed (%s); not fused", name, exc)
            continue
        _install(module, type(traced).forward)
        fusions.extend(found)
    return fusions
