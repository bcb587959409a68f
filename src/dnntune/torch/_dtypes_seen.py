"""The dtypes an example forward saw, for the traces that branch on them.

transformers' encoder and decoder layers of 31 families in 5.17 (Whisper, BART, T5, Marian,
Pegasus, M2M100, ...) end in::

    hidden_states = residual + hidden_states
    if hidden_states.dtype == torch.float16:
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)

A symbolic trace cannot take that branch (the dtype of a proxy is a proxy), so none of those
layers was traced, and none of their fusions ran: the MLP's activation and residual add, the
attention's residual add. Where a trace fails on such a branch, it is traced again with the
dtypes one example forward saw (:func:`record`): ``x.dtype`` is then the dtype ``x`` had,
where that follows from what was seen (:func:`dtype_of`: the forward's tensor arguments, its
children's outputs, and the ops between that keep a dtype), and the rewritten forward runs
only for calls whose tensor arguments have the dtypes seen, outside autocast
(:func:`conditions_of`, :class:`._trace_guard.TraceGuard`). A dtype that does not follow
from them stays a proxy, and the trace fails as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import operator
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = [
    "DtypeConditions",
    "DtypesSeen",
    "conditions_of",
    "dtype_of",
    "record",
    "seen_dtypes",
    "set_conditions",
    "using",
]

#: a module's output as dtypes: a tensor's dtype, a tuple's items, None for anything else
DtypeTree = Any
#: the tensor arguments a rewritten forward holds for: (position after ``self``, name, dtype)
DtypeConditions = tuple[tuple[int, str, torch.dtype], ...]

#: ops whose tensor result has the dtype shared by their tensor operands (a floating one, for
#: the arithmetic): what lies between a layer's children and its branch on ``x.dtype``
_KEEP_FUNCTIONS: frozenset[Any] = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.neg,
        operator.pos,
        torch.add,
        torch.sub,
        torch.mul,
        torch.clamp,
        torch.tanh,
        torch.neg,
        F.dropout,
        F.dropout1d,
        F.dropout2d,
        F.dropout3d,
        F.gelu,
        F.relu,
        F.silu,
        F.tanh,
    }
)
_KEEP_METHODS = frozenset({"add", "sub", "mul", "neg", "clamp", "tanh"})
#: methods that keep their input's dtype whatever their other arguments (sizes, dims)
_SHAPE_METHODS = frozenset(
    {
        "view",
        "reshape",
        "transpose",
        "permute",
        "flatten",
        "unsqueeze",
        "squeeze",
        "expand",
        "contiguous",
        "unflatten",
    }
)
_SHAPE_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.unsqueeze}
)


@dataclass
class DtypesSeen:
    """What one example forward saw: each module's tensor arguments by parameter name, and
    each module's output as a :data:`DtypeTree`. A module called twice with other dtypes is
    in neither (its dtypes do not follow)."""

    inputs: dict[nn.Module, dict[str, torch.dtype]] = field(default_factory=dict)
    outputs: dict[nn.Module, DtypeTree] = field(default_factory=dict)
    mixed: set[nn.Module] = field(default_factory=set)

    def keep(self, module: nn.Module, inputs: Any, output: Any) -> None:
        """Keep what one call of ``module`` gave (:data:`_UNSET`: not this side)."""
        if module in self.mixed:
            return
        for table, value in ((self.inputs, inputs), (self.outputs, output)):
            if value is _UNSET:
                continue
            if module in table and table[module] != value:
                self.mixed.add(module)
                self.inputs.pop(module, None)
                self.outputs.pop(module, None)
                return
            table[module] = value


_UNSET: Any = object()

#: the dtypes of the forward being optimized, where :func:`record` took them
_SEEN: contextvars.ContextVar[DtypesSeen | None] = contextvars.ContextVar(
    "dnntune_dtypes_seen", default=None
)
#: the conditions of each module whose last trace read dtypes (:func:`conditions_of`)
_CONDITIONS: weakref.WeakKeyDictionary[nn.Module, DtypeConditions] = weakref.WeakKeyDictionary()


def _tree(value: Any) -> DtypeTree:
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, tuple | list):
        return tuple(_tree(v) for v in value)
    return None


def _tensor_arguments(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        bound = inspect.signature(type(module).forward).bind(module, *args, **kwargs)
    except (TypeError, ValueError):
        return None
    return {k: v.dtype for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)}


def record(
    root: nn.Module, call: Callable[[nn.Module], Any], reads_dtype: Callable[[nn.Module], bool]
) -> DtypesSeen:
    """The dtypes ``call(root)`` (one forward, under ``no_grad``) gives the modules with
    children whose forward ``reads_dtype`` (their tensor arguments) and their submodules
    (their outputs). No forward runs where no module reads one; where the forward raises,
    nothing is seen (the forwards ``optimize`` runs after it raise it as before)."""
    seen = DtypesSeen()
    readers = [m for m in root.modules() if any(True for _ in m.children()) and reads_dtype(m)]
    watched = {c for m in readers for c in m.modules() if c is not m}
    handles = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        found = _tensor_arguments(module, args, kwargs)
        if found is not None:  # else the call does not bind: nothing seen of it
            seen.keep(module, found, _UNSET)

    def after(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        seen.keep(module, _UNSET, _tree(output))

    try:
        for m in readers:
            handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
        for m in watched:
            handles.append(m.register_forward_hook(after, with_kwargs=True))
        if readers:
            with torch.no_grad():
                call(root)
    except Exception:  # the forwards after this one raise it as they did
        return DtypesSeen()
    finally:
        for handle in handles:
            handle.remove()
    return seen


@contextlib.contextmanager
def using(seen: DtypesSeen | None) -> Iterator[None]:
    """Traces in this context that fail on a branch may read dtypes from ``seen``."""
    token = _SEEN.set(seen)
    try:
        yield
    finally:
        _SEEN.reset(token)


def seen_dtypes() -> DtypesSeen | None:
    """The dtypes of the current :func:`using` context, or None."""
    return _SEEN.get()


def dtype_of(node: fx.Node, root: nn.Module, seen: DtypesSeen) -> torch.dtype | None:
    """The dtype ``node`` of ``root``'s trace had in the example forward, where that follows
    from what was seen; None where it does not."""
    if node.op == "placeholder":
        return seen.inputs.get(root, {}).get(str(node.target))
    if node.op == "call_module":
        out = _output_of(root, node.target, seen)
        return out if isinstance(out, torch.dtype) else None
    if node.op == "call_function" and node.target is operator.getitem:
        source, index = node.args[0], node.args[1]
        if isinstance(source, fx.Node) and source.op == "call_module" and isinstance(index, int):
            out = _output_of(root, source.target, seen)
            if isinstance(out, tuple) and -len(out) <= index < len(out):
                item = out[index]
                return item if isinstance(item, torch.dtype) else None
        return None
    first = node.args[0] if node.args else None
    if node.op == "call_method" and node.target in _SHAPE_METHODS:
        return dtype_of(first, root, seen) if isinstance(first, fx.Node) else None
    if node.op == "call_function" and node.target in _SHAPE_FUNCTIONS:
        return dtype_of(first, root, seen) if isinstance(first, fx.Node) else None
    keeps = (node.op == "call_function" and node.target in _KEEP_FUNCTIONS) or (
        node.op == "call_method" and node.target in _KEEP_METHODS
    )
    if not keeps:
        return None
    found: set[torch.dtype | None] = set()
    for arg in (*node.args, *node.kwargs.values()):
        if isinstance(arg, fx.Node):
            found.add(dtype_of(arg, root, seen))
        elif not isinstance(arg, bool | int | float | str | None):
            return None  # a tensor constant, a list: not followed
    if len(found) != 1:
        return None
    dtype = found.pop()
    return dtype if dtype is not None and dtype.is_floating_point else None


def _output_of(root: nn.Module, target: Any, seen: DtypesSeen) -> DtypeTree:
    try:
        child = root.get_submodule(str(target))
    except AttributeError:
        return None
    return seen.outputs.get(child)


def set_conditions(module: nn.Module, read: bool) -> None:
    """After a trace of ``module``: where it read dtypes, the tensor arguments its rewritten
    forward holds for are those seen (:func:`conditions_of`); else none."""
    seen = seen_dtypes() if read else None
    if seen is None or module not in seen.inputs:
        _CONDITIONS.pop(module, None)
        return
    names = list(inspect.signature(type(module).forward).parameters)[1:]
    found = seen.inputs[module]
    _CONDITIONS[module] = tuple((i, n, found[n]) for i, n in enumerate(names) if n in found)


def conditions_of(module: nn.Module) -> DtypeConditions:
    """The dtypes of the tensor arguments ``module``'s last trace holds for (empty: any)."""
    return _CONDITIONS.get(module, ())
