"""Fusion for ``optimize``: ``relu(conv_branch(x) + identity)`` as one conv graph, and
``act(linear_or_conv(x))`` as one graph.

A ResNet block ends with its last conv (and batch norm), an add of the shortcut and a ReLU. In
eager PyTorch those are three passes over the block's output; dnntune's conv graph takes the
residual and the activation as its epilogue (``dtt.conv2d(..., residual=, activation=)``), so
cuDNN runs them as one fused kernel.

Each submodule's own ``forward`` is traced with ``torch.fx`` (its children as leaves). Where the
trace shows ``act(add(branch(x), r))`` or ``add(branch(x), r)``, with ``branch`` a Conv2d, a
Linear or an ``nn.Sequential`` that ends in Conv2d (+ BatchNorm2d), in Linear or in such a
Sequential (:func:`tail_layer`), ``act`` a ReLU in any spelling (``torch.relu``, ``F.relu``,
``nn.ReLU``, ``.relu()``, ``+=``/``add`` for the add), and no other use of the intermediate
values, the module's class is swapped for a subclass whose forward is the rewritten trace. A
module that is the identity in eval mode (dropout, stochastic depth: :func:`eval_identity`)
may sit between the branch and the add; the fused call skips it in eval mode and runs it
otherwise. Modules that do not trace (data-dependent control flow) are left alone.

The branch may also be a child module of any class whose own forward ends in a Linear
(timm's ``Mlp`` and ``Attention``): the fused call runs that child's forward up to the Linear's
input, then the Linear with the add as its epilogue (:mod:`._module_tails`). Several
eval-identity modules may sit between the branch and the add (timm's ``ls2`` and
``drop_path2``). A forward whose parameters default to None is traced with them None, and
runs rewritten only for calls that leave them None (:func:`._tracing.none_parameters`).

Only children of exactly PyTorch's classes (``nn.Conv2d``, ``nn.Linear``, ``nn.BatchNorm2d``,
or dnntune's in their place) are fused: a subclass (a LoRA linear, a weight-standardized conv,
timm's ``BatchNormAct2d``) has a forward of its own, which a fused call would skip. An add
written in place (``x += y``, ``x.add_(y)``) is fused only where it writes the branch's own
output (``out = bn(conv(x)); out += identity``): written into the residual
(``x += self.fc(x)``), the write is seen by every other reference to that tensor (the caller's
too), which a fused call, with an output of its own, would not make. Nor is a layer's call moved
past an op that writes in place (it could write the layer's input).

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

This module decides where fused calls go (the trace's patterns and their rewrite); what those
calls run is in ``_fused_calls.py``, a fused ``nn.Sequential``'s forward in
``_fused_sequential.py``, what both share in ``_fused_parts.py``; how a forward is traced
without being fooled by it, and the guard on the rewritten forward, in
``_tracing.py``; what a node of the trace is (an activation, an add, a child's call, a write
in place), in ``_fx_nodes.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from dnntune.torch._fused_calls import (
    fused_activation,
    fused_conv_bn,
    fused_conv_bn_tail,
    fused_conv_norm_act,
    fused_linear_tail,
    fused_product,
    fused_tail,
    norm_act,
)
from dnntune.torch._fused_parts import eval_identity, hooked, plain
from dnntune.torch._fused_sequential import SequentialFusion, fuse_sequential, tail_layer
from dnntune.torch._fx_nodes import (
    child_call,
    in_place_add,
    is_add,
    is_mul,
    is_relu,
    module_attr,
    module_call,
    node_activation,
    number_argument,
    retarget_calls,
    written_between,
)
from dnntune.torch._module_tails import Tails, fused_module_tail
from dnntune.torch._output_tails import fuse_output_tails
from dnntune.torch._swap_classes import conv1d_layer
from dnntune.torch._timm import norm_act_class
from dnntune.torch._trace_guard import install

__all__ = [
    "Fusion",
    "SequentialFusion",
    "fuse_modules",
    "fuse_sequential",
    "fused_activation",
    "fused_conv_bn",
    "fused_conv_bn_tail",
    "fused_linear_tail",
    "fused_tail",
    "hooked",
    "plain",
]

_log = logging.getLogger(__name__)

#: the class attribute of a rewritten module's class that holds what it fuses (branch,
#: activation, residual add), for the report of a later optimize()
_FUSIONS = "_dnntune_fusions"


@dataclass
class Fusion:
    """One fused block: the module, the conv branch and the activation (None: add only)."""

    module: str
    branch: str
    activation: str | None
    residual: bool = True
    #: the modules between the branch and the add that are the identity in eval mode
    #: (dropout, stochastic depth), skipped by the fused call there (" + "-joined)
    between: str | None = None
    #: the branch's output multiplied by another value of the forward (a gated MLP's up
    #: projection times its activated gate), no add
    multiply: bool = False

    def __str__(self) -> str:
        skipped = f" + {self.between} (identity in eval)" if self.between else ""
        add = " + residual add" if self.residual else ""
        act = f" + {self.activation}" if self.activation else ""
        mul = " + multiply" if self.multiply else ""
        return f"{self.module or '<root>'}: {self.branch}{skipped}{add}{act}{mul}"


def _fuse_conv_bn(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str | None]]:
    """``bn(conv(x))`` (+ an activation) with a Conv2d and a BatchNorm2d child each used only
    there."""
    done: list[tuple[str, str | None]] = []
    for bn_node in list(graph.nodes):
        if bn_node.graph is not graph or not module_call(bn_node, module, nn.BatchNorm2d):
            continue
        conv_node = bn_node.args[0]
        if not module_call(conv_node, module, nn.Conv2d):
            continue
        user = next(iter(bn_node.users))
        activation = None
        if len(user.args) == 1 and user.args[0] is bn_node and not user.kwargs.keys() - {"inplace"}:
            activation = node_activation(user, module)
        last = user if activation is not None else bn_node
        if written_between(conv_node, last, module):
            continue
        with graph.inserting_before(last):
            conv_attr = graph.get_attr(str(conv_node.target))
            bn_attr = graph.get_attr(str(bn_node.target))
            act_module = module_attr(graph, user if activation is not None else None)
            fused = graph.call_function(
                fused_conv_bn, (conv_attr, bn_attr, conv_node.args[0], activation, act_module)
            )
        last.replace_all_uses_with(fused)
        for node in (user if activation is not None else None, bn_node, conv_node):
            if node is not None:
                graph.erase_node(node)
        done.append((f"{conv_node.target} + {bn_node.target}", activation))
    return done


def _fuse_conv_norm_act(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str | None]]:
    """``bn(conv(x))`` with a Conv2d child used only there and ``bn`` timm's
    ``BatchNormAct2d`` (its batch norm, dropout and activation in one module): the activation
    reported is the one it computes now."""
    done: list[tuple[str, str | None]] = []
    for bn_node in list(graph.nodes):
        if bn_node.op != "call_module" or len(bn_node.args) != 1 or bn_node.kwargs:
            continue
        bn = module.get_submodule(str(bn_node.target))
        conv_node = bn_node.args[0]
        if not norm_act_class(type(bn)) or not module_call(conv_node, module, nn.Conv2d):
            continue
        ok, activation = norm_act(bn)
        if not ok:  # an activation dnntune does not fuse (LeakyReLU): the modules as they are
            continue
        if written_between(conv_node, bn_node, module):
            continue
        with graph.inserting_before(bn_node):
            conv_attr = graph.get_attr(str(conv_node.target))
            bn_attr = graph.get_attr(str(bn_node.target))
            fused = graph.call_function(
                fused_conv_norm_act, (conv_attr, bn_attr, conv_node.args[0])
            )
        bn_node.replace_all_uses_with(fused)
        graph.erase_node(bn_node)
        graph.erase_node(conv_node)
        done.append((f"{conv_node.target} + {bn_node.target}", activation))
    return done


def _fuse_activations(graph: fx.Graph, module: nn.Module) -> list[tuple[str, str]]:
    """``act(layer(x))`` with ``layer`` a Linear or Conv2d child (or transformers' ``Conv1D``) used
    only there."""
    done: list[tuple[str, str]] = []
    for act_node in list(graph.nodes):
        if act_node.op not in ("call_function", "call_method", "call_module"):
            continue
        if not act_node.args:
            continue
        layer = act_node.args[0]
        child = child_call(layer, module)
        if not (
            module_call(layer, module, nn.Linear)
            or module_call(layer, module, nn.Conv2d)
            or (child is not None and conv1d_layer(child))  # GPT-2's: weight transposed
        ):
            continue
        activation = node_activation(act_node, module)
        if activation is None or written_between(layer, act_node, module):
            continue
        with graph.inserting_before(act_node):
            target = graph.get_attr(str(layer.target))
            act_module = module_attr(graph, act_node)
            fused = graph.call_function(
                fused_activation, (target, layer.args[0], activation, act_module)
            )
        act_node.replace_all_uses_with(fused)
        graph.erase_node(act_node)
        graph.erase_node(layer)
        done.append((str(layer.target), activation))
    return done


def _product_operands(mul: fx.Node, module: nn.Module) -> tuple[fx.Node, fx.Node, bool] | None:
    """(the Linear child's call, the other operand, whether the call is the left operand) of a
    multiply with a plain one-input call of a Linear child on one side (the right one first)
    and another value of the trace on the other; else None."""
    a, b = mul.args
    for layer, other, layer_first in ((b, a, False), (a, b, True)):
        if (
            isinstance(layer, fx.Node)
            and module_call(layer, module, nn.Linear)
            and isinstance(other, fx.Node)
            and other is not layer
            and not number_argument(other)
            and len(layer.args) == 1
            and not layer.kwargs
        ):
            return layer, other, layer_first
    return None


def _fuse_products(graph: fx.Graph, module: nn.Module) -> list[str]:
    """``other * layer(x)`` (or ``layer(x) * other``) with ``layer`` a Linear child used only
    there and ``other`` another value of the trace: the multiply as the layer's epilogue (a
    gated MLP's ``act(gate(x)) * up(x)``, after :func:`_fuse_activations`)."""
    done: list[str] = []
    for mul in list(graph.nodes):
        if mul.graph is not graph or not is_mul(mul):
            continue
        operands = _product_operands(mul, module)
        if operands is None:
            continue
        layer, other, layer_first = operands
        if written_between(layer, mul, module):
            continue
        with graph.inserting_before(mul):
            target = graph.get_attr(str(layer.target))
            extra = {"layer_first": True} if layer_first else {}
            fused = graph.call_function(fused_product, (target, layer.args[0], other), extra)
        mul.replace_all_uses_with(fused)
        graph.erase_node(mul)
        graph.erase_node(layer)
        done.append(str(layer.target))
    return done


@dataclass
class _Branch:
    """The nodes a fused call replaces, ending in the value added to the residual."""

    nodes: list[fx.Node]  # first to last
    make: Callable[..., Any]
    targets: list[str]
    #: the eval-identity modules called on the branch's output before the add (targets)
    between: tuple[str, ...] = ()
    #: the keyword arguments of the branch's call (a child module's: ``attn_mask=None``)
    kwargs: dict[str, Any] | None = None

    @property
    def input(self) -> fx.Node:
        value = self.nodes[0].args[0]
        assert isinstance(value, fx.Node)
        return value


def _branch_of(node: Any, module: nn.Module, tails: Tails) -> _Branch | None:
    """The branch ``node`` is the end of (:func:`_end_of_branch`), or such a branch's output
    passed through modules that are the identity in eval mode (dropout, stochastic depth,
    timm's ``ls2`` and ``drop_path2`` when they are ``nn.Identity``: :func:`eval_identity`)."""
    child = child_call(node, module)
    if child is not None and eval_identity(child):
        branch = _branch_of(node.args[0], module, tails)
        if branch is None:
            return None
        branch.nodes.append(node)
        branch.between += (str(node.target),)
        return branch
    return _end_of_branch(node, module, tails)


def _end_of_branch(node: Any, module: nn.Module, tails: Tails) -> _Branch | None:
    """The branch ``node`` is the end of: a Conv2d, or a Sequential child whose last layer can
    take the add (:func:`tail_layer`); a Linear child; a Conv2d child followed by a BatchNorm2d
    child (or timm's ``BatchNormAct2d`` without an activation); a child module whose own
    forward ends in a Linear (timm's ``Mlp`` and ``Attention``: :mod:`._module_tails`)."""
    call = _module_tail_call(node, module, tails)
    if call is not None:
        return _Branch([node], fused_module_tail, [str(node.target)], kwargs=dict(node.kwargs))
    child = child_call(node, module)
    # a Sequential (its own forward checked there) or exactly a Conv2d
    if child is not None and tail_layer(child) is not None:
        return _Branch([node], fused_tail, [str(node.target)])
    if module_call(node, module, nn.Linear):
        return _Branch([node], fused_linear_tail, [str(node.target)])
    if module_call(node, module, nn.BatchNorm2d) or _plain_norm_call(node, module):
        conv = node.args[0]
        if module_call(conv, module, nn.Conv2d):
            return _Branch([conv, node], fused_conv_bn_tail, [str(conv.target), str(node.target)])
    return None


def _module_tail_call(node: Any, module: nn.Module, tails: Tails) -> nn.Module | None:
    """The child ``node`` calls, if it is none of the layers the other branches take, its
    output is used once, its one positional argument is a value of the trace (keywords may
    follow), and its own forward ends in a Linear."""
    if not (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and len(node.users) == 1
        and len(node.args) == 1
        and isinstance(node.args[0], fx.Node)
    ):
        return None
    child = module.get_submodule(str(node.target))
    if isinstance(child, nn.Sequential) or not list(child.children()):
        return None
    return child if tails.ends_in_linear(child) else None


def _plain_norm_call(node: Any, module: nn.Module) -> bool:
    """``node`` is a one-input call, used once, of timm's ``BatchNormAct2d`` without an
    activation (``apply_act=False``: the batch norm before a residual add in timm's blocks)."""
    child = child_call(node, module)
    return child is not None and norm_act_class(type(child)) and norm_act(child) == (True, None)


def _rewrite(
    graph: fx.Graph, module: nn.Module, tails: Tails
) -> list[tuple[str, str | None, str | None]]:
    """Each residual add of a branch (+ ReLU) as one fused call: (the branch's layers, the
    activation, the eval-identity module skipped)."""
    done: list[tuple[str, str | None, str | None]] = []
    for add in list(graph.nodes):
        if add.graph is not graph or not is_add(add):
            continue
        a, b = add.args
        branch, residual = _branch_of(a, module, tails), b
        if branch is None and not in_place_add(add):
            # an add written in place writes its left operand: the residual there (``x +=
            # self.fc(x)``), whose other references would see the write a fused call would not
            # make; the branch's own output, used only by the add, may be written
            branch, residual = _branch_of(b, module, tails), a
        if branch is None or not isinstance(residual, fx.Node) or residual in branch.nodes:
            continue
        if number_argument(residual):
            continue
        users = list(add.users)
        relu = users[0] if len(users) == 1 and is_relu(users[0], module) else None
        last = relu if relu is not None else add
        if written_between(branch.nodes[0], last, module, (*branch.nodes, add)):
            continue
        activation = "relu" if relu is not None else None
        with graph.inserting_before(last):
            attrs = [graph.get_attr(t) for t in branch.targets]
            act_module = module_attr(graph, relu)
            extra: dict[str, Any] = {}
            if branch.between:
                extra["between"] = tuple(graph.get_attr(t) for t in branch.between)
            if branch.kwargs:
                extra["kwargs"] = branch.kwargs
            if residual is a:
                extra["residual_first"] = True
            fused = graph.call_function(
                branch.make, (*attrs, branch.input, residual, activation, act_module), extra
            )
        last.replace_all_uses_with(fused)
        for node in (relu, add, *reversed(branch.nodes)):
            if node is not None:
                graph.erase_node(node)
        between = " + ".join(branch.between) or None
        done.append((" + ".join(branch.targets), activation, between))
    return done


def fuse_modules(
    root: nn.Module, retarget: Mapping[Any, Callable[..., Any]] | None = None
) -> list[Fusion]:
    """Rewrite every submodule of ``root`` (and ``root``) whose forward ends a conv branch with
    a residual add (+ ReLU); call before the layers are swapped for dnntune's."""
    fusions: list[Fusion] = []
    tails = Tails()
    for name, module in list(root.named_modules()):
        if isinstance(module, nn.Sequential) or not list(module.children()):
            continue
        if getattr(type(module), "_dnntune_residual_fused", False):
            # rewritten by an earlier optimize(): its fusions still run, and are reported
            done = getattr(type(module), _FUSIONS, ())
            fusions.extend(_running(module, [Fusion(name, *f) for f in done]))
            continue
        traced = tails.trace(module, name)
        if traced is None:
            continue
        trace, nones = traced
        graph = trace.graph
        try:
            found = _fusions_in(graph, module, name, tails)
            if found:
                retarget_calls(graph, retarget)
                graph.lint()
                rewritten = fx.GraphModule(module, graph)
        except Exception as exc:  # a shape of graph this rewrite did not foresee: leave it
            _log.warning("dnntune.torch: residual fusion of %s failed (%s); not fused", name, exc)
            continue
        tails.final[module] = (graph, trace.eval_only, nones)
        if not found:
            continue
        done = tuple((f.branch, f.activation, f.residual, f.between, f.multiply) for f in found)
        install(module, type(rewritten).forward, {_FUSIONS: done}, trace.eval_only, nones)
        fusions.extend(_running(module, found))
    tails.cut(retarget)
    return fusions


def _fusions_in(graph: fx.Graph, module: nn.Module, name: str, tails: Tails) -> list[Fusion]:
    """Every pattern of ``module``'s trace ``graph`` rewritten as its fused call."""
    found = [
        Fusion(name, branch, act, between=between)
        for branch, act, between in _rewrite(graph, module, tails)
    ]
    found += [Fusion(name, child, None) for child in fuse_output_tails(graph, module)]
    found += [
        Fusion(name, layers, act, residual=False) for layers, act in _fuse_conv_bn(graph, module)
    ]
    found += [
        Fusion(name, layers, act, residual=False)
        for layers, act in _fuse_conv_norm_act(graph, module)
    ]
    found += [
        Fusion(name, layer, act, residual=False) for layer, act in _fuse_activations(graph, module)
    ]
    found += [
        Fusion(name, layer, None, residual=False, multiply=True)
        for layer in _fuse_products(graph, module)
    ]
    return found


def _running(module: nn.Module, fusions: list[Fusion]) -> list[Fusion]:
    """The fusions of ``module`` that run now: while one of a fusion's layers has a hook of
    the user's, the fused call runs its modules one by one (:func:`hooked`), so the report does
    not list it (new-user audit: a conv with a feature-extraction hook was reported fused, its
    batch norm both folded and on its own plan). The fusion stays installed and runs once the
    hook is removed; an activation module's hook is not seen here (the fusion names it by the
    activation it computes)."""
    out = []
    for f in fusions:
        names = [*f.branch.split(" + "), *(f.between.split(" + ") if f.between else [])]
        try:
            layers = [module.get_submodule(n) for n in names]
        except AttributeError:
            layers = []
        if not hooked(*layers):
            out.append(f)
    return out
