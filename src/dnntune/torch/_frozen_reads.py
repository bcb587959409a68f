"""What a trace of a forward froze beyond the module's own attributes, which a rewritten
forward's guard (:class:`dnntune.torch._trace_guard.TraceGuard`) checks on each call: the
containers below the module (a loop over ``self.layers`` is unrolled), the module-level Python
functions the forward calls (their code is inlined), and the plain attributes of its children
that the forward names (``if self.fc.use_res:``). Also the one read no guard can check
cheaply, a plain value of a user's module named through that module (``if mycfg.USE_RES:``),
for which the module is not rewritten (:func:`module_global_read`).

Each was an error against eager after a change made after ``optimize`` (new-user audit,
session 55): a layer appended to a ModuleList was skipped (2.1) and one deleted raised
AttributeError; a helper function reassigned (0.88), a child's flag and a config module's flag
flipped (2.7) changed nothing.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterable
from typing import Any

from torch import nn

from dnntune.torch._code_reads import plain_value
from dnntune.torch._recorded import MODULE_OWN
from dnntune.torch._trace_pitfalls import helpers_of

__all__ = [
    "Held",
    "child_reads",
    "containers_of",
    "global_functions",
    "held_at",
    "module_global_read",
    "read_at",
]

#: the modules whose children (or parameters) a forward iterates over: a trace unrolls the loop
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList, nn.ParameterDict)

#: what a container holds: the names of its children and of its parameters
Held = tuple[tuple[str, ...], tuple[str, ...]]
Path = tuple[str, ...]

#: children's attributes are read to this depth below the module (``self.a.b.flag``)
_CHILD_DEPTH = 2

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
    """The plain attributes of ``module``'s children and grandchildren whose names the forward's
    code holds (``self.fc.use_res``): each as the child's path, the name and its value now."""
    wanted = frozenset(names) - MODULE_OWN
    found: list[tuple[Path, str, Any]] = []

    def walk(parent: nn.Module, path: Path) -> None:
        for name, child in parent.__dict__["_modules"].items():
            if child is None:
                continue
            here = (*path, name)
            attrs = child.__dict__
            for key in sorted((wanted | _method_reads(type(child), wanted)).intersection(attrs)):
                value = attrs[key]
                if not key.startswith("_dnntune") and plain_value(value):
                    found.append((here, key, _snapshot(value)))
            if len(here) < _CHILD_DEPTH:
                walk(child, here)

    walk(module, ())
    return tuple(found)


def _method_reads(cls: type, names: frozenset[str]) -> frozenset[str]:
    """The names that the methods and properties of ``cls`` which ``names`` call read (a
    forward's ``self.k.get_scale()`` runs the child's method, and its trace inlines it: a
    ``self.scale`` it read, changed later, changed nothing; new-user audit, session 55). Not
    ``forward``: calling the child runs it at each call."""
    read: set[str] = set()
    for name in names:
        if name == "forward" or name.startswith("__"):
            continue
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        if isinstance(attr, property):
            attr = attr.fget
        code = getattr(attr, "__code__", None)
        if code is not None and inspect.isfunction(attr):
            read.update(code.co_names)
    return frozenset(read) - MODULE_OWN


def read_at(module: nn.Module, path: Path, key: str) -> Any:
    """The value of attribute ``key`` of the module at ``path`` below ``module`` now (a
    sentinel where either is gone)."""
    found = _below(module, path)
    return _MISSING if found is None else found.__dict__.get(key, _MISSING)


def _snapshot(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def module_global_read(functions: Iterable[Any]) -> str | None:
    """Why a trace of ``functions`` would freeze a plain value of a user's module that they
    name through it (``import mycfg`` then ``if mycfg.USE_RES:``), or None. The standard
    library's and the deep-learning libraries' modules are left out (``math.pi``)."""
    for function in functions:
        names = getattr(function, "__globals__", None)
        code = getattr(function, "__code__", None)
        if names is None or code is None:
            continue
        attrs = frozenset(code.co_names)
        for name in code.co_names:
            value = names.get(name)
            if not isinstance(value, types.ModuleType) or _library(value):
                continue
            for attr in sorted(attrs):
                if plain_value(getattr(value, attr, _MISSING)) and attr != name:
                    return (
                        f"its forward reads {name}.{attr}, a module's plain value, which a "
                        "trace would freeze"
                    )
    return None


def _library(module: types.ModuleType) -> bool:
    top = module.__name__.partition(".")[0]
    return top in sys.stdlib_module_names or top in _LIBRARIES
