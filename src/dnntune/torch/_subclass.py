"""Wrapping a module's forward by swapping its class for a subclass made at run time.

Parameters, buffers and state_dict keys stay as they are, ``copy.deepcopy`` keeps the wrapper,
and no forward hook is involved (any hook sends every call of a module through PyTorch's slower
hook path). One subclass is made per (wrapped class, marker) and reused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["wrap_forward"]

Forward = Callable[..., Any]

_classes: dict[tuple[type, str], type] = {}
_lock = threading.Lock()


def wrap_forward(module: nn.Module, marker: str, wrap: Callable[[Forward], Forward]) -> None:
    """Swap ``module``'s class for a subclass whose ``forward`` is ``wrap(original forward)``
    and whose class attribute ``marker`` is True; nothing happens if it already has it."""
    cls = type(module)
    if getattr(cls, marker, False):
        return
    with _lock:
        sub = _classes.get((cls, marker))
        if sub is None:
            attrs = {"forward": wrap(cls.forward), marker: True, "__module__": cls.__module__}
            sub = _classes[cls, marker] = type(cls.__name__, (cls,), attrs)
    module.__class__ = sub
