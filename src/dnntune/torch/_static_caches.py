"""Cache objects a CUDA-graph recording takes as they are: a KV cache whose tensors keep their
storage and that a forward updates only in place, as transformers' ``StaticCache`` is.

Any other object among a forward's arguments is never recorded (``_recorded.opaque_argument``):
a replay would not update it. A static cache is the exception a decode step needs. Its keys,
values and fill count are preallocated tensors that the forward writes in place
(``index_copy_`` at the positions held in a device tensor, ``add_`` to the count), so a graph
recorded on one decode step, replayed with the same cache, writes the same memory an eager call
writes, and every step after the prompt passes the same shapes. So a recording:

* keys on the cache's tensors by address, shape, strides and dtype (:func:`static_tensors`): a
  replay runs only on the memory it was recorded on. Another cache object at the same
  addresses (a ``generate()`` call's new cache, given the memory of the last call's) replays
  the same graph; one elsewhere records its own. No recording holds the object or its tensors;
* passes the object to the forward as it is (no copy), puts its tensors back after the
  recording's warm-up calls and capture (:class:`Snapshot`), so the call changes the cache
  once, and refuses a forward that changes the object's Python state (:meth:`Snapshot.refusal`);
* hands the caller's own object back where the output holds it (a causal LM returns the cache
  it was given), as an eager call does.

What counts (:func:`static_tensors`): transformers' ``StaticCache`` whose layers are all its
plain ``StaticLayer`` (a sliding-window layer keeps a count on the host, which a replay would
not advance), each already allocated (the prompt's forward allocates them: it runs as before),
the cache not offloading to the CPU. transformers is never imported here: a cache is one only
where the caller's process imported it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Snapshot", "static_tensors"]

#: the tensors each ``StaticLayer`` holds, in this order: keys, values, and the count of
#: positions written (a device tensor the forward advances in place)
_LAYER_TENSORS = ("keys", "values", "cumulative_length")


def static_tensors(obj: Any) -> list[torch.Tensor] | None:
    """The tensors of ``obj`` when it is a static cache a recording may take as it is (see the
    module's docstring), else None."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return None
    cache_type = getattr(cache_utils, "StaticCache", None)
    layer_type = getattr(cache_utils, "StaticLayer", None)
    if cache_type is None or layer_type is None or not isinstance(obj, cache_type):
        return None
    layers = obj.__dict__.get("layers")
    if not isinstance(layers, list) or not layers or obj.__dict__.get("offloading"):
        return None
    found: list[torch.Tensor] = []
    for layer in layers:
        if type(layer) is not layer_type or layer.__dict__.get("is_initialized") is not True:
            return None
        for name in _LAYER_TENSORS:
            tensor = layer.__dict__.get(name)
            if type(tensor) is not torch.Tensor:
                return None
            found.append(tensor)
    return found


def key_of(tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """What a recording on these tensors replays on: each one's address, shape, strides and
    dtype (no reference to the tensors)."""
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


def _python_state(obj: Any) -> tuple[Any, ...]:
    """An object's attributes and its layers', tensors by identity and the rest by value (a
    list by its members' identities)."""
    out: list[Any] = []
    for owner in (obj, *obj.__dict__.get("layers", ())):
        for name, value in owner.__dict__.items():
            if isinstance(value, torch.Tensor):
                out.append((name, id(value)))
            elif isinstance(value, list | tuple | dict):
                out.append((name, id(value), len(value)))
            else:
                out.append((name, value))
    return tuple(out)


class Snapshot:
    """The static caches among a recorded call's arguments: their tensors' contents and their
    Python state before the recording's warm-up calls, to put back (:meth:`restore`) and to
    tell a forward that changes the objects themselves (:meth:`refusal`)."""

    __slots__ = ("_caches", "_copies", "_state", "_tensors")

    def __init__(self, caches: Sequence[Any]) -> None:
        self._caches = list(caches)
        held = [static_tensors(c) or [] for c in self._caches]
        self._tensors = [t for ts in held for t in ts]
        self._copies = [t.clone() for t in self._tensors]
        self._state = [_python_state(c) for c in self._caches]

    def refusal(self) -> str | None:
        """Why a replay could not follow the forward (None: it changed only the tensors, in
        place)."""
        for cache, state in zip(self._caches, self._state, strict=True):
            if _python_state(cache) != state:
                return (
                    f"the forward changes its {type(cache).__name__}'s attributes, not only its "
                    "tensors in place: a replay would not"
                )
        return None

    def restore(self) -> None:
        """Put the caches' tensors back as they were (the warm-up calls and the capture wrote
        them)."""
        if self._tensors:
            torch._foreach_copy_(self._tensors, self._copies)
        self._copies = []
