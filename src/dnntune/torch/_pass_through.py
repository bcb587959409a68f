"""Parameters a forward only hands on to its children: they may hold anything.

transformers' decoder and encoder layers (LLaMA's, GPT-2's) take the attention mask, the
cache, the position embeddings (a tuple) and ``**kwargs`` only to pass them on to their
attention module::

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.self_attn(self.input_layernorm(hidden_states),
                                          attention_mask=attention_mask,
                                          past_key_values=past_key_values, **kwargs)
        ...

A trace of such a forward does not depend on those values: the Python never reads them, it
hands them to a child module, which the trace calls as one unit with whatever it is given. So
a parameter whose every use in the forward's source is an argument of a call ``self.<child>(
...)`` of a child module (:func:`passed_through`) is traced as a placeholder and the rewritten
forward stands for calls with any value there: None, a tuple, a cache object. A ``**kwargs``
parameter used only as ``**kwargs`` in such calls is traced by a forward of the named
parameters that calls the module's own with a marker in its place (:func:`tracing_forward`);
each child call that received the marker becomes a call that adds, at run time, the keywords
the caller gave beyond the named parameters (:func:`splice_splats`, :func:`call_with_extra`).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

__all__ = [
    "PassThrough",
    "call_with_extra",
    "handed_on",
    "pass_through_of",
    "passed_through",
    "splice_splats",
    "tracing_forward",
]

#: the keyword a traced child call receives in place of the caller's ``**kwargs``
_MARK = "_dnntune_passed_kwargs"
#: calls that read a function's parameters without naming them
_FRAME_READERS = frozenset({"locals", "vars", "eval", "exec"})


@dataclass(frozen=True)
class PassThrough:
    """What of a forward's parameters is only handed on to child modules."""

    #: the positional-or-keyword parameters after ``self``, in order
    named: tuple[str, ...]
    #: those only handed on (or never read): (position after ``self``, name)
    free: tuple[tuple[int, str], ...]
    #: the ``**kwargs`` parameter, only splatted into child calls; None: the forward has none
    splat: str | None


@functools.lru_cache(maxsize=256)
def passed_through(forward: Callable[..., Any]) -> dict[str, frozenset[str]] | None:
    """Per parameter of ``forward`` (after ``self``) whose every read in its source is an
    argument of a call ``self.<attr>(...)`` made in the forward's own body (positional, by
    keyword, or as ``**name``), the attributes called with it; a parameter read nowhere maps
    to no attribute. Parameters read otherwise (``if mask is not None``), assigned, or read in a
    nested function are left out. None: the source cannot be read."""
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return None
    return handed_on(source)


def handed_on(source: str) -> dict[str, frozenset[str]] | None:
    """:func:`passed_through` of a forward's source text."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef):
        return None
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FRAME_READERS
        ):
            return {}  # ``self.attn(**locals())`` reads every parameter without naming it
    params = [a.arg for a in function.args.args[1:]]
    if function.args.kwarg is not None:
        params.append(function.args.kwarg.arg)
    parents: dict[ast.AST, ast.AST] = {}
    nested: set[ast.AST] = set()
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
        if node is not function and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.comprehension
        ):
            nested.update(ast.walk(node))
    callees: dict[str, set[str]] = {p: set() for p in params}
    for node in ast.walk(function):
        if not isinstance(node, ast.Name) or node.id not in callees:
            continue
        attr = None if node in nested else _child_call_of(node, parents)
        if attr is None or not isinstance(node.ctx, ast.Load):
            callees.pop(node.id)
            continue
        callees[node.id].add(attr)
    return {p: frozenset(a) for p, a in callees.items()}


def _child_call_of(name: ast.Name, parents: dict[ast.AST, ast.AST]) -> str | None:
    """``attr`` when ``name`` is an argument of a call ``self.attr(...)`` (positional, not
    starred; a keyword's value; or ``**name``); else None."""
    parent = parents.get(name)
    call = parents.get(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call):
        return None
    if isinstance(parent, ast.Call) and name not in call.args:
        return None  # the callee itself, not an argument
    func = call.func
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    ):
        return func.attr
    return None


def pass_through_of(module: nn.Module) -> PassThrough | None:
    """The parameters of ``module``'s forward it only hands on to its own child modules, or
    None where its signature has ``*args`` or keyword-only parameters, or a ``**kwargs`` it
    does more with than hand on."""
    forward = type(module).forward
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())[1:]
    splat = None
    named = []
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            splat = p.name
        elif p.kind is p.POSITIONAL_OR_KEYWORD:
            named.append(p.name)
        else:
            return None
    found = passed_through(inspect.unwrap(forward)) or {}
    children = module._modules  # noqa: SLF001 (one dict, no attribute walk)
    cls = type(module)

    def child(attr: str) -> bool:
        # a child module, not shadowed by a class attribute (a property) of that name; or an
        # attribute the module has nowhere (GPT-2's ``self.crossattention`` without cross
        # attention): a call of it raises, so a trace that ran never reached it, and the
        # guard keeps every call on the trace's branches (the parameters it read as None,
        # the attributes it read by value)
        if inspect.getattr_static(cls, attr, None) is not None:
            return False
        return children.get(attr) is not None or _absent(module, attr)

    def only_to_children(name: str) -> bool:
        attrs = found.get(name)
        return attrs is not None and all(map(child, attrs))

    if splat is not None and not only_to_children(splat):
        return None
    free = tuple((i, n) for i, n in enumerate(named) if only_to_children(n))
    return PassThrough(tuple(named), free, splat)


def _absent(module: nn.Module, attr: str) -> bool:
    """``module`` has no attribute ``attr``: no child, parameter, buffer or instance value."""
    state = module.__dict__
    return attr not in state and not any(
        attr in state.get(table, {}) for table in ("_modules", "_parameters", "_buffers")
    )


def tracing_forward(module: nn.Module, through: PassThrough) -> Callable[..., Any]:
    """A forward of ``module``'s named parameters (their defaults kept) and the ``**kwargs``
    one as a plain parameter, which runs the module's own forward with a marker in place of
    ``**kwargs``: what a trace can run (a placeholder cannot be splatted)."""
    forward = type(module).forward
    assert through.splat is not None
    params = list(inspect.signature(forward).parameters.values())[1:]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    spec = ", ".join(f"{n}=_defaults[{n!r}]" if n in defaults else n for n in through.named)
    passed = ", ".join(through.named)
    source = (
        f"def forward(self, {spec}{', ' if spec else ''}{through.splat}=None):\n"
        f"    return _forward(self, {passed}{', ' if passed else ''}**_marked)\n"
    )
    scope: dict[str, Any] = {"_defaults": defaults, "_forward": forward, "_marked": {_MARK: True}}
    exec(compile(source, f"<dnntune pass-through of {type(module).__name__}>", "exec"), scope)
    traced: Callable[..., Any] = scope["forward"]
    return traced


def splice_splats(graph: fx.Graph, splat: str) -> None:
    """Each child call of ``graph`` that received the marker of :func:`tracing_forward`
    becomes :func:`call_with_extra` of that child, its arguments and the ``splat``
    placeholder (the caller's keywords beyond the named parameters)."""
    placeholder = next(
        (n for n in graph.nodes if n.op == "placeholder" and n.target == splat), None
    )
    if placeholder is None:
        raise ValueError(f"the trace has no placeholder {splat!r}")
    for node in list(graph.nodes):
        if node.op != "call_module" or _MARK not in node.kwargs:
            continue
        kwargs = {k: v for k, v in node.kwargs.items() if k != _MARK}
        with graph.inserting_before(node):
            child = graph.get_attr(str(node.target))
            call = graph.call_function(call_with_extra, (child, node.args, kwargs, placeholder))
        node.replace_all_uses_with(call)
        graph.erase_node(node)
    if any(_MARK in node.kwargs for node in graph.nodes):
        raise ValueError("the forward's **kwargs reached a call of no child module")


def call_with_extra(
    child: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any] | None
) -> Any:
    """``child(*args, **kwargs, **extra)``: a child call of a rewritten forward that hands on
    the caller's ``**kwargs``."""
    return child(*args, **kwargs, **(extra or {}))
