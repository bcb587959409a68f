"""A child module whose forward ends in a Linear as the branch of its parent's residual add.

timm's ViT block adds its attention's and its MLP's output to the residual stream
(``x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))``), and both children end in a
Linear (``Mlp``: ``fc2``, then a dropout; ``Attention``: ``proj``, then a dropout). The add can
be the epilogue of that last GEMM, as for a Linear child of the block itself; what comes before
it is the child's own forward, up to the Linear's input (its *head*).

The head is the child's own trace (children as leaves), the rewritten one where the child was
fused too (its ``fc1 + gelu``), cut at the Linear's input. It holds under the same conditions
as any rewritten forward (:class:`~dnntune.torch._trace_guard.TraceGuard`), and while the child is
still of the class it was traced as, has no forward set on the instance, no hook of the user's
and runs in eval mode: otherwise the child's own forward runs and PyTorch adds the residual.
Used by :mod:`dnntune.torch.fusion`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import fx, nn

from dnntune.torch._fused_parts import (
    LINEARS,
    activation_now,
    eval_identity,
    finish,
    hooked,
    plus,
    skippable,
    then,
)
from dnntune.torch._fx_nodes import drop_eval_dropouts, retarget_calls, writes_in_place
from dnntune.torch._subclass import StandIn, shared_stand_in
from dnntune.torch._swap_classes import conv1d_layer
from dnntune.torch._trace_guard import TraceGuard, with_passed_kwargs
from dnntune.torch._tracing import Nones, Traced, traced_for_rewrite

__all__ = ["TAIL", "ModuleTail", "Tails", "fused_module_tail", "set_tail", "tail_layer_of"]

#: where a child module keeps its :class:`ModuleTail`
TAIL = "_dnntune_tail"
#: the class attribute marking the stand-in class of a child that keeps a tail and nothing else
_HOLDER = "_dnntune_tail_holder"


class ModuleTail(NamedTuple):
    """What a fused call runs of a child module: ``head(child, x, **kwargs)`` computes the input
    of its last Linear (``layer``), after which only the eval-identity children ``after`` run."""

    head: Callable[..., Any]
    layer: str
    after: tuple[str, ...]
    cls: type
    guard: TraceGuard


def tail_layer_of(graph: fx.Graph, module: nn.Module) -> tuple[fx.Node, tuple[str, ...]] | None:
    """The call of ``module``'s last Linear in its trace ``graph``, if the forward returns that
    call's output (through eval-identity children, such as ``proj_drop``), nothing else uses
    it, nothing else runs after it (a write in place the cut forward would skip) and nothing
    in it writes in place, with the names of those eval-identity children; else None."""
    nodes = list(graph.nodes)
    node = nodes[-1].args[0]
    after: list[str] = []
    while isinstance(node, fx.Node) and node.op == "call_module" and len(node.users) == 1:
        child = module.get_submodule(str(node.target))
        if type(child) in LINEARS or conv1d_layer(child):
            if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
                return None
            if len(nodes) - nodes.index(node) != len(after) + 2:
                return None  # more runs after the Linear than its eval-identity children
            if any(writes_in_place(n, module) for n in nodes):
                # the fused call runs the head where the parent adds, later than the child's
                # call: a write in place there (to its input, say) would move past the
                # parent's ops in between
                return None
            return node, tuple(reversed(after))
        if not eval_identity(child) or len(node.args) != 1 or node.kwargs:
            return None
        after.append(str(node.target))
        node = node.args[0]
    return None


def set_tail(
    module: nn.Module,
    graph: fx.Graph,
    eval_only: tuple[nn.Module, ...],
    nones: Nones,
    retarget: Mapping[Any, Callable[..., Any]] | None = None,
) -> bool:
    """Keep on ``module`` the head of its forward's trace ``graph`` (the forward it runs now:
    rewritten or its own), for its parent's fused residual add; False where the graph does not
    end in a Linear (:func:`tail_layer_of`)."""
    found = tail_layer_of(graph, module)
    if found is None:
        return False
    call, after = found
    nodes = list(graph.nodes)
    head = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in nodes[: nodes.index(call)]:  # all of it, as the forward runs it
        env[node] = head.node_copy(node, env.__getitem__)
    head.output(env[call.args[0]])  # type: ignore[index]
    retarget_calls(head, retarget)
    head.lint()
    forward = with_passed_kwargs(module, type(fx.GraphModule(module, head)).forward)
    if not isinstance(module, StandIn):
        # a child that runs its own forward (nothing of its own fused) still holds dnntune's
        # state now: on a stand-in of its class, which saves as that class without it
        # (``torch.save`` of the model raised PicklingError on the head's function)
        module.__class__ = shared_stand_in(type(module), _HOLDER, {_HOLDER: True})
    guard = TraceGuard(module, eval_only, nones)
    module.__dict__[TAIL] = ModuleTail(forward, str(call.target), after, type(module), guard)
    return True


def fused_module_tail(
    branch: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor | float,
    activation: str | None,
    act_module: nn.Module | None = None,
    *,
    between: tuple[nn.Module, ...] = (),
    kwargs: dict[str, Any] | None = None,
    residual_first: bool = False,
) -> torch.Tensor:
    """``activation(between(branch(x, **kwargs)) + residual)`` for a child module whose forward
    ends in a Linear: in eval mode its head, then the Linear with the add (and activation) as
    its GEMM's epilogue; else the child's own forward and PyTorch's add."""
    kwargs = kwargs or {}
    ok, act = activation_now(activation, act_module)
    y: Any = None
    if ok and isinstance(residual, torch.Tensor) and not branch.training:
        y = _through_head(branch, x, residual, act, between, kwargs, act_module)
        if isinstance(y, _Fused):
            return y.out
    if y is None:  # the child's own forward
        y = branch(x, **kwargs)
    return finish(plus(then(y, between), residual, residual_first), activation, act_module)


class _Fused(NamedTuple):
    out: torch.Tensor


def _through_head(
    branch: nn.Module,
    x: torch.Tensor,
    residual: torch.Tensor,
    act: str | None,
    between: tuple[nn.Module, ...],
    kwargs: dict[str, Any],
    act_module: nn.Module | None,
) -> _Fused | torch.Tensor | None:
    """The fused output; or, where the head ran and the Linear declined the add, the child's
    output (its Linear and the eval-identity children after it run as PyTorch calls them, the
    head not run twice); or None: the cut forward does not stand for this call."""
    state = branch.__dict__
    tail: ModuleTail | None = state.get(TAIL)
    if (
        tail is None
        or type(branch) is not tail.cls
        or "forward" in state
        or not tail.guard.holds(branch, (x,), kwargs)
    ):
        return None
    children = branch._modules  # one dict read (getattr walks three)
    layer = children.get(tail.layer)
    fused = getattr(layer, "fused_tail", None)
    if layer is None or fused is None or (type(layer) not in LINEARS and not conv1d_layer(layer)):
        return None
    skipped: list[nn.Module] = []
    for name in tail.after:
        m = children.get(name)
        if m is None or not eval_identity(m):
            return None
        skipped.append(m)
    if not skippable((*skipped, *between)) or hooked(branch, layer, act_module):
        return None
    h = tail.head(branch, x, **kwargs)
    out: torch.Tensor | None = fused(h, residual, act)
    if out is not None:
        return _Fused(out)
    return then(layer(h), tuple(skipped))


class Tails:
    """The children a parent's residual add takes through their last Linear
    (:mod:`._module_tails`): traced once, when the parent asks (the child's own turn in
    :func:`fuse_modules` reuses the trace), and cut into heads at the end, from the graph each
    then runs (its own fusions in it)."""

    def __init__(self) -> None:
        self._traced: dict[nn.Module, Traced | None] = {}
        #: the graph each module traced here runs (rewritten or as traced), its eval-only
        #: modules and None parameters
        self.final: dict[nn.Module, tuple[fx.Graph, tuple[nn.Module, ...], Nones]] = {}
        self._wanted: list[nn.Module] = []

    def trace(self, module: nn.Module, name: str) -> Traced | None:
        if module in self._traced:
            return self._traced.pop(module)
        return _rewritable(module, name)

    def ends_in_linear(self, child: nn.Module) -> bool:
        if child in self.final:
            graph = self.final[child][0]
        else:
            if child not in self._traced:
                self._traced[child] = _rewritable(child, type(child).__name__)
            traced = self._traced[child]
            if traced is None:
                return False
            graph = traced[0].graph
        if tail_layer_of(graph, child) is None:
            return False
        if child not in self._wanted:
            self._wanted.append(child)
        return True

    def cut(self, retarget: Mapping[Any, Callable[..., Any]] | None) -> None:
        for child in self._wanted:
            final = self.final.get(child)
            traced = self._traced.get(child)
            if final is None and traced is not None:
                final = (traced[0].graph, traced[0].eval_only, traced[1])
            if final is not None:
                set_tail(child, *final, retarget)


def _rewritable(module: nn.Module, name: str) -> Traced | None:
    """:func:`traced_for_rewrite`, with the dropouts of the eval mode's trace taken out."""
    traced = traced_for_rewrite(module, name)
    if traced is not None:
        drop_eval_dropouts(traced[0].graph)
    return traced
