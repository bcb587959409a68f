"""The wrappers transformers puts around a layer's forward that a trace may pass.

transformers 5.2x wraps its decoder layers' forwards twice:

* ``@deprecate_kwarg("past_key_values", ..., new_name="cache")`` renames (or only warns
  about) one keyword, then calls the forward;
* ``GradientCheckpointingLayer.__init_subclass__`` wraps ``forward`` in
  ``forward_with_checkpointing``, which checkpoints the call while the layer trains with
  ``gradient_checkpointing`` set and gradients on, and otherwise calls the forward.

For every call that passes no old keyword, and while the layer does not checkpoint, each is
the forward itself, so a trace of the forward stands for those calls; any other call runs the
module's own, wrapped forward (:class:`._trace_guard.TraceGuard`). Any other wrapper or
decorator still keeps a forward from being rewritten: what it does is not known.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Wrappers", "is_renaming_decorator", "wrappers_of"]

#: (transformers' module, the wrapper function's name) of each known wrapper
_RENAMING = ("transformers.utils.deprecation", "wrapped_func")
_CHECKPOINTING = ("transformers.modeling_layers", "forward_with_checkpointing")


class Wrappers(NamedTuple):
    """The known wrappers around a forward."""

    #: the old keywords the ``deprecate_kwarg`` wrappers rename, outermost first
    renamed: tuple[str, ...] = ()
    #: wrapped by ``forward_with_checkpointing``
    checkpointing: bool = False


def _is(code: Any, wrapper: tuple[str, str]) -> bool:
    source = getattr(sys.modules.get(wrapper[0]), "__file__", None)
    return source is not None and code.co_filename == source and code.co_name == wrapper[1]


def wrappers_of(function: Callable[..., Any]) -> Wrappers | None:
    """The known wrappers around ``function`` (none for a plain function); None where a
    wrapper (a function with ``__wrapped__``) is anything else."""
    renamed: list[str] = []
    checkpointing = False
    layer: Any = function
    while hasattr(layer, "__wrapped__"):
        code = getattr(layer, "__code__", None)
        if code is None:
            return None
        if _is(code, _CHECKPOINTING):
            checkpointing = True
        elif _is(code, _RENAMING):
            cells = dict(zip(code.co_freevars, layer.__closure__ or (), strict=False))
            old = cells.get("old_name")
            value = old.cell_contents if old is not None else None
            if not isinstance(value, str):
                return None
            renamed.append(value)
        else:
            return None
        layer = layer.__wrapped__
    return Wrappers(tuple(renamed), checkpointing)


def is_renaming_decorator(node: ast.expr) -> bool:
    """Whether a decorator's source is a call of ``deprecate_kwarg`` (by any qualified name)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "deprecate_kwarg"
