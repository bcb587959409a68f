"""How a replay hands its outputs to the caller afresh, as an eager call would make them: the
graph's output tensors cloned (the next replay overwrites them), rebuilt into the output's
structure, and a library's object in that structure that holds only tensors and plain values
(a transformers ``DynamicCache``, which a causal LM returns from every forward with
``use_cache=True``) copied whole around clones of its tensors, so every call gets an object of
its own, as eager gives, that the caller may fill (a generation loop appends to it) without
touching the recording's. A tensor held in two places is one clone held in both; tensors that
were views of one another's memory are separate clones.

An object that holds anything else (a module, a generator, a lock, a stream, an object of a
class this walk does not know how to copy) cannot be handed out afresh: such a forward is not
recorded (:func:`unfresh_output`).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dnntune.torch._recorded import LEAVES

__all__ = ["FreshOutput", "tensors_of", "unfresh_output"]

#: containers looked through (their items are walked; deepcopy rebuilds them)
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
#: objects a copy must never duplicate or share: state of the process, not of one output
_REFUSED = (nn.Module, torch.Generator, torch.cuda.Stream, torch.cuda.Event, torch.nn.Parameter)
#: how far and how much of an object the walk reads before it gives up (a cache of 100 layers
#: holds a few hundred objects)
_MAX_DEPTH = 8
_MAX_OBJECTS = 20_000


def unfresh_output(output: Any, caches: Sequence[Any] = ()) -> str | None:
    """The type of the first part of a forward's output that a replay cannot hand out afresh,
    or None (see the module's docstring; ``caches``: as :class:`FreshOutput` takes them)."""
    for leaf in tree_flatten(output)[0]:
        if isinstance(leaf, LEAVES) or any(leaf is c for c in caches):
            continue
        if tensors_of(leaf) is None:
            return type(leaf).__name__
    return None


class FreshOutput:
    """The outputs of one recording, handed out afresh on each replay (:meth:`make`)."""

    def __init__(self, static_output: Any, caches: Sequence[Any] = ()) -> None:
        """``caches``: the static caches the recorded call was given (:mod:`._static_caches`),
        which the output hands back as the caller's own objects, not copies."""
        self.single = isinstance(static_output, torch.Tensor)
        self.static_output: Any = static_output if self.single else None
        self.leaves, self.spec = tree_flatten(static_output)
        #: per leaf that is one of ``caches``: its position there (else None); the leaf is
        #: dropped, so that no recording holds a cache
        self.given: list[int | None] = [
            next((i for i, c in enumerate(caches) if c is leaf), None) for leaf in self.leaves
        ]
        given = zip(self.leaves, self.given, strict=True)
        self.leaves = [None if g is not None else leaf for leaf, g in given]
        #: per leaf: None (a tensor or plain value), else the tensors of the object it is
        self.inside: list[list[torch.Tensor] | None] = []
        for leaf in self.leaves:
            found = None if isinstance(leaf, LEAVES) else tensors_of(leaf)
            if not isinstance(leaf, LEAVES) and found is None:
                raise ValueError(f"a {type(leaf).__name__} cannot be handed out afresh")
            self.inside.append(found)
        #: every tensor the output holds, once (a tensor held twice is one clone, held twice)
        every: dict[int, torch.Tensor] = {}
        for leaf, found in zip(self.leaves, self.inside, strict=True):
            for t in [leaf] if isinstance(leaf, torch.Tensor) else found or ():
                every.setdefault(id(t), t)
        self.ids = list(every)
        self.tensors = list(every.values())

    def make(self, caches: Sequence[Any] = ()) -> Any:
        """The outputs for the caller, their tensors clones of the graph's (``caches``: the
        static caches this call was given, handed back where the output holds them)."""
        if self.single:
            return self.static_output.clone()
        # one memo for the whole output: a tensor held twice (an output and the cache) is one
        # clone, held twice, as in the eager call
        memo = dict(zip(self.ids, clones(self.tensors), strict=True))
        out = []
        for leaf, inside, given in zip(self.leaves, self.inside, self.given, strict=True):
            if given is not None:
                out.append(caches[given])
            elif isinstance(leaf, torch.Tensor):
                out.append(memo[id(leaf)])
            elif inside is None:
                out.append(leaf)
            else:
                out.append(copy.deepcopy(leaf, memo))
        return tree_unflatten(out, self.spec)


def clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[t.clone() for t in tensors]``, CUDA tensors copied by one batched kernel
    (``torch._foreach_copy_``) where PyTorch takes them in one: a cache object's two dozen
    tensors otherwise cost a copy launch each (GPT-2's 25 outputs: 25 ``Memcpy DtoD``, 143 µs on
    an H100, session 46). Each clone is laid out as ``clone`` lays it out (``empty_like``'s
    ``preserve_format``, the same rule). A tensor subclass (a parameter handed out, a wrapper
    tensor) is cloned as before, by its own ``clone``."""
    if len(tensors) < 2 or not all(type(t) is torch.Tensor and t.is_cuda for t in tensors):
        return [t.clone() for t in tensors]
    out = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(out, tensors)
    return out


def tensors_of(obj: Any) -> list[torch.Tensor] | None:
    """The tensors ``obj`` holds, if it holds only tensors, plain values, containers of them
    and objects of the same kind; else None."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    try:
        for value in _walk(obj, 0, seen):
            if isinstance(value, torch.Tensor):
                found.setdefault(id(value), value)
    except _Refused:
        return None
    return list(found.values())


class _Refused(Exception):
    """The walk met something a copy cannot hand out afresh."""


def _walk(obj: Any, depth: int, seen: set[int]) -> Iterator[Any]:
    if isinstance(obj, LEAVES):
        yield obj
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if depth > _MAX_DEPTH or len(seen) > _MAX_OBJECTS or isinstance(obj, _REFUSED):
        raise _Refused
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk(key, depth + 1, seen)
            yield from _walk(value, depth + 1, seen)
        return
    if isinstance(obj, _CONTAINERS):
        for value in obj:
            yield from _walk(value, depth + 1, seen)
        return
    cls = type(obj)
    if cls.__module__ == "builtins" or not _plain_class(cls):
        raise _Refused  # a function's closure, a generator, a lock, a file: not data
    state = getattr(obj, "__dict__", None)
    if state is None and not _slots(cls):
        raise _Refused
    for value in (state or {}).values():
        yield from _walk(value, depth + 1, seen)
    for name in _slots(cls):
        if hasattr(obj, name):
            yield from _walk(getattr(obj, name), depth + 1, seen)


def _plain_class(cls: type) -> bool:
    """A class whose instances deepcopy copies member by member: no copy hooks of its own, no
    C-level state (its layout is ``object``'s, plus a dict or slots)."""
    if any(name in vars(k) for k in cls.__mro__[:-1] for name in _HOOKS):
        return False
    return cls.__mro__[-1] is object and all(
        k.__module__ != "builtins" or k is object for k in cls.__mro__
    )


_HOOKS = ("__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__")


def _slots(cls: type) -> list[str]:
    return [
        name
        for k in cls.__mro__
        for name in getattr(k, "__slots__", ())
        if name not in ("__dict__", "__weakref__")
    ]
