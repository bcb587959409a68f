"""A ``torch.cat`` that joins one tensor to PyTorch's legacy empty tensors, recorded as a copy.

transformers' ``DynamicCache`` starts each layer's keys and values as ``torch.tensor([])`` and
appends with ``torch.cat([self.keys, key_states], dim=-2)``, so the first forward of a causal LM
(``use_cache=True``, its default) concatenates every layer's keys and values onto an empty
tensor. Those are transposed views of the attention's projection, and PyTorch's ``cat`` copies
a non-contiguous input with its batched cat kernel, twice as slow as a copy of the same view:
GPT-2 small at 8x512, 24 such tensors of 6.3 MB, **550 µs** a forward in ``cat`` against
**271 µs** in ``clone`` (H100, device clock, session 47).

``cat`` skips a one-dimensional tensor with no elements whatever the other inputs' sizes (its
legacy rule), and its output is then a new contiguous tensor of the one input's values and
type. Inside a forward that dnntune records, such a call is recorded as a copy of that input
into new contiguous memory (:func:`contiguous_copy`) instead: the same values, shape, strides
and type. GPT-2's recorded forward, its copy kernels: 506 -> 253 µs (H100, session 47, before
the 8-byte copy). Every other call (two inputs with elements, types that ``cat`` would
promote, an ``out=``, a tensor subclass) runs ``cat`` as written. Uncaptured forwards are not
touched: a mode on every call would cost host time that a recording does not.

The mode is entered for the capture only. A ``torch.compile``'d function inside the recorded
forward sees it and compiles again there (Dynamo guards on the mode stack); where that fails
in the capture, the recording is made again without the mode (``_capture.capture_call``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from dnntune.torch._words import as_words

__all__ = ["LoneCatCopies", "compiled_frames", "contiguous_copy", "lone_input"]

_CATS: frozenset[Callable[..., Any]] = frozenset({torch.cat, torch.concat, torch.concatenate})


def lone_input(tensors: Any) -> torch.Tensor | None:
    """The one input of a ``cat`` whose other inputs are all legacy empty tensors (one
    dimension, no elements) of its type and device, or None."""
    if not isinstance(tensors, Sequence) or isinstance(tensors, torch.Tensor):
        return None
    if not all(type(t) is torch.Tensor for t in tensors):
        return None
    full = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    if len(full) != 1 or len(tensors) < 2:
        return None
    (x,) = full
    if x.dim() == 0:
        return None  # cat refuses it; let it say so
    if any(t.dtype != x.dtype or t.device != x.device for t in tensors):
        return None  # cat promotes or refuses: run it as written
    return x


class LoneCatCopies(TorchFunctionMode):
    """While active, a ``cat`` of one tensor and legacy empty ones is a contiguous clone of the
    one (see the module's docstring); ``copies`` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        plain = not (set(kwargs) - {"dim", "axis"}) and len(args) + len(kwargs) <= 2
        if func in _CATS and args and plain:
            x = lone_input(args[0])
            dim = args[1] if len(args) == 2 else kwargs.get("dim", kwargs.get("axis", 0))
            if x is not None and type(dim) is int and -x.dim() <= dim < x.dim():
                self.copies += 1
                return contiguous_copy(x)
        return func(*args, **kwargs)


def contiguous_copy(x: torch.Tensor) -> torch.Tensor:
    """``x.clone(memory_format=torch.contiguous_format)``, its bytes moved eight at a time
    where ``x``'s layout allows (:func:`._words.as_words`). The same bytes, so the same values,
    whatever they are."""
    words = as_words(x)
    if words is not None:
        return words.clone(memory_format=torch.contiguous_format).view(x.dtype)
    return x.clone(memory_format=torch.contiguous_format)


def compiled_frames() -> int:
    """How many frames ``torch.compile`` (Dynamo) has compiled in this process (0 where it was
    never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return int(utils.counters["frames"]["total"])
