"""Python in a forward that a trace answers for its proxies, not for the values a call
passes, and so bakes in the wrong branch without a sign (session 45): such a forward is not
rewritten (:func:`._tracing.not_traceable`).

A trace runs the forward's Python on ``torch.fx`` proxies. A proxy is no tensor
(``isinstance(x, torch.Tensor)`` is False), has every attribute (``hasattr``, ``getattr``),
is callable, is a distinct object for each argument (``x is y``), and raises nothing (a
``try`` never reaches its handler); and the trace runs at one moment, so a global mode read
there (``torch.is_grad_enabled()``) is frozen. Each case below took the other branch than the
module's own forward for some call: errors of 0.86-1.59 on test blocks, and transformers' T5
feed-forward skipped its cast to the float32 ``wo`` and raised. The same holds for the
module-level functions a forward calls (:func:`helpers_of`), whose Python the trace runs too.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["helper_pitfall", "helpers_of", "method_function", "pitfall"]


def pitfall(node: ast.AST) -> str | None:
    """Why ``node`` of a forward's source is answered for a proxy (module docstring), or
    None."""
    if isinstance(node, ast.With | ast.AsyncWith):
        return "its forward has a with-statement (a trace drops the mode it sets)"
    if _asks_if_tensor(node):
        return (
            "its forward asks whether a value is a tensor (isinstance, torch.is_tensor), "
            "which a trace answers no for every traced tensor"
        )
    if isinstance(node, ast.Try | ast.TryStar):
        return (
            "its forward catches exceptions (try), whose handler a trace never runs: a "
            "call that raises there would raise in the rewritten forward"
        )
    if _reads_a_mode(node):
        return (
            "its forward reads a global mode (grad, inference, autocast, deterministic "
            "algorithms, the default dtype), which a trace would freeze"
        )
    if _compares_identities(node):
        return (
            "its forward compares two values' identities (x is y), which a trace answers "
            "for its proxies, not for the tensors a call passes"
        )
    if _asks_a_proxy(node):
        return (
            "its forward asks a value's type or attributes (type, hasattr, getattr, "
            "callable), which a trace answers for the proxy, not the tensor"
        )
    return None


def helpers_of(functions: Iterable[Callable[..., Any]], depth: int = 2) -> tuple[Any, ...]:
    """The module-level Python functions ``functions`` call by name (their globals), and the
    ones those call, to ``depth`` levels; PyTorch's own left out. Also the function of a
    ``functools.partial`` held globally, and the methods of a global class the functions name
    (``U.f(h)``: a static method the trace runs; round-3 audit, session 55: its ``isinstance``
    answered for a proxy, an error of 1.05 with nothing changed)."""
    found: list[Any] = []
    todo = [(f, 0) for f in functions]
    seen = {id(f) for f, _ in todo}

    def add(helper: Any, level: int) -> None:
        if (
            inspect.isfunction(helper)
            and id(helper) not in seen
            and not helper.__module__.startswith("torch")
        ):
            seen.add(id(helper))
            found.append(helper)
            todo.append((helper, level + 1))

    while todo:
        function, level = todo.pop()
        code = getattr(function, "__code__", None)
        if code is None or level >= depth:
            continue
        names = getattr(function, "__globals__", {})
        for name in code.co_names:
            helper = names.get(name)
            if isinstance(helper, functools.partial):
                helper = helper.func
            if isinstance(helper, type) and not helper.__module__.startswith("torch"):
                for attr in code.co_names:
                    add(method_function(inspect.getattr_static(helper, attr, None)), level)
                continue
            add(helper, level)
    return tuple(found)


def method_function(attr: Any) -> Any:
    """The function behind a class attribute: a static or class method's, a property's
    getter, or the attribute itself."""
    if isinstance(attr, staticmethod | classmethod):
        return attr.__func__
    if isinstance(attr, property):
        return attr.fget
    return attr


@functools.lru_cache(maxsize=512)
def helper_pitfall(function: Callable[..., Any]) -> str | None:
    """:func:`pitfall` of any node of a helper function's source, said of the helper (a
    source that cannot be read is no reason: only what a trace would run wrongly is)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        why = pitfall(node)
        if why is not None:
            name = getattr(function, "__qualname__", "a function")
            return f"{name}, which it calls: " + why.removeprefix("its forward ")
    return None


#: the names of the classes whose ``isinstance`` check a proxy fails though the value it
#: stands for passes it
_TENSOR_CLASSES = frozenset({"Tensor", "Parameter", "Buffer"})


def _called_name(node: ast.AST) -> str | None:
    """The name a call ``node`` calls (``f(...)``: f, ``a.b.f(...)``: f), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _asks_if_tensor(node: ast.AST) -> bool:
    """Whether ``node`` is ``isinstance(x, <a tensor class, or a tuple with one>)`` or
    ``torch.is_tensor(x)``: a trace runs it on a proxy, which is no tensor, so it takes the
    branch of a non-tensor for a tensor argument or a parameter (``if isinstance(bias,
    torch.Tensor): h = h + bias`` dropped the bias; T5's feed-forward skipped its cast to the
    float32 ``wo`` and raised)."""
    name = _called_name(node)
    if name == "is_tensor":
        return True
    if name != "isinstance" or not isinstance(node, ast.Call) or len(node.args) != 2:
        return False
    for part in ast.walk(node.args[1]):
        named = part.attr if isinstance(part, ast.Attribute) else getattr(part, "id", None)
        if named in _TENSOR_CLASSES:
            return True
    return False


#: PyTorch's queries of a process-wide or thread-wide mode: a trace bakes in the branch the
#: mode of its own moment took (``if torch.is_grad_enabled(): h = h * 3`` kept ``* 3`` under
#: ``no_grad``, an error of 1.03)
_MODE_QUERIES = frozenset(
    {
        "is_grad_enabled",
        "is_inference_mode_enabled",
        "is_autocast_enabled",
        "is_autocast_cpu_enabled",
        "is_any_autocast_enabled",
        "get_autocast_dtype",
        "get_autocast_gpu_dtype",
        "get_autocast_cpu_dtype",
        "are_deterministic_algorithms_enabled",
        "get_default_dtype",
    }
)


def _reads_a_mode(node: ast.AST) -> bool:
    """Whether ``node`` calls one of :data:`_MODE_QUERIES`."""
    return _called_name(node) in _MODE_QUERIES


def _compares_identities(node: ast.AST) -> bool:
    """Whether ``node`` is ``a is b`` or ``a is not b`` with neither side a constant (``x is
    None`` is the guard's: :func:`none_parameters`): each traced argument is a proxy of its
    own, so ``if key is value:`` took the branch of two tensors for a call that passed one
    tensor twice (an error of 1.59 on a test block)."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
        if isinstance(op, ast.Is | ast.IsNot) and not (
            isinstance(left, ast.Constant) or isinstance(right, ast.Constant)
        ):
            return True
    return False


def _asks_a_proxy(node: ast.AST) -> bool:
    """Whether ``node`` is ``type(x)``, ``hasattr(x, ...)``, ``getattr(x, ...)`` or
    ``callable(x)`` of a local name other than ``self``: of a traced tensor a trace gets the
    proxy's answers (its type; every attribute there, so ``getattr(x, "scale", 1.0)`` became
    ``x.scale`` and the rewritten forward raised; callable), and bakes in the branch they
    lead to."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or not node.args:
        return False
    subject = node.args[0]
    return (
        node.func.id in {"type", "hasattr", "getattr", "callable"}
        and isinstance(subject, ast.Name)
        and subject.id != "self"
    )
