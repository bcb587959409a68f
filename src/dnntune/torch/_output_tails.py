"""A child whose forward returns its last Linear's output first, as the branch of its
parent's residual add: read from the child's source, the add handed to the Linear at run time.

transformers' attention modules end in their output projection and return it first::

    attn_output = self.o_proj(attn_output)          # GPT-2: c_proj, then resid_dropout
    return attn_output, attn_weights

and their decoder layer adds it to the residual stream (``hidden_states, _ = self.self_attn(
...)``, then ``hidden_states = residual + hidden_states``): one more elementwise kernel a layer,
the projection's output written and read again. A trace cannot cut such a forward at the
projection's input as :mod:`._module_tails` cuts timm's (the cache update and the attention
function chosen from the config are no trace's), so the add is handed over while the child
runs: the fused call arms the projection with the residual (:mod:`._armed`), the projection's
next call takes it as its GEMM's epilogue, and the child's first returned value is that call's
output, already the sum. Where the projection declines (another shape or type, training) the
parent's add runs as written.

What the forward's source must show (:func:`output_tail_of`): no decorator but transformers'
``deprecate_kwarg`` (it renames a keyword and calls the body); a last statement
``return name`` as the first item of a tuple whose other items do not read ``name``; before it,
statements ``name = self.<child>(...)`` back to one that is not of that form. At run time the
last of those children that is a Linear (or transformers' ``Conv1D``) on dnntune is the
projection; the ones after it must be the identity in eval mode (a dropout) and called with
``name`` alone; ``self.<projection>`` is read nowhere else in the forward, so its one call is
that statement's. The rest (in eval mode, no hook of the user's, the class's own forward)
is checked on every call, as every fused call checks it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import textwrap
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import fx, nn

from dnntune.errors import ExecutionError
from dnntune.torch._armed import ARMED, Armed
from dnntune.torch._fused_parts import LINEARS, eval_identity, hooked, plus, skippable
from dnntune.torch._fx_nodes import in_place_add, is_add, number_argument
from dnntune.torch._known_wrappers import is_renaming_decorator, wrappers_of
from dnntune.torch._pass_through import call_with_extra
from dnntune.torch._swap_classes import conv1d_layer

__all__ = ["OutputTail", "fuse_output_tails", "fused_output_tail", "output_tail_of"]


class OutputTail(NamedTuple):
    """The trailing ``name = self.<child>(...)`` statements of a forward that returns ``name``
    first: the children in call order, and those called with ``name`` alone (candidates for
    the eval-identity steps after the projection)."""

    chain: tuple[str, ...]
    plain: frozenset[str]
    #: the attributes of ``self`` the forward reads exactly once
    once: frozenset[str]


def output_tail_of(source: str) -> OutputTail | None:
    """The :class:`OutputTail` of a forward's source text, or None where it does not end so."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, ast.FunctionDef) or len(fn.body) < 2:
        return None
    if not all(is_renaming_decorator(d) for d in fn.decorator_list):
        return None  # a decorator may do anything with what the body returns
    last = fn.body[-1]
    value = last.value if isinstance(last, ast.Return) else None
    if not isinstance(value, ast.Tuple) or not value.elts:
        return None
    first, others = value.elts[0], value.elts[1:]
    if not isinstance(first, ast.Name) or any(isinstance(e, ast.Starred) for e in value.elts):
        return None
    name = first.id
    if any(_reads(e, name) for e in others):
        return None
    chain: list[str] = []
    plain: set[str] = set()
    for stmt in reversed(fn.body[:-1]):
        call = _self_call_into(stmt, name)
        if call is None:
            break
        attr, node = call
        chain.append(attr)
        if len(node.args) == 1 and not node.keywords and _is_name(node.args[0], name):
            plain.add(attr)
    if not chain:
        return None
    counts: dict[str, int] = {}
    for read in ast.walk(fn):
        if _is_self_attr(read):
            assert isinstance(read, ast.Attribute)
            counts[read.attr] = counts.get(read.attr, 0) + 1
    once = frozenset(a for a, n in counts.items() if n == 1)
    return OutputTail(tuple(reversed(chain)), frozenset(plain), once)


def _reads(node: ast.AST, name: str) -> bool:
    return any(_is_name(n, name) for n in ast.walk(node))


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_self_attr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _self_call_into(stmt: ast.stmt, name: str) -> tuple[str, ast.Call] | None:
    """(child, call) of a statement ``name = self.<child>(...)``."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and _is_name(stmt.targets[0], name)
        and isinstance(stmt.value, ast.Call)
        and _is_self_attr(stmt.value.func)
    ):
        return None
    func = stmt.value.func
    assert isinstance(func, ast.Attribute)
    return func.attr, stmt.value


@functools.lru_cache(maxsize=256)
def _tail_of_forward(forward: Callable[..., Any]) -> OutputTail | None:
    """The :class:`OutputTail` of a class's forward, through the wrappers transformers puts
    around it that only rename a keyword (``deprecate_kwarg``, transformers 5.2x's attention
    modules; :mod:`._known_wrappers`): the body's return is what the call returns."""
    if wrappers_of(forward) is None:
        return None
    try:
        source = inspect.getsource(inspect.unwrap(forward))
    except (OSError, TypeError, ValueError):
        return None
    return output_tail_of(source)


def _projection(
    child: nn.Module, now: bool = True
) -> tuple[nn.Module, tuple[nn.Module, ...]] | None:
    """The projection that ends ``child``'s forward and the eval-identity children called on
    its output after it, where the fused call stands for the forward (module docstring);
    ``now``: for this call (eval mode, the projection on dnntune), else for the rewrite, made
    before the layers are swapped for dnntune's."""
    cls = type(child)
    if (now and child.training) or "forward" in child.__dict__:
        return None
    tail = _tail_of_forward(cls.forward)
    if tail is None:
        return None
    children = child._modules
    for i in range(len(tail.chain) - 1, -1, -1):
        layer = children.get(tail.chain[i])
        if layer is None or not (type(layer) in LINEARS or conv1d_layer(layer)):
            continue
        if tail.chain[i] not in tail.once:
            return None
        if now and getattr(layer, "fused_tail", None) is None:
            return None
        after: list[nn.Module] = []
        for step in tail.chain[i + 1 :]:
            module = children.get(step)
            if module is None or step not in tail.plain or not eval_identity(module):
                return None
            after.append(module)
        return layer, tuple(after)
    return None


def fusable(child: nn.Module) -> bool:
    """Whether ``child``'s forward ends so that its parent's add can be handed over (module
    docstring); read when the parent's forward is rewritten."""
    return _projection(child, now=False) is not None


def fused_output_tail(
    child: nn.Module,
    residual: Any,
    splat: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    residual_first: bool = False,
) -> Any:
    """``child(*args, **kwargs)[0] + residual`` (with ``splat``, ``call_with_extra(*args)``:
    the parent's trace called the child through it, handing on the caller's ``**kwargs``),
    with the add in the epilogue of the child's output projection where it can be (module
    docstring)."""

    def run() -> Any:
        return call_with_extra(*args) if splat else child(*args, **kwargs)

    found = _projection(child) if isinstance(residual, torch.Tensor) else None
    if found is None or not skippable(found[1]) or hooked(child, found[0], *found[1]):
        return plus(run()[0], residual, residual_first)
    state = Armed(found[0], residual)
    token = ARMED.set(state)  # set and reset here: this runs on every attention call
    try:
        out = run()
    finally:
        ARMED.reset(token)
    first = out[0]
    if state.output is None:  # the projection declined: the add as written
        return plus(first, residual, residual_first)
    if first is not state.output:
        raise ExecutionError(
            f"{type(child).__name__}: its forward returned another tensor than the output of "
            "the layer that took the residual add; run optimize(..., fuse=False) and report "
            "the module's forward"
        )
    return first


def _child_of(node: Any, module: nn.Module) -> tuple[fx.Node, nn.Module] | None:
    """(call, child) where ``node`` is ``getitem(call, 0)`` of a call of a child module
    (``call_module``, or :func:`call_with_extra` of a ``get_attr`` child) whose other uses are
    unused items of its result."""
    if not (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and node.target is operator.getitem
        and len(node.args) == 2
        and node.args[1] == 0
        and len(node.users) == 1
    ):
        return None
    call = node.args[0]
    if not isinstance(call, fx.Node):
        return None
    if any(
        user is not node and (user.target is not operator.getitem or user.users)
        for user in call.users
    ):
        return None
    target: Any = None
    if call.op == "call_module":
        target = call.target
    elif call.op == "call_function" and call.target is call_with_extra:
        holder = call.args[0]
        if isinstance(holder, fx.Node) and holder.op == "get_attr":
            target = holder.target
    if not isinstance(target, str):
        return None
    try:
        child = module.get_submodule(target)
    except AttributeError:
        return None
    return call, child


def fuse_output_tails(graph: fx.Graph, module: nn.Module) -> list[str]:
    """Rewrite each add of a child's first output and a residual, where the child's forward
    ends in its output projection (:func:`fusable`), as one :func:`fused_output_tail` call; the
    children's names. Only where nothing runs between the child's call and the add but the
    items taken of its result."""
    done: list[str] = []
    for add in list(graph.nodes):
        if add.graph is not graph or not is_add(add) or in_place_add(add):
            continue
        for side, residual_first in ((0, False), (1, True)):
            first, residual = add.args[side], add.args[1 - side]
            found = _child_of(first, module)
            if found is None or not isinstance(residual, fx.Node):
                continue
            call, child = found
            if number_argument(residual) or residual in call.users or residual is call:
                continue
            items = set(call.users)
            between = _nodes_between(call, add)
            if between is None or any(n not in items for n in between):
                continue
            if not fusable(child):
                continue
            done.append(_child_name(call))
            _replace(graph, add, call, residual, residual_first)
            break
    return done


def _nodes_between(start: fx.Node, end: fx.Node) -> list[fx.Node] | None:
    nodes: list[fx.Node] = []
    node = start.next
    while node is not end:
        if node.op == "root":
            return None
        nodes.append(node)
        node = node.next
    return nodes


def _child_name(call: fx.Node) -> str:
    if call.op == "call_module":
        return str(call.target)
    holder = call.args[0]
    assert isinstance(holder, fx.Node)
    return str(holder.target)


def _replace(
    graph: fx.Graph, add: fx.Node, call: fx.Node, residual: fx.Node, residual_first: bool
) -> None:
    with graph.inserting_before(add):
        if call.op == "call_module":
            child = graph.get_attr(str(call.target))
            fused = graph.call_function(
                fused_output_tail,
                (child, residual, False, tuple(call.args), dict(call.kwargs)),
                {"residual_first": residual_first},
            )
        else:  # call_with_extra(child, args, kwargs, extra): no keywords of its own
            fused = graph.call_function(
                fused_output_tail,
                (call.args[0], residual, True, tuple(call.args), {}),
                {"residual_first": residual_first},
            )
    add.replace_all_uses_with(fused)
    graph.erase_node(add)
    for item in list(call.users):
        graph.erase_node(item)
    graph.erase_node(call)
