"""The plain attributes of a model's modules that ``optimize``'s own forwards may change (a call
counter ``self.calls += 1``, a step number, a flag the first call sets): recorded before
``optimize`` changes anything and put back when it returns or raises, so that only the user's
forwards change them (new-user audit: a counter read 1,417 after ``optimize``). The buffers
are put back by value the same way (:mod:`dnntune.torch._buffers`).

Only immutable values are recorded: numbers, strings, bytes, None, and tuples and frozensets
of them. A list or dict the forward fills is not put back: copying it back could undo state
the model keeps on purpose (a cache warmed once) or break what else refers to it (another
module holding the same list); a value that is a tensor is a buffer's business or the
model's own cache. (A CUDA-graph recording's warm-up calls have a put-back of their own,
:class:`dnntune.torch._recorded.ForwardState`, which takes lists and dicts too: a forward that
changes them on every call is not recorded, so its warm-up's changes are undone.)
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from dnntune.torch._recorded import MODULE_OWN

__all__ = ["PlainAttributes"]

#: the immutable values recorded, and tuples and frozensets of them
_SCALARS = (int, float, bool, str, bytes, type(None))
_MISSING = object()


def _scalar(value: Any) -> bool:
    if isinstance(value, tuple | frozenset):
        return all(map(_scalar, value))
    return isinstance(value, _SCALARS)


def _recorded(name: str) -> bool:
    """Not nn.Module's own nor dnntune's (``_dnntune*``: its settings and flags, which
    ``optimize`` sets and :class:`~dnntune.torch._undo.Undo` puts back). A private name of the
    model's (``self._step``) is its state as much as a public one."""
    return name not in MODULE_OWN and not name.startswith("_dnntune")


class PlainAttributes:
    """Every module's plain attributes (:func:`_scalar` values in its ``__dict__``), as they
    are now; :meth:`put_back` writes back those whose value changed since (or that were
    deleted). It runs once per ``optimize``, never in a forward."""

    __slots__ = ("_saved",)

    def __init__(self, module: nn.Module) -> None:
        self._saved: list[tuple[nn.Module, dict[str, Any]]] = []
        for m in module.modules():  # each module once, however often it is shared
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params():
                # its first forward (inside optimize, which needs the shapes) sets its sizes
                # (in_features, num_features: 0 until then) and they must stay set
                continue
            saved = {k: v for k, v in m.__dict__.items() if _recorded(k) and _scalar(v)}
            if saved:
                self._saved.append((m, saved))

    def put_back(self) -> None:
        """Write back the recorded attributes whose value changed (another type counts: True
        for 1), directly in the module's ``__dict__``, where they were; one that has since
        become a parameter, buffer or child is left to the module."""
        for m, saved in self._saved:
            attrs = m.__dict__
            for name, value in saved.items():
                now = attrs.get(name, _MISSING)
                if now is value or (type(now) is type(value) and now == value):
                    continue
                if now is _MISSING and any(
                    name in attrs[r] for r in ("_parameters", "_buffers", "_modules")
                ):
                    continue
                attrs[name] = value
