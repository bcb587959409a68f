"""What a traced forward may change that is not a tensor, put back after each trace: its
modules' Python state (attribute, parameter and buffer dicts, and the lists, dicts, sets and
deques they hold) and the random number generators its Python code can draw from. Used by
:mod:`dnntune.torch._tracing` around each trace, and by ``optimize`` around the whole call."""

from __future__ import annotations

import collections
import copy
import operator
import random
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["Generators", "PythonState"]

_CONTAINERS = (list, dict, set, collections.deque)


class PythonState:
    """What a forward can change in its modules' Python state: their attribute, parameter and
    buffer dicts, and the lists, dicts, sets and deques they hold (by what they hold)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.slots = [(slots, dict(slots)) for m in modules for slots in _slots(m)]
        self.boxes = [
            (box, copy.copy(box))
            for m in modules
            for key, box in m.__dict__.items()
            if isinstance(box, _CONTAINERS) and not key.startswith("_")
        ]

    def put_back(self) -> bool:
        """Restore what changed; True if anything had."""
        changed = False
        for slots, before in self.slots:
            # each module's training flag is the trace's own doing (set per mode, put back)
            if slots.keys() != before.keys() or any(
                slots[k] is not v for k, v in before.items() if k != "training"
            ):
                changed = True
                training = slots.get("training")
                slots.clear()
                slots.update(before)
                if training is not None:
                    slots["training"] = training
        for box, held in self.boxes:
            if _held(box) != _held(held):
                changed = True
                if isinstance(box, list):
                    box[:] = held
                    continue
                box.clear()
                if isinstance(box, collections.deque):
                    box.extend(held)
                else:  # a dict or a set
                    box.update(held)
        return changed


def _held(box: Any) -> tuple[int, ...]:
    """What a container holds, by identity (keys and values for a dict)."""
    if isinstance(box, dict):
        return (*map(id, box), *map(id, box.values()))
    return tuple(map(id, box))


def _slots(module: nn.Module) -> tuple[dict[str, Any], ...]:
    """The dicts a forward can set a module's state in: attributes, parameters, buffers."""
    return (module.__dict__, module._parameters, module._buffers)


class Generators:
    """The random number generators a forward's Python code can draw from while it is traced
    (the draw then decides Python control flow, which the trace freezes): Python's ``random``,
    NumPy's global one (if NumPy is loaded), PyTorch's default CPU and (initialized) CUDA
    generators, and generators the modules keep as attributes (``random.Random``,
    ``torch.Generator``, NumPy's ``Generator`` and ``RandomState``). An op on a traced tensor
    (``torch.rand_like(x)``, dropout) is recorded, not run, so it draws nothing here."""

    def __init__(self, modules: list[nn.Module]) -> None:
        numpy = sys.modules.get("numpy")
        self.generators: list[_Generator] = [
            (random.getstate, random.setstate, operator.eq),
            (torch.get_rng_state, torch.set_rng_state, torch.equal),
        ]
        if torch.cuda.is_initialized():
            self.generators.append(
                (torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all, _same)
            )
        if numpy is not None:
            self.generators.append((numpy.random.get_state, numpy.random.set_state, _same))
        for m in modules:
            for value in m.__dict__.values():
                generator = _generator(value, numpy)
                if generator is not None:
                    self.generators.append(generator)
        self.states = [get() for get, _, _ in self.generators]

    def put_back(self) -> bool:
        """Restore every generator that drew; True if any had."""
        drawn = False
        for (get, put, same), state in zip(self.generators, self.states, strict=True):
            if not same(get(), state):
                drawn = True
                put(state)
        return drawn


#: a generator's state: how to read it, restore it, and compare two of them
_Generator = tuple[Callable[[], Any], Callable[[Any], Any], Callable[[Any, Any], Any]]


def _generator(value: Any, numpy: Any) -> _Generator | None:
    """How to read, restore and compare ``value``'s state if it is a random number
    generator, else None."""
    if isinstance(value, random.Random):
        return value.getstate, value.setstate, operator.eq
    if isinstance(value, torch.Generator):
        return value.get_state, value.set_state, torch.equal
    if numpy is not None and isinstance(value, numpy.random.RandomState):
        return value.get_state, value.set_state, _same
    if numpy is not None and isinstance(value, numpy.random.Generator):
        bits = value.bit_generator
        return (lambda: bits.state), (lambda state: setattr(bits, "state", state)), _same
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two generator states are equal (tuples, lists and dicts of numbers, strings,
    tensors and NumPy arrays)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "shape") and hasattr(a, "dtype"):  # a NumPy array (its == is elementwise)
        return a.shape == getattr(b, "shape", None) and bool((a == b).all())
    return bool(a == b)
