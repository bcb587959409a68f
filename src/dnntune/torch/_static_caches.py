"""Cache objects a CUDA-graph recording takes as they are: a KV cache whose tensors keep their
storage and that a forward updates only in place, as transformers' ``StaticCache`` is.

Any other object among a forward's arguments is never recorded (``_recorded.opaque_argument``):
a replay would not update it. A static cache is the exception a decode step needs. Its keys,
values and fill count are preallocated tensors that the forward writes in place
(``index_copy_`` at the positions held in a device tensor, ``add_`` to the count), so a graph
recorded on one decode step, replayed with the same cache, writes the same memory an eager call
writes, and every step after the prompt passes the same shapes. So a recording:

* keys on the cache's tensors by address, shape, strides and dtype (:class:`Memory`): a
  replay runs only on the memory it was recorded on. A later cache of the same layout moves
  into that memory once the cache it belonged to is gone (:class:`Held`: the module's
  capture state holds the tensors of the last cache each recording was made on, never the
  object), and replays the same graph; one alive at the same time records its own;
* passes the object to the forward as it is (no copy), puts its fill count back after each of
  the recording's warm-up calls (:class:`Snapshot`), so the call advances the cache once, and
  refuses a forward that changes the object's Python state (:meth:`Snapshot.refusal`);
* never launches such a replay before the checks of the module's state: a check that failed
  after the launch would record and replay again on a cache already advanced;
* hands the caller's own object back where the output holds it (a causal LM returns the cache
  it was given), as an eager call does.

What counts (:func:`static_tensors`): transformers' ``StaticCache`` whose layers are all its
plain ``StaticLayer`` (a sliding-window layer keeps a count on the host, which a replay would
not advance), each already allocated (the prompt's forward allocates them, and runs uncaptured
with no warning: :func:`unallocated`), the cache not offloading to the CPU. transformers is
never imported here: a cache is one only where the caller's process imported it.

On by default (session 52, after its GPU tests passed on an H100). ``DNNTUNE_STATIC_CACHE_REPLAY=0``
turns it off: a static cache is then an object argument as any other, never recorded.
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from dnntune import settings

__all__ = [
    "Held",
    "Memory",
    "Snapshot",
    "hold",
    "key_part",
    "move_in",
    "static_tensors",
    "unallocated",
    "without_memory",
]

#: the tensors each ``StaticLayer`` holds, in this order: keys, values, and the count of
#: positions written (a device tensor the forward advances in place)
_COUNT = "cumulative_length"
_LAYER_TENSORS = ("keys", "values", _COUNT)


def _layers(obj: Any) -> tuple[list[Any], type] | None:
    """The layers of ``obj`` and transformers' ``StaticLayer`` when ``obj`` is a
    ``StaticCache`` (not turned off, transformers imported), else None."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None or not settings.static_cache_replay():
        return None
    cache_type = getattr(cache_utils, "StaticCache", None)
    layer_type = getattr(cache_utils, "StaticLayer", None)
    if cache_type is None or layer_type is None or not isinstance(obj, cache_type):
        return None
    layers = obj.__dict__.get("layers")
    return (layers, layer_type) if isinstance(layers, list) else None


def unallocated(obj: Any) -> bool:
    """Whether ``obj`` is a static cache (not turned off) whose layers are not all allocated yet: a
    generation's prompt, whose forward allocates them, runs uncaptured as expected (no
    warning), and the decode steps after it replay."""
    found = _layers(obj)
    return found is not None and any(
        layer.__dict__.get("is_initialized") is not True for layer in found[0]
    )


def static_tensors(obj: Any) -> list[torch.Tensor] | None:
    """The tensors of ``obj`` when it is a static cache a recording may take as it is (see the
    module's docstring), else None."""
    found = _layers(obj)
    if found is None or not found[0] or obj.__dict__.get("offloading"):
        return None
    layers, layer_type = found
    tensors: list[torch.Tensor] = []
    for layer in layers:
        if type(layer) is not layer_type or layer.__dict__.get("is_initialized") is not True:
            return None
        for name in _LAYER_TENSORS:
            tensor = layer.__dict__.get(name)
            if type(tensor) is not torch.Tensor:
                return None
            tensors.append(tensor)
    return tensors


class Memory:
    """Where a static cache's tensors are: each one's address, shape, strides and dtype (no
    reference to the tensors), hashed once (a signature's key is looked up several times a
    call, and a cache of 32 layers has 96 tensors)."""

    __slots__ = ("_hash", "parts")

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.parts = (
            tuple(map(_address, tensors)),
            tuple(map(_shape, tensors)),
            tuple(map(_strides, tensors)),
            tuple(map(_dtype, tensors)),
        )
        self._hash = hash(self.parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is Memory and self._hash == other._hash and self.parts == other.parts

    def __repr__(self) -> str:
        return f"Memory({len(self.parts[0])} tensors)"


_address = torch.Tensor.data_ptr
_strides = torch.Tensor.stride
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")


def key_part(cache: Any, tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """A static cache's part of a signature's key (``_recorded.signature``): its type and its
    tensors' :class:`Memory` (no reference to either the cache or its tensors)."""
    return (_KEY, type(cache), Memory(tensors))


def without_memory(key: Hashable) -> Hashable:
    """A signature's key (``_recorded.signature``) with each static cache's :class:`Memory`
    left out: what a refusal to record is kept under (a refusal holds for the shapes wherever
    the cache is; kept with the addresses, every cache met would add one). The key itself
    where it holds no static cache."""
    if not isinstance(key, tuple) or not any(_cache_part(part) for part in key):
        return key
    return tuple(part[:2] if _cache_part(part) else part for part in key)


def _cache_part(part: Any) -> bool:
    """Whether ``part`` of a key is one :func:`key_part` made."""
    return type(part) is tuple and len(part) == 3 and part[0] == _KEY


#: the first item of a static cache's part of a signature's key
_KEY = "static cache"


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
    """The static caches among a recorded call's arguments: their fill counts and their Python
    state before the recording's warm-up calls, to put the counts back after each call
    (:meth:`restore`) and to tell a forward that changes the objects themselves
    (:meth:`refusal`).

    Only the counts are kept, never a copy of the keys and values (gigabytes at a long
    context): each warm-up call, its count put back after it, writes the positions the call
    itself then writes, with the values it writes there (the same inputs and weights), which
    no call before it reads (the mask hides every position past the count). So a warm-up never
    writes past the end of the cache where the call would not.
    """

    __slots__ = ("_caches", "_copies", "_counts", "_state")

    def __init__(self, caches: Sequence[Any]) -> None:
        self._caches = list(caches)
        self._counts = [
            layer.__dict__[_COUNT] for cache in self._caches for layer in cache.__dict__["layers"]
        ]
        self._copies = [t.clone() for t in self._counts]
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
        """Put the caches' fill counts back as they were (a warm-up call advanced them)."""
        if self._counts:
            torch._foreach_copy_(self._counts, self._copies)


class Held:
    """The memory of the static cache a graph was recorded on, held by the module's capture
    state so that a later cache of the same layout moves into it and replays that graph
    (:meth:`take`) instead of recording one of its own.

    ``generate()`` makes a new ``StaticCache`` every call, and its tensors land wherever the
    allocator puts them. Keyed by its memory, each new cache at new addresses recorded a graph
    (session 52, H100: every one of 8 ``generate()`` calls did, interleaved with other models).
    A recording costs warm-up forwards and a capture; moving in costs one copy of the cache,
    made once per cache (the prompt's keys and values and the counts), on the device.

    Held, the memory is never another cache's: a cache it is taken for keeps it while that
    cache lives (:meth:`free` then says no, and another cache alive at the same time records
    its own graph, as before). The price is one cache's memory, held while the module keeps
    its graphs (``graphs_of(model).clear()`` lets it go).

    On by default since session 53 (``DNNTUNE_STATIC_CACHE_MOVE_IN=0`` turns it off). On an
    H100, ``benchmarks/generate.py --cache static`` recorded 3 graphs in its 16 ``generate()``
    calls with it and 14 without, and ran 5.78x eager per token against 3.54x.
    """

    __slots__ = ("_owner", "layout", "tensors")

    def __init__(self, cache: Any, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        #: what a cache must match to move in: each tensor's shape, strides and dtype, and
        #: the device
        self.layout = _layout(self.tensors)
        self._owner = weakref.ref(cache)

    def owned_by(self, cache: Any) -> None:
        """``cache`` holds this memory now."""
        self._owner = weakref.ref(cache)

    def free(self) -> bool:
        """No live cache holds this memory: the last one it was taken for is gone, or holds
        other tensors now."""
        owner = self._owner()
        if owner is None:
            return True
        mine = set(map(id, self.tensors))
        return not any(
            id(layer.__dict__.get(name)) in mine
            for layer in owner.__dict__.get("layers", ())
            for name in _LAYER_TENSORS
        )

    def fits(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether a cache of these tensors (``static_tensors``) can move into this memory."""
        return len(tensors) == len(self.tensors) and _layout(tensors) == self.layout

    def take(self, cache: Any, tensors: Sequence[torch.Tensor]) -> None:
        """Move ``cache`` (its tensors ``tensors``, which :meth:`fits`) into this memory: its
        contents are copied in, on the current stream, and its layers then hold these tensors
        (the ones it had are dropped). Call while :meth:`free`."""
        torch._foreach_copy_(self.tensors, list(tensors))
        held = iter(self.tensors)
        for layer in cache.__dict__["layers"]:
            for name in _LAYER_TENSORS:
                setattr(layer, name, next(held))
        self.owned_by(cache)


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    return (
        tuple(map(_shape, tensors)),
        tuple(map(_strides, tensors)),
        tuple(map(_dtype, tensors)),
        tuple(t.device for t in tensors),
    )


def _the_cache(flat: Sequence[Any]) -> tuple[Any, list[torch.Tensor]] | None:
    """The one static cache among a call's flattened arguments and its tensors (None where
    there is none, or more than one: those record as they come)."""
    found = [(item, held) for item in flat if (held := static_tensors(item)) is not None]
    return found[0] if len(found) == 1 else None


def hold(held: dict[Hashable, Held], where: Hashable, flat: Sequence[Any], most: int) -> None:
    """After a graph was recorded on the one static cache among ``flat``: hold that memory
    under ``where`` (the call's key without the cache's memory), for later caches to move
    into (the last recording's, where one was held there before); at most ``most`` keys, the
    first held dropped first (a module keeps at most as many graphs).

    Memory held already (the same cache recorded for another call shape: a prompt chunk and
    a decode step) is held as the same :class:`Held`, whose one owner tells every key that
    it is taken; memory that shares only some tensors with held memory is not held."""
    if not settings.static_cache_move_in():
        return
    found = _the_cache(flat)
    if found is None:
        return
    cache, tensors = found
    ids = set(map(id, tensors))
    for memory in held.values():
        shared = [id(t) in ids for t in memory.tensors]
        if all(shared) and len(shared) == len(ids):
            memory.owned_by(cache)
            held[where] = memory
            return
        if any(shared):
            return
    held[where] = Held(cache, tensors)
    while len(held) > most:
        del held[next(iter(held))]


def move_in(
    held: dict[Hashable, Held], where: Hashable, flat: Sequence[Any], wait: Callable[[], object]
) -> bool:
    """Move the one static cache among ``flat`` into the memory held under ``where``, where
    that memory is free and of its layout (``wait``: called first, to order the copy after
    the replays that last used it); whether it moved."""
    memory = held.get(where)
    if memory is None or not memory.free():
        return False
    found = _the_cache(flat)
    if found is None or not memory.fits(found[1]):
        return False
    wait()
    memory.take(*found)
    return True
