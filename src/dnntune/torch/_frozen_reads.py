"""What a trace of a forward froze beyond the module's own attributes.

A rewritten forward's guard (:class:`dnntune.torch._trace_guard.TraceGuard`) checks on each
call: the containers below the module (a loop over ``self.layers`` is unrolled), the
module-level functions the forward calls (their code is inlined; an alias of PyTorch's op,
``ACT = F.gelu``, too), and what of its descendants it names or reads through their methods
(``if self.fc.use_res:``, ``self.k.get_scale()``, a class-level ``MODE``, a method set on the
instance). What no guard can check cheaply keeps the module's own forward
(:func:`frozen_state`, which :func:`._tracing.not_traceable` asks): state held outside the
module behind a global (a user's module, class or object: ``cfg.USE_RES``, ``CFG.res``,
``STATS.calls += 1``, a callable object, ``print``: :func:`global_state_read`), and a
descendant's config object or dict (:func:`frozen_child_state`). The children's methods the
forward calls are scanned as its own code is (:func:`child_methods`).

Each was an error against eager, most after a change made after ``optimize``, some with
nothing changed (new-user audits, session 55: errors of 0.36 to 2.8; a layer appended to a
ModuleList skipped, one deleted raising AttributeError; a counter that stopped counting).
"""

from __future__ import annotations

import builtins
import enum
import functools
import inspect
import sys
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from dnntune.torch._code_reads import attributes_read, plain_value
from dnntune.torch._recorded import MODULE_OWN
from dnntune.torch._trace_pitfalls import helpers_of, method_function

__all__ = [
    "Held",
    "child_methods",
    "child_reads",
    "containers_of",
    "frozen_child_state",
    "frozen_state",
    "global_functions",
    "global_state_read",
    "held_at",
    "read_at",
]

#: the modules whose children (or parameters) a forward iterates over: a trace unrolls the loop
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList, nn.ParameterDict)

#: what a container holds: the names of its children and of its parameters
Held = tuple[tuple[str, ...], tuple[str, ...]]
Path = tuple[str, ...]

#: children's attributes and methods are read to this depth below the module
#: (``self.a.b.c.flag``)
_CHILD_DEPTH = 3

_MISSING = object()

#: top-level packages whose module-level values are constants a forward may name freely
#: (``math.pi``, ``torch.float16``): no user flips them after ``optimize``
_LIBRARIES = frozenset(
    {"torch", "numpy", "transformers", "timm", "torchvision", "einops", "dnntune", "triton"}
)


def containers_of(module: nn.Module) -> tuple[tuple[Path, Held], ...]:
    """Each container below ``module`` (``self.layers``, ``self.encoder.blocks``): its path of
    child names, and what it holds."""
    found: list[tuple[Path, Held]] = []

    def walk(parent: nn.Module, path: Path) -> None:
        for name, child in parent.__dict__["_modules"].items():
            if child is None:
                continue
            here = (*path, name)
            if isinstance(child, _CONTAINERS):
                found.append((here, _held(child)))
            walk(child, here)

    walk(module, ())
    return tuple(found)


def _held(container: nn.Module) -> Held:
    attrs = container.__dict__
    return tuple(attrs["_modules"]), tuple(attrs["_parameters"])


def _below(module: nn.Module, path: Path) -> nn.Module | None:
    for name in path:
        found = module.__dict__["_modules"].get(name)
        if found is None:
            return None
        module = found
    return module


def held_at(module: nn.Module, path: Path) -> Held | None:
    """What the module at ``path`` below ``module`` holds now (None: it is gone)."""
    found = _below(module, path)
    return None if found is None else _held(found)


def global_functions(functions: Iterable[Any]) -> tuple[tuple[dict[str, Any], str, Any], ...]:
    """The module-level functions that ``functions`` (a forward and the methods it reaches)
    call by name, and those that the Python ones call (:func:`helpers_of`): each as the
    globals it is named in, its name, and the function, whose identity a call checks (a trace
    inlined its code, or recorded the op it named)."""
    functions = tuple(functions)
    found: list[tuple[dict[str, Any], str, Any]] = []
    for function in (*functions, *helpers_of(functions)):
        names = getattr(function, "__globals__", None)
        code = getattr(function, "__code__", None)
        if names is None or code is None:
            continue
        for name in code.co_names:
            value = names.get(name)
            # a Python function, and also an alias of PyTorch's (``ACT = F.gelu``: reassigned
            # later, the fused call kept GELU; new-user audit, session 55); not a class or a
            # module, whose names are not reassigned to change what a forward computes
            if callable(value) and not isinstance(value, type | types.ModuleType):
                found.append((names, name, value))
    return _unique(found)


def _unique(
    found: list[tuple[dict[str, Any], str, Any]],
) -> tuple[tuple[dict[str, Any], str, Any], ...]:
    seen: set[tuple[int, str]] = set()
    kept = []
    for names, name, value in found:
        if (id(names), name) not in seen:
            seen.add((id(names), name))
            kept.append((names, name, value))
    return tuple(kept)


def child_reads(module: nn.Module, names: Iterable[str]) -> tuple[tuple[Path, str, Any], ...]:
    """What of ``module``'s descendants (to :data:`_CHILD_DEPTH`) ``names`` (the forward's code
    and the children's methods it calls: ``self.fc.use_res``, ``self.k.get_scale()``) hold: each
    plain attribute, of the instance or of its class (``MODE = 1``), and each method the
    forward calls (set on the instance later, the trace had inlined the old one), as the
    child's path, the name and its value now (:func:`read_at` reads it again)."""
    wanted = frozenset(names) - MODULE_OWN
    found: list[tuple[Path, str, Any]] = []
    for here, child in _descendants(module, _CHILD_DEPTH):
        for key in sorted(wanted):
            if key.startswith(("_dnntune", "__")) or key == "forward":
                continue
            value = _attr(child, key)
            if plain_value(value) or inspect.isfunction(value):
                found.append((here, key, _snapshot(value)))
    return tuple(found)


def _attr(module: nn.Module, key: str) -> Any:
    """``key`` of ``module``'s instance dict, else of its class (a function as itself, not
    bound), else a sentinel; never a parameter, buffer or child."""
    value = module.__dict__.get(key, _MISSING)
    return getattr(type(module), key, _MISSING) if value is _MISSING else value


def child_methods(module: nn.Module, functions: Iterable[Any]) -> tuple[Any, ...]:
    """The methods (and property getters) of ``module``'s children and grandchildren that
    ``functions`` name, other than ``forward`` (calling a child runs its forward at each call):
    ``self.sub.post(h)`` runs the child's method in the trace, which inlines it, so what it does
    is checked as the module's own code is (round-3 audit, session 55: an ``isinstance`` in
    one answered for a proxy, an error of 0.91 with nothing changed). To three levels of
    methods calling methods."""
    names = {n for f in functions for n in getattr(f, "__code__", _NO_CODE).co_names}
    found: list[Any] = []
    for _, child in _descendants(module, _CHILD_DEPTH):
        todo = set(names)
        for _ in range(3):
            more: set[str] = set()
            for name in sorted(todo):
                if name == "forward" or name.startswith("__"):
                    continue
                attr = method_function(inspect.getattr_static(type(child), name, None))
                if (
                    inspect.isfunction(attr)
                    and not attr.__module__.startswith("torch")
                    and attr not in found
                ):
                    found.append(attr)
                    more.update(attr.__code__.co_names)
            todo = more
    return tuple(found)


def _descendants(module: nn.Module, depth: int) -> list[tuple[Path, nn.Module]]:
    found: list[tuple[Path, nn.Module]] = []

    def walk(parent: nn.Module, path: Path) -> None:
        for name, child in parent.__dict__["_modules"].items():
            if child is not None:
                found.append(((*path, name), child))
                if len(path) + 1 < depth:
                    walk(child, (*path, name))

    walk(module, ())
    return found


_NO_CODE = types.SimpleNamespace(co_names=())


def read_at(module: nn.Module, path: Path, key: str) -> Any:
    """The value of attribute ``key`` of the module at ``path`` below ``module`` now (a
    sentinel where either is gone)."""
    found = _below(module, path)
    return _MISSING if found is None else _attr(found, key)


def _snapshot(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def global_state_read(functions: Iterable[Any]) -> str | None:
    """Why a trace of ``functions`` would freeze state held outside the module that they name
    through a global, or None: a plain value or a dict, list or set of a user's module, class
    or object (``import cfg`` then ``if cfg.USE_RES:``, a global config dataclass
    ``CFG.res``, a namespace, ``Consts.SCALE``, a counter ``STATS.calls += 1``), a method of
    such an object or a call of it (its state), or ``print`` (a trace prints once). The
    standard library's and the deep-learning libraries' modules, classes and objects are left
    out (``math.pi``, ``torch.float16``; round-3 audit, session 55: errors of 1.4 to 3.2, a
    counter that stopped counting)."""
    for function in functions:
        names = getattr(function, "__globals__", None)
        code = getattr(function, "__code__", None)
        if names is None or code is None:
            continue
        attrs = frozenset(code.co_names)
        if "print" in attrs and names.get("print", builtins.print) is builtins.print:
            return "its forward prints, which its trace would do once, while tracing"
        for name in code.co_names:
            value = names.get(name, _MISSING)
            if value is _MISSING or inspect.isfunction(value):
                continue  # a helper: checked on its own (helpers_of, global_functions)
            holder = isinstance(value, types.ModuleType | type)
            own = {} if holder else getattr(value, "__dict__", {})
            for attr in sorted(attrs.intersection(own) - {name}):
                # a data holder's own attribute, whatever its class (a SimpleNamespace's)
                if plain_value(own[attr]) or isinstance(own[attr], dict | list | set):
                    return f"its forward reads {name}.{attr}, which a trace would freeze"
            if _from_library(value) or isinstance(value, functools.partial):
                continue
            if not holder and callable(value):
                return f"its forward calls {name}, an object whose state a trace would freeze"
            for attr in sorted(attrs - {name}):
                held = inspect.getattr_static(value, attr, _MISSING)
                method = not holder and inspect.isfunction(held)
                if method or plain_value(held) or isinstance(held, dict | list | set):
                    return f"its forward reads {name}.{attr}, which a trace would freeze"
    return None


def _from_library(value: Any) -> bool:
    """Whether ``value`` (a module, a class, a function or an object) comes from the standard
    library or a deep-learning library: constants there are not flipped by users."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    elif isinstance(value, type) or (callable(value) and hasattr(value, "__module__")):
        name = getattr(value, "__module__", None) or ""
    else:
        name = type(value).__module__
    top = name.partition(".")[0]
    return top in sys.stdlib_module_names or top in _LIBRARIES or top == "builtins"


def frozen_child_state(module: nn.Module, names: Iterable[str]) -> str | None:
    """Why a trace would freeze state of a descendant that the forward names, or None: an
    attribute holding other values inside it, which no guard compares by value (a config
    object, ``if self.sub.cfg.flag:``; a dict, ``self.sub.opts["res"]``; round-3 audit,
    session 55: errors of 2.1 to 2.3), as such an attribute of the module itself is."""
    wanted = frozenset(names) - MODULE_OWN
    for path, child in _descendants(module, _CHILD_DEPTH):
        attrs = child.__dict__
        for key in sorted(wanted.intersection(attrs)):
            value = attrs[key]
            if key.startswith("_") or plain_value(value) or callable(value):
                continue
            if isinstance(value, nn.Module | torch.Tensor):
                continue
            where = ".".join((*path, key))
            return f"its forward reads {where} ({type(value).__name__}), which a trace would freeze"
    return None


#: global values a trace bakes in where a forward names them: flags, tables, shapes and
#: dtypes (``SHAPE = (2, 4)``, ``OUT_DTYPE = torch.float32``), an enum, None (``BACKEND``)
_FROZEN_GLOBALS = (
    bool,
    int,
    float,
    str,
    dict,
    list,
    set,
    tuple,
    enum.Enum,
    torch.dtype,
    type(None),
)


def frozen_state(module: nn.Module, functions: tuple[Any, ...]) -> str | None:
    """Why a trace could freeze state the guard does not check, or None: an
    attribute that holds other values inside it (a config object, a dict: ``if
    self.config.residual:``), or a global plain value the forward names (``if USE_RES:``).
    A branch on either was baked in, and flipping it later changed nothing (new-user audit,
    session 15: an error of 3.9). Also a plain value of a user's module that the forward
    names through the module (``if cfg.USE_RES:``, :func:`global_state_read`),
    such globals read by a module-level helper it calls, a closure's variables, a
    ``torch.backends`` flag, or a tensor kept outside the module's buffers (session 55's
    audits: errors of 0.1 to 7.5 after a change). ``functions``: the forward, the methods it
    reaches, and the children's methods and module-level helpers it calls (what a trace runs:
    :func:`._tracing.not_traceable` finds them)."""
    read = attributes_read(type(module))
    for key, value in module.__dict__.items():
        if key in MODULE_OWN or key.startswith("_dnntune"):
            continue
        if isinstance(value, nn.Module) or plain_value(value):
            continue
        if read is not None and key not in read:
            continue  # never read by the Python a trace runs (transformers' LlamaMLP.config)
        if isinstance(value, torch.Tensor):  # a buffer is a proxy; this one is a constant
            return (
                f"it keeps the tensor {key!r} outside its buffers, whose values a trace "
                "would freeze"
            )
        return f"it keeps {key!r} ({type(value).__name__}), whose contents a trace would freeze"
    for function in functions:
        code = function.__code__
        if set(code.co_freevars) - {"__class__"}:  # ``__class__``: a method's ``super()``
            return (
                "its forward reads variables of an enclosing function (a closure), which a "
                "trace would freeze"
            )
        names = getattr(function, "__globals__", {})
        if "backends" in code.co_names and names.get("torch") is torch:
            return "its forward reads torch.backends flags, which a trace would freeze"
        for name in code.co_names:
            value = names.get(name, _MISSING)
            if isinstance(value, _FROZEN_GLOBALS):
                # a flag, or a table of them (``CFG["shortcut"]``), in the forward, a method
                # or a module-level helper it calls: a trace bakes in the branch it took
                return f"its forward reads the global {name!r}, which a trace would freeze"
    names = {n for f in functions for n in f.__code__.co_names}
    cls = type(module)
    for name in sorted(names - module.__dict__.keys()):
        held = inspect.getattr_static(cls, name, _MISSING)
        if isinstance(held, dict | set) or (isinstance(held, list) and not plain_value(held)):
            # a class-level table changed in place (``Model.TABLE["s"] = 3.0``; round-3
            # audit, session 55: an error of 2.5), as an instance's dict is
            return f"its class keeps {name!r} ({type(held).__name__}), which a trace would freeze"
    return global_state_read(functions) or frozen_child_state(module, names)
