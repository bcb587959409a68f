"""Tracing a module's own forward without being fooled by it: what a trace would freeze
(``with`` blocks, decorators, ``*args``, a ``**kwargs`` read as more than handed on, random
numbers drawn in Python), the parameters that default to None traced as None, those only
handed on to children traced as such (:mod:`._pass_through`), and the trace in both training
modes with the module's Python state put back after each (:mod:`._python_state`). The guard
that sends a call the trace did not stand for to the module's own forward is
:mod:`._trace_guard`'s. Used by :mod:`dnntune.torch.fusion` and
:mod:`dnntune.torch._module_tails`."""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import operator
import textwrap
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import fx, nn

from dnntune.torch._code_reads import plain_value
from dnntune.torch._dtypes_seen import DtypesSeen, dtype_of, seen_dtypes, set_conditions
from dnntune.torch._frozen_reads import child_methods, frozen_state
from dnntune.torch._known_wrappers import is_renaming_decorator, wrappers_of
from dnntune.torch._pass_through import pass_through_of, splice_splats, tracing_forward
from dnntune.torch._python_state import Generators, PythonState
from dnntune.torch._trace_pitfalls import helper_pitfall, helpers_of, pitfall

#: the reasons a module is not rewritten are the fusion's to log (``-vv`` shows them)
_log = logging.getLogger("dnntune.torch.fusion")

__all__ = [
    "AUGMENTED",
    "EVAL_ONLY_MODULES",
    "Nones",
    "OwnThreadTracer",
    "Trace",
    "class_reads",
    "none_parameters",
    "reached_functions",
    "reads_dtype",
    "not_traceable",
    "Traced",
    "trace_in_both_modes",
    "traced_for_rewrite",
]

#: the parameters of a forward traced as None: (position after ``self``, name)
Nones = tuple[tuple[int, str], ...]


class _InPlaceProxy(fx.Proxy):
    """A proxy that records an augmented assignment (``x += y``) as the in-place operator
    (``operator.iadd``), which the rewritten forward runs as ``x += y``. fx's own proxy has no
    in-place methods, so Python falls back to ``x = x + y``, a new tensor: ``x``'s other
    references (``identity = x`` before it, the caller's tensor) would no longer see the
    write. In a trace that reads dtypes (:mod:`._dtypes_seen`), ``x.dtype`` is the dtype the
    example forward gave ``x`` where that follows from what it saw."""

    def __getattr__(self, k: str) -> Any:
        if k == "dtype":
            tracer = self.tracer
            if isinstance(tracer, _ChildrenAsLeaves) and tracer.seen is not None:
                dtype = dtype_of(self.node, tracer.root_module, tracer.seen)
                if dtype is not None:
                    tracer.read_dtypes = True
                    return dtype
        return super().__getattr__(k)


def _in_place(op: Callable[[Any, Any], Any]) -> Callable[[fx.Proxy, Any], fx.Proxy]:
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


#: the augmented assignments fx's code generation writes back as such (torch.fx.graph's
#: ``inplace_methods``): the ``operator`` functions' names
AUGMENTED = (
    "iadd",
    "iand",
    "ifloordiv",
    "ilshift",
    "imatmul",
    "imod",
    "imul",
    "ior",
    "ipow",
    "irshift",
    "isub",
    "itruediv",
    "ixor",
)
for _name in AUGMENTED:
    setattr(_InPlaceProxy, f"__{_name}__", _in_place(getattr(operator, _name)))


#: held while one of dnntune's fx traces runs (:class:`OwnThreadTracer`); re-entrant, for a
#: trace that starts another in its thread
_TRACE_LOCK = threading.RLock()


class OwnThreadTracer(fx.Tracer):
    """An fx tracer whose patches act only in the thread that traces.

    While it traces, fx replaces ``nn.Module.__call__`` and ``nn.Module.__getattr__`` for the
    whole process, and every module call in every thread reaches the tracer: another thread's
    model, served while ``optimize`` traced this one, raised "module is not installed as a
    submodule" on every forward (new-user audit), and one that shares a parameter with the
    traced module would have been handed a proxy of it and recorded into the trace. Calls from
    other threads run as PyTorch runs them. Two such traces never overlap (one lock for the
    process): fx puts back what it patched as it found it, so two ``optimize`` calls tracing
    at once in two threads could leave ``nn.Module.__call__`` patched for good with a finished
    trace's wrapper, after raising in one of them."""

    _tracing_thread: int | None = None

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        with _TRACE_LOCK:
            self._tracing_thread = threading.get_ident()
            return super().trace(root, concrete_args)

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if threading.get_ident() != self._tracing_thread:
            return forward(*args, **kwargs)  # the module's own __call__, hooks and all
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if threading.get_ident() != self._tracing_thread:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)


class _ChildrenAsLeaves(OwnThreadTracer):
    """Trace only the root's own forward: every child module is one call.

    The root's buffers are proxies, as its parameters are (fx's default reads a buffer's
    value at trace time): a Python branch or number taken from one (``if self.flag:``,
    ``int(self.k)``) then fails the trace, so the module keeps its own forward, and an
    in-place update of one (``self.steps += 1``, an EMA's ``mul_``) is a node of the rewritten
    forward, not a write made once while tracing (new-user audit, session 55: errors of 1.9
    to 2.2, a step counter that never counted). A dict or list of another class than
    ``dict`` and ``list`` (transformers' ``ModelOutput``, an ``OrderedDict``) fails the trace
    too: fx rebuilds it as the plain class, and ``out.last_hidden_state`` raised."""

    proxy_buffer_attributes = True

    def __init__(
        self,
        root: nn.Module,
        forward: Callable[..., Any] | None = None,
        seen: DtypesSeen | None = None,
    ) -> None:
        super().__init__()
        self.root_module = root
        #: the function traced in place of the root's forward (:func:`tracing_forward`)
        self.forward = forward
        #: the dtypes ``x.dtype`` reads (None: a proxy, as fx's), and whether one was read
        self.seen = seen
        self.read_dtypes = False

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return m is not self.root_module

    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> Any:
        fn = self.forward if self.forward is not None else root_fn
        return super().create_args_for_root(fn, is_module, concrete_args)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _InPlaceProxy(node, self)

    def create_arg(self, a: Any) -> Any:
        kind = type(a)
        if (kind is not dict and isinstance(a, dict)) or (kind is not list and isinstance(a, list)):
            raise fx.proxy.TraceError(
                f"its forward passes or returns a {kind.__name__}, which a rewritten forward "
                f"would make a plain {'dict' if isinstance(a, dict) else 'list'}"
            )
        return super().create_arg(a)


_MISSING = object()


def class_reads(module: nn.Module) -> tuple[str, ...]:
    """Names the forward and the methods it calls read that are plain values of the module's
    class (not of its instance dict)."""
    cls, attrs = type(module), module.__dict__
    reached = reached_functions(cls)
    # also what the module-level helpers it calls read (``flag_of(self)`` returning
    # ``self.FLAG``: set on the class later, it changed nothing; new-user audit, session 55)
    names = {n for f in (*reached, *helpers_of(reached)) for n in f.__code__.co_names}
    found = []
    for name in sorted(names):
        if name in attrs or name.startswith("__"):
            continue
        value = inspect.getattr_static(cls, name, _MISSING)
        if value is not _MISSING and plain_value(value):
            found.append(name)
    return tuple(found)


def reached_functions(cls: type) -> tuple[Any, ...]:
    """``cls.forward`` and the methods of ``cls`` it calls through ``self`` (a helper such as
    ``teacher_feat``), to three levels: what a trace of the forward runs of the class's own
    Python. PyTorch's own methods are left out."""
    found: list[Any] = []
    todo = [(getattr(cls, "forward", None), 0)]
    while todo:
        function, depth = todo.pop()
        function = inspect.unwrap(function) if callable(function) else function
        code = getattr(function, "__code__", None)
        if code is None or function in found:
            continue
        found.append(function)
        if depth >= 3:
            continue
        for name in code.co_names:
            attr = inspect.getattr_static(cls, name, None)
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            if inspect.isfunction(attr) and not attr.__module__.startswith("torch."):
                todo.append((attr, depth + 1))
    return tuple(found)


def reads_dtype(module: nn.Module) -> bool:
    """Whether the Python a trace of ``module``'s forward runs names ``dtype`` (it may branch
    on one: :mod:`._dtypes_seen`); once per class."""
    cls: type = type(module)
    return _class_reads_dtype(cls)


@functools.lru_cache(maxsize=1024)
def _class_reads_dtype(cls: type) -> bool:
    return any("dtype" in f.__code__.co_names for f in reached_functions(cls))


def not_traceable(module: nn.Module, *, none_defaults: bool = False) -> str | None:
    """Why a trace of ``module.forward`` could silently specialise, or None.

    A trace turns ``if mask is not None:`` into the branch taken for a traced argument (a Proxy
    is never None), so a later call with ``mask=None`` would run the wrong code: forwards with
    ``*args``/``**kwargs`` are not rewritten, nor, unless ``none_defaults``, those with a
    parameter that defaults to None. With ``none_defaults``, such a parameter is traced as None
    (:func:`none_parameters`), and the rewritten forward runs only for calls that leave it None
    (guard): timm's ``Block.forward(x, attn_mask=None)`` called as ``block(x)``;
    a parameter, or a ``**kwargs``, that the forward only hands on to its children is traced as
    such and may hold anything (:mod:`._pass_through`).
    """
    if isinstance(module, torch.jit.ScriptModule):
        # its class gives no forward (TorchScript's descriptor raises AttributeError)
        return "it is a TorchScript module (torch.jit.script or trace): it runs compiled code"
    try:
        signature = inspect.signature(type(module).forward)
    except (TypeError, ValueError):
        return "its forward has no inspectable signature"
    reached = reached_functions(type(module))
    # transformers' wrappers around the forward itself: a call they would change runs the
    # module's own forward (the guard), any other is the forward's own
    wrappers = wrappers_of(type(module).forward)
    if wrappers is None:
        return "its forward is decorated (a trace drops what the decorator does)"
    allowed = [len(wrappers.renamed)] + [0] * (len(reached) - 1)
    why = next(filter(None, map(_untraced_statements, reached, allowed)), None)
    # the module-level helpers, and the children's methods the trace runs (``self.sub.post``)
    inner = child_methods(module, reached)
    called = (*inner, *helpers_of((*reached, *inner)))
    why = why or next(filter(None, map(helper_pitfall, called)), None)
    why = why or frozen_state(module, (*reached, *called))
    if why is not None:
        return why
    through = pass_through_of(module) if none_defaults else None
    free = {name for _, name in through.free} if through is not None else set()
    for p in list(signature.parameters.values())[1:]:
        if through is not None and p.name == through.splat:
            continue  # a ``**kwargs`` only handed on to children
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return f"its forward takes {p}"
        if p.name in free:
            continue
        if p.default is None and (not none_defaults or p.kind is p.KEYWORD_ONLY):
            return f"its forward's {p.name} defaults to None"
    return None


def none_parameters(module: nn.Module) -> Nones:
    """The parameters of ``module``'s forward that default to None, as (position, name): a
    trace takes them as None (the branch ``if mask is not None:`` not taken), and the rewritten
    forward holds only for calls that leave them None."""
    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    through = pass_through_of(module)
    free = {name for _, name in through.free} if through is not None else set()
    return tuple(
        (i, p.name)
        for i, p in enumerate(params)
        if p.default is None and p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in free
    )


def _trace_with_none(module: nn.Module, nones: Nones) -> fx.Graph:
    """``module``'s forward traced with its ``nones`` parameters as None: fx's own
    ``concrete_args``, with the placeholders named as the parameters again (fx renames them
    ``mask_1``, which a call by keyword would not find) and fx's ``_assert_is_none`` checks
    taken out (the guard checks those arguments before the rewritten forward
    runs). A trace that fails on a branch is traced again with the dtypes seen
    (:mod:`._dtypes_seen`), where a forward being optimized saw them."""
    try:
        return _traced_with_none(module, nones, None)
    except fx.proxy.TraceError:
        seen = seen_dtypes() if reads_dtype(module) else None
        if seen is None or module not in seen.inputs:
            raise
        return _traced_with_none(module, nones, seen)


def _traced_with_none(module: nn.Module, nones: Nones, seen: DtypesSeen | None) -> fx.Graph:
    through = pass_through_of(module)
    splat = through.splat if through is not None else None
    if through is None or splat is None:
        tracer = _ChildrenAsLeaves(module, seen=seen)
        names = list(inspect.signature(type(module).forward).parameters)[1:]
    else:  # the ``**kwargs`` as a plain parameter (:func:`tracing_forward`)
        tracer = _ChildrenAsLeaves(module, tracing_forward(module, through), seen)
        names = [*through.named, splat]
    try:
        if not nones and splat is None:
            return tracer.trace(module)
        graph = tracer.trace(module, concrete_args={name: None for _, name in nones} or None)
    finally:
        if tracer.read_dtypes:
            set_conditions(module, read=True)
    if splat is not None:
        splice_splats(graph, splat)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(names):
        raise ValueError("its forward's parameters did not trace one placeholder each")
    for node, name in zip(placeholders, names, strict=True):
        node.target = name
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == (
            "_assert_is_none"
        ):
            graph.erase_node(node)
    return graph


@functools.lru_cache(maxsize=256)
def _untraced_statements(forward: Callable[..., Any], renaming: int = 0) -> str | None:
    """Why ``forward``'s source holds Python a trace would drop, or None: a ``with`` block
    (``torch.no_grad()``, ``torch.autocast``: a trace records the ops, not the mode they ran
    in) or a decorator (``@torch.no_grad()``), except, on the function itself, the
    ``renaming`` ``@deprecate_kwarg`` wrappers :func:`wrappers_of` found around it. A
    forward whose source cannot be read is not rewritten either."""
    try:
        source = textwrap.dedent(inspect.getsource(forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return "its forward's source cannot be read"
    top = tree.body[0] if tree.body else None
    for node in ast.walk(tree):
        why = pitfall(node)
        if why is not None:
            return why
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list:
            decorators = node.decorator_list
            if not (
                node is top
                and len(decorators) == renaming
                and all(map(is_renaming_decorator, decorators))
            ):
                return "its forward is decorated (a trace drops what the decorator does)"
    return None


class Trace(NamedTuple):
    """A trace of a module's own forward, and the modules whose training flags it holds for."""

    graph: fx.Graph
    #: empty: the forward traces alike in training and eval mode (what it runs in training is
    #: decided by the fused calls, per module); else the module and all its submodules, which
    #: must all be in eval mode for the trace (of the eval mode) to stand for the forward
    eval_only: tuple[nn.Module, ...] = ()


#: the most modules (the module and its submodules) whose training flags a trace of the eval
#: mode alone is guarded by: each call checks them all
EVAL_ONLY_MODULES = 64


def trace_in_both_modes(module: nn.Module, nones: Nones = ()) -> Trace | None:
    """The trace of ``module``'s own forward. Where it differs between training and eval mode
    (``F.dropout(x, p, training=self.training)``, ``if self.training:``), the trace of the eval
    mode, to run only while the module and every submodule is in eval mode (training then runs
    the module's own forward); None where that is more than :data:`EVAL_ONLY_MODULES` modules.

    Raises:
        ValueError: the forward changes its modules' Python state, or draws random numbers in
            Python (LayerDrop's ``if self.training and random.random() < p``: the trace would
            freeze one draw). Either is put back as it was: the trace consumes none of the
            user's random numbers.
    """
    modes = {m: m.training for m in module.modules()}
    set_conditions(module, read=False)  # until a trace reads dtypes (:mod:`._dtypes_seen`)
    # a forward that sets attributes (``self.cache = torch.cat(...)``) or fills a list or dict
    # of its modules (``self.kv.append(k)``) would keep the trace's proxies there: all of it is
    # put back after each trace, and such a forward is not fused
    state = PythonState(list(modes))
    generators = Generators(list(modes))
    codes = []
    graphs = []
    changed = drawn = False
    try:
        for training in (True, False):
            for m in modes:  # the flag alone: a custom train() may do more than set it
                m.training = training
            try:
                graph = _trace_with_none(module, nones)
            finally:
                changed = state.put_back() or changed
                drawn = generators.put_back() or drawn
            codes.append(graph.python_code("self").src)
            graphs.append(graph)
    finally:
        for m, training in modes.items():
            m.training = training
    if changed:
        raise ValueError("its forward changes attributes, lists or dicts of its modules")
    if drawn:
        raise ValueError("its forward draws random numbers in Python (a trace would freeze them)")
    if codes[0] == codes[1]:
        return Trace(graphs[1])
    if len(modes) > EVAL_ONLY_MODULES:
        return None
    return Trace(graphs[1], tuple(modes))


#: a trace for a rewrite, and the parameters it was traced as None for
Traced = tuple[Trace, Nones]


def traced_for_rewrite(module: nn.Module, name: str) -> Traced | None:
    """``module``'s forward traced for the rewrite (dropouts of the eval mode taken out), with
    the parameters it was traced as None for; None (the reason logged) where it may not be."""
    why = not_traceable(module, none_defaults=True)
    if why is not None:
        _log.debug("dnntune.torch: %s not fused: %s", name or "<root>", why)
        return None
    try:
        nones = none_parameters(module)
        trace = trace_in_both_modes(module, nones)
    except Exception as exc:  # data-dependent control flow, unsupported Python, ...
        _log.debug("dnntune.torch: %s does not trace (%s); not fused", name or "<root>", exc)
        return None
    if trace is None:
        _log.debug(
            "dnntune.torch: %s branches on self.training and has over %d submodules; not fused",
            name or "<root>",
            EVAL_ONLY_MODULES,
        )
        return None
    return trace, nones
