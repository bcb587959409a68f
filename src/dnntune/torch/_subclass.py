"""The classes ``optimize`` puts in place of a module's own, and how they save.

``optimize`` changes what a module runs by swapping its class: for dnntune's module classes
(``DnnTuneConv2d`` for ``nn.Conv2d``, :mod:`dnntune.torch.modules`) or for subclasses made at
run time (:func:`stand_in`: a wrapped forward, a fused ``nn.Sequential``, a rewritten traced
forward). Parameters, buffers and state_dict keys stay as they are, and no forward hook is
involved (any hook sends every call of a module through PyTorch's slower hook path).

Every such class derives from :class:`StandIn` and names the class it stands in for. A module of
one saves (``torch.save``, ``pickle``) as that class, ultimately PyTorch's or the user's own, with
its state less dnntune's (``_dnntune*`` attributes: plans, folds, trace guards, settings; its
CUDA graphs are kept beside the module, never in it): a file never names a class made at run
time, and loading it needs no dnntune. The loaded model runs PyTorch's forward, as it did before
``optimize``; optimize it again to run it on dnntune. ``copy.deepcopy`` and ``copy.copy`` keep
the class, and so the optimized forward, as they would without this.

Every such class also calls its modules under their model's settings where they are called
outside the model's forward (:func:`call_in_model_settings`).
"""

from __future__ import annotations

import copy
import copyreg
import inspect
import threading
from collections.abc import Callable, Hashable
from typing import Any, SupportsIndex

import torch
from torch import nn

from dnntune.errors import NotSupportedError
from dnntune.torch.config import LAYER_CONFIG, enter_scope, exit_scope, scope_in_force

__all__ = [
    "ORIGIN",
    "ScriptNotSupportedError",
    "StandIn",
    "call_in_model_settings",
    "original_class",
    "shared_stand_in",
    "stand_in",
    "wrap_forward",
]

Forward = Callable[..., Any]

#: the class attribute (in a stand-in class's own ``__dict__``) naming the class it stands in for
ORIGIN = "_dnntune_origin"
#: instance attributes with this prefix are dnntune's runtime state, never saved
_OWN_PREFIX = "_dnntune"

#: what object.__reduce_ex__ reconstructs with, protocol 2 and up and below (typeshed's copyreg
#: leaves both out)
_NEWOBJ: Any = copyreg.__newobj__  # type: ignore[attr-defined]
_RECONSTRUCTOR: Any = copyreg._reconstructor  # type: ignore[attr-defined]  # noqa: SLF001

_classes: dict[tuple[type, Hashable], type] = {}
_lock = threading.Lock()


class ScriptNotSupportedError(NotSupportedError, RuntimeError):
    """``torch.jit.script`` of a module that ``optimize`` swapped (also a ``RuntimeError``, as
    TorchScript's own compile errors are, so code that falls back to eager on one catches it)."""


def original_class(cls: type) -> type:
    """The class ``cls`` stands in for, through every stand-in made on top of another: the
    module's class before ``optimize`` (``cls`` itself when it stands in for none)."""
    while True:
        origin = cls.__dict__.get(ORIGIN)
        if origin is None:
            return cls
        cls = origin


def _saved_state(state: Any) -> Any:
    """A module's pickled state without dnntune's attributes (a ``(dict, slots)`` pair too)."""
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        return (_saved_state(state[0]), state[1])
    if isinstance(state, dict):
        return {k: v for k, v in state.items() if not str(k).startswith(_OWN_PREFIX)}
    return state


#: PyTorch's ``nn.Module.__call__`` (``_wrapped_call_impl``), as this module found it
_module_call = nn.Module.__call__
_modules = nn.Module
#: Dynamo reads it as a constant True (a context variable it cannot trace is never reached);
#: one frame, where ``torch.compiler.is_compiling`` is two (every module call pays it). A
#: non-strict ``torch.export``, ``torch.jit.trace`` and ``torch.fx`` run the Python as it is
dynamo_compiling = torch.compiler.is_dynamo_compiling


def call_in_model_settings(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The ``__call__`` of every class ``optimize`` puts in place of a module's own
    (:class:`StandIn`): a call of the module outside its model's forward (``model.layer1[0](x)``
    on its own, a checkpointed block recomputed in the backward pass) runs under the settings
    ``optimize`` bound on it (:data:`~dnntune.torch.config.LAYER_CONFIG`), as it does inside
    that forward; before, under the process's: a fused ``Sequential``, a rewritten block, a
    norm or a ``Conv1D`` stand-in tuned into another override file than its model's (an audit:
    only Conv2d and Linear were bound, each in its own forward).

    In the module's call, not its ``forward``: the forward stays the one ``optimize`` traced,
    wrapped and compares. It is ``nn.Module``'s own call otherwise, its two lines
    (``_wrapped_call_impl``: a ``module.compile()``'s call, else ``_call_impl``, hooks and
    forward) written out rather than called: a call of a small Linear inside its model's
    forward then costs what the check inline in its forward cost (one frame more was 2 % of
    it on the CPU). Where ``nn.Module.__call__`` is patched (``torch.fx``'s tracer records
    module calls so), the patched call runs, with no settings of ours (a recorded program runs
    PyTorch's ops). Inside a model's forward its settings are in force already: one
    context-variable read decides. ``dynamo_compiling`` first: Dynamo cannot read a context
    variable (it takes the check for a constant and inlines PyTorch's call)."""
    if _modules.__call__ is not _module_call:  # patched: torch.fx's tracer
        return _modules.__call__(self, *args, **kwargs)
    if not dynamo_compiling() and scope_in_force() is None:
        bound = self.__dict__.get(LAYER_CONFIG)
        if bound is not None:  # outside its model's forward
            token = enter_scope(bound)
            try:
                return _module_call(self, *args, **kwargs)
            finally:
                exit_scope(token)
    compiled = self._compiled_call_impl
    if compiled is not None:
        return compiled(*args, **kwargs)
    return self._call_impl(*args, **kwargs)


class StandIn:
    """Base (the last, after the module class) of every class ``optimize`` puts in place of a
    module's own: it pickles as the class it stands in for (:func:`original_class`), without
    dnntune's state, and copies as itself, and calls its modules under their model's settings
    (:func:`call_in_model_settings`). A subclass names that class in its :data:`ORIGIN`
    attribute."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # on the class itself: this base comes after nn.Module in the MRO
        cls.__call__ = call_in_model_settings  # type: ignore[method-assign]

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        cls = type(self)
        origin = original_class(cls)
        # the reduction the class would have without this one (object's: the class's own
        # ``__reduce__`` if it has one, else ``copyreg.__newobj__(cls)`` with
        # ``Module.__getstate__``), with the class replaced
        reduced = super().__reduce_ex__(protocol)
        if isinstance(reduced, str):
            return reduced
        func, args, *rest = reduced
        if func is _NEWOBJ and tuple(args) == (cls,):
            # pickle refuses a __newobj__ of another class than the object's own: the same
            # ``object.__new__(origin)`` through the protocol-0 reconstructor (the standard
            # library's, so loading needs no dnntune)
            func, args = _RECONSTRUCTOR, (origin, object, None)
        else:
            func = origin if func is cls else func
            args = tuple(origin if a is cls else a for a in args)
        if rest:
            rest[0] = _saved_state(rest[0])
        return (func, args, *rest)

    def __prepare_scriptable__(self) -> Any:
        """``torch.jit.script`` calls this on every module before it compiles one: a module
        running dnntune's forward cannot be compiled (its Python calls dnntune's plans), and
        before, the script compiler failed deep inside dnntune ("undefined value
        _warn_padding"), naming neither the module nor what to do (new-user audit)."""
        origin = original_class(type(self)).__name__
        raise ScriptNotSupportedError(
            f"torch.jit.script: this {origin} runs dnntune's forward "
            "(dnntune.torch.optimize swapped it), which TorchScript cannot compile. Script the "
            "model before optimize (or a copy of it: copy.deepcopy before optimize, or a "
            "torch.save/torch.load round trip, which saves PyTorch's classes), or record it "
            "with torch.jit.trace, torch.export or torch.compile, which record PyTorch's ops"
        )

    # copy and deepcopy would otherwise go through __reduce_ex__ and lose the class: these are
    # what they do for a module by default (``Module.__getstate__`` / ``__setstate__``); a
    # class with its own ``__copy__``/``__deepcopy__`` keeps it (it comes first in the MRO)
    def __copy__(self) -> Any:
        cls = type(self)
        new: Any = cls.__new__(cls)
        new.__setstate__(self.__getstate__())
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        cls = type(self)
        new: Any = cls.__new__(cls)
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return new


def stand_in(cls: type, attrs: dict[str, Any]) -> type:
    """A subclass of ``cls`` made at run time with ``attrs`` (its ``forward``, markers), named
    as ``cls`` and standing in for it (:class:`StandIn`)."""
    # StandIn last: the class right after the new one in its MRO is ``cls``, and a class with
    # its own ``__reduce_ex__`` or copy methods keeps them
    bases = (cls,) if issubclass(cls, StandIn) else (cls, StandIn)
    forward = attrs.get("forward")
    if forward is not None and _takes_any(forward):
        # a wrapper ``(self, *args, **kwargs)`` names the forward it wraps: ``inspect.
        # signature`` and ``torch.fx.symbolic_trace`` (which makes the model's inputs from the
        # unwrapped forward's parameters) read that one's
        forward.__wrapped__ = cls.forward  # type: ignore[attr-defined]
    # ``__call__`` given here too: a class of the user's with an ``__init_subclass__`` of its
    # own that does not call ``super()``'s never reaches :meth:`StandIn.__init_subclass__`
    own = {ORIGIN: cls, "__module__": cls.__module__, "__call__": call_in_model_settings}
    return type(cls.__name__, bases, {**attrs, **own})


def shared_stand_in(cls: type, key: Hashable, attrs: dict[str, Any]) -> type:
    """:func:`stand_in` made once per (``cls``, ``key``) and reused: two models of one class
    optimized alike keep one class (``torch.func.stack_module_state`` and other code that
    compares classes; new-user audit, session 18). ``key`` must name everything ``attrs``
    holds."""
    with _lock:
        sub = _classes.get((cls, key))
        if sub is None:
            sub = _classes[cls, key] = stand_in(cls, attrs)
    return sub


def wrap_forward(module: nn.Module, marker: str, wrap: Callable[[Forward], Forward]) -> None:
    """Swap ``module``'s class for a subclass whose ``forward`` is ``wrap(original forward)``
    and whose class attribute ``marker`` is True; nothing happens if it already has it. One
    subclass is made per (wrapped class, marker) and reused."""
    cls = type(module)
    if getattr(cls, marker, False):
        return
    with _lock:
        sub = _classes.get((cls, marker))
        if sub is None:
            sub = _classes[cls, marker] = stand_in(
                cls, {"forward": wrap(cls.forward), marker: True}
            )
    module.__class__ = sub


def _takes_any(function: Callable[..., Any]) -> bool:
    """``function`` takes ``*args`` (a wrapper that passes its arguments on)."""
    return any(
        p.kind is inspect.Parameter.VAR_POSITIONAL
        for p in inspect.signature(function).parameters.values()
    )
