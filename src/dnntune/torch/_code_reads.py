"""What a module's Python reads of it: the attribute names that the forward, and the
methods and properties it reaches through ``self``, can read, taken from their code
(:func:`attributes_read`), and which values a :class:`dnntune.torch._trace_guard.TraceGuard`
compares (:func:`plain_value`). Used by :mod:`dnntune.torch._tracing`: state a forward never
reads cannot be frozen by its trace."""

from __future__ import annotations

import dis
import inspect
from typing import Any

from dnntune.torch._recorded import PLAIN_VALUES

__all__ = ["attributes_read", "plain_value"]

_MISSING = object()


def attributes_read(cls: type) -> frozenset[str] | None:
    """The attribute names that the forward of ``cls``, and the methods and properties of
    ``cls`` it reaches through ``self``, can read of the module, or None where that cannot be
    told from their code: ``self`` handed on whole (``helper(self)``, ``getattr(self, k)``,
    ``type(self)``), ``super()`` (its methods read ``self`` unseen), ``__dict__``, a class
    attribute that is neither a function nor a property, or more than 64 functions. Each
    class's answer is kept (a class's code is not expected to change once it is used)."""
    if cls not in _READS:
        _READS[cls] = _attributes_read(cls)
    return _READS[cls]


_READS: dict[type, frozenset[str] | None] = {}


def _attributes_read(cls: type) -> frozenset[str] | None:
    names: set[str] = set()
    seen: set[Any] = set()
    todo: list[Any] = [getattr(cls, "forward", None)]
    while todo:
        function = todo.pop()
        function = inspect.unwrap(function) if callable(function) else function
        code = getattr(function, "__code__", None)
        if code is None:
            return None
        if code in seen:
            continue
        seen.add(code)
        if len(seen) > 64:
            return None
        for inner in _codes(code):
            if _escapes(inner, code.co_varnames[:1]) or _ESCAPES & set(inner.co_names):
                return None
            names.update(inner.co_names)
            for name in inner.co_names:
                attr = inspect.getattr_static(cls, name, _MISSING)
                if attr is _MISSING or plain_value(attr):
                    continue
                if isinstance(attr, staticmethod | classmethod):
                    attr = attr.__func__
                if isinstance(attr, property):
                    todo.extend(f for f in (attr.fget, attr.fset) if f is not None)
                elif inspect.isfunction(attr):
                    if not attr.__module__.startswith("torch."):
                        todo.append(attr)
                elif not isinstance(attr, type):
                    return None  # another descriptor: what it reads is not in view
    return frozenset(names)


#: names whose use reads a module's attributes without naming them
_ESCAPES = frozenset({"super", "__dict__", "__getattribute__", "__getattr__", "vars", "getattr"})
#: the instructions that use ``self`` only to read, call or set one named attribute of it
_ATTRIBUTE_USES = frozenset({"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"})
_SELF_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE"})


def _codes(code: Any) -> list[Any]:
    """``code`` and the code of the functions, lambdas and comprehensions nested in it."""
    found, todo = [], [code]
    while todo:
        c = todo.pop()
        found.append(c)
        todo.extend(k for k in c.co_consts if hasattr(k, "co_code"))
    return found


def _escapes(code: Any, self_name: tuple[str, ...]) -> bool:
    """Whether ``code`` uses ``self`` other than to reach one named attribute of it."""
    if not self_name:
        return False
    instructions = list(dis.get_instructions(code))
    for at, ins in enumerate(instructions):
        value = ins.argval
        hit = value == self_name[0] or (isinstance(value, tuple) and self_name[0] in value)
        if ins.opname.startswith("LOAD_FAST_LOAD_FAST") and hit:
            return True  # two locals at once (3.13): the second may be passed on
        if ins.opname in _SELF_LOADS and hit:
            after = instructions[at + 1].opname if at + 1 < len(instructions) else ""
            if after not in _ATTRIBUTE_USES:
                return True
    return False


def plain_value(value: Any) -> bool:
    """A value the :class:`TraceGuard` compares: a plain value, or a tuple or list of them
    (a kernel size, Swin's window size)."""
    if isinstance(value, tuple | list):
        return all(map(plain_value, value))
    return isinstance(value, PLAIN_VALUES)
