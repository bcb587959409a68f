"""What a CUDA-graph recording of ``cuda_graphs`` may take in, what it baked in, and what it
may change.

A replay runs no Python: it reads the memory the recording read and writes what it wrote. Two
kinds of forward would then go wrong, silently, and are never recorded:

* one called with an argument that is neither a tensor nor a plain value (a cache object that
  its forward appends to, say): the replay would not update the object, and the recording's
  warm-up calls would have updated it three times (:func:`opaque_argument`);
* one that replaces its modules' tensors (``self.cache = torch.cat(...)``, a buffer given a new
  tensor): the replay would go on reading the old ones (:func:`Slots`).

What a recording baked in (:class:`Weights`) is checked on every replay, and the buffers its
warm-up calls write are put back (:func:`buffer_snapshot`).
"""

from __future__ import annotations

import collections
import enum
import logging
import operator
import types
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

__all__ = [
    "PLAIN_VALUES",
    "SNAPSHOT_LIMIT_BYTES",
    "Slots",
    "Weights",
    "buffer_snapshot",
    "opaque_argument",
    "put_back",
    "signature",
]

_log = logging.getLogger(__name__)

#: values a signature may hold besides tensors: compared by value, carrying no state
PLAIN_VALUES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    enum.Enum,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
)
_LEAVES = (torch.Tensor, *PLAIN_VALUES)
#: containers of arguments that are looked through (pytree node types; a namedtuple's node type
#: is the ``namedtuple`` function)
_PLAIN_NODES: tuple[Any, ...] = (
    tuple,
    list,
    dict,
    collections.OrderedDict,
    collections.defaultdict,
    collections.namedtuple,
    torch.Size,
)


def _children(spec: Any) -> Sequence[Any]:
    children = getattr(type(spec), "children", None)
    return spec.children() if callable(children) else spec.children_specs


def opaque_argument(flat: Sequence[Any], spec: Any) -> str | None:
    """The type of the first argument that is neither a tensor, a plain value (number, string,
    dtype, ...) nor a tuple, list or dict of them, or None when there is none.

    ``flat`` and ``spec`` are ``tree_flatten((args, kwargs))``. A library's own container (a
    transformers cache, flattened into its tensors by a registered pytree node) counts: its
    recording would replay into copies of its tensors and never update the object itself.
    """
    for item in flat:
        if not isinstance(item, _LEAVES):
            return type(item).__name__
    stack = [spec]
    while stack:
        node = stack.pop()
        if node.is_leaf():
            continue
        if node.type not in _PLAIN_NODES:
            return getattr(node.type, "__name__", str(node.type))
        stack.extend(_children(node))
    return None


def signature(
    flat: list[Any], spec: Any, device_type: str = "cuda"
) -> tuple[Hashable, list[torch.Tensor], torch.device] | None:
    """A call's signature from ``tree_flatten((args, kwargs))``: (key, the tensors, their
    device), or None when it cannot be replayed (a tensor off ``device_type`` or on two
    devices, no tensor, an unhashable value). The key holds the arguments' structure too:
    ``f(x=a, y=b)`` and ``f(y=b, x=a)`` flatten to the same leaves in another order, and
    ``f(x, mask=t)`` and ``f(x, bias=t)`` to the same leaves."""
    try:
        hash(spec)
        key: list[Hashable] = [spec]
    except TypeError:  # a TreeSpec that is not hashable (older PyTorch)
        key = [str(spec)]
    tensors: list[torch.Tensor] = []
    device: torch.device | None = None
    for item in flat:
        if isinstance(item, torch.Tensor):
            if item.device.type != device_type or (device is not None and item.device != device):
                return None
            device = item.device
            tensors.append(item)
            key.append((tuple(item.shape), item.stride(), item.dtype, item.requires_grad))
        elif not isinstance(item, PLAIN_VALUES):
            # never recorded (``opaque_argument``): keyed by type, so that the signatures
            # refused keep no reference to the object (a cache and its tensors)
            key.append(("opaque", type(item)))
        else:
            try:
                hash(item)
            except TypeError:
                return None
            key.append(("value", type(item), item))
    if device is None:
        return None
    return tuple(key), tensors, device


class Slots:
    """Every tensor a module tree holds (parameters, buffers and plain tensor attributes), as
    (owner dict, name, tensor), taken before a recording's warm-up calls: :meth:`replaced`
    names the ones the forward gave another tensor, :meth:`restore` puts them back."""

    __slots__ = ("_entries",)

    def __init__(self, module: nn.Module) -> None:
        entries: list[tuple[dict[str, Any], str, Any]] = []
        for m in module.modules():
            recomputed = _recomputed(m)
            for owner in (m._parameters, m._buffers, m.__dict__):
                for name, value in owner.items():
                    if isinstance(value, torch.Tensor) and name not in recomputed:
                        entries.append((owner, name, value))
        self._entries = entries

    def replaced(self) -> list[str]:
        return [name for owner, name, value in self._entries if owner.get(name) is not value]

    def restore(self) -> None:
        for owner, name, value in self._entries:
            if owner.get(name) is not value:
                owner[name] = value


def _recomputed(module: nn.Module) -> set[str]:
    """Attributes a forward pre-hook of ``torch.nn.utils.weight_norm`` / ``spectral_norm``
    computes afresh before every call from the module's parameters: replaced on every call,
    never read from the call before (inside a recording the computation is recorded too)."""
    names: set[str] = set()
    for hook in module._forward_pre_hooks.values():
        name = getattr(hook, "name", None)
        if isinstance(name, str) and isinstance(hook, _RECOMPUTING_HOOKS):
            names.add(name)
    return names


#: the hook classes of ``torch.nn.utils.weight_norm`` and ``torch.nn.utils.spectral_norm``
_RECOMPUTING_HOOKS = (WeightNorm, SpectralNorm)


class Weights:
    """What a capture baked in: every parameter, buffer, child slot and plain tensor attribute
    of the module, and the storage and version of each CUDA tensor, snapshotted once when the
    graph is recorded.

    ``unchanged`` runs on every call, so it walks flat lists with C-level maps instead of
    ``module.parameters()`` (a recursive generator: about 0.5 ms for a ResNet-50's 371
    tensors, against about 0.07 ms here, measured on the CPU).
    """

    __slots__ = ("_grads", "_keys", "_owners", "_ptrs", "_tensors", "_values", "_versions")

    def __init__(self, module: nn.Module, attributes: bool = True) -> None:
        owners: list[dict[str, Any]] = []
        keys: list[str] = []
        values: list[Any] = []
        for m in module.modules():
            for slots in (m._parameters, m._buffers, m._modules):
                for key, value in slots.items():
                    owners.append(slots)
                    keys.append(key)
                    values.append(value)
            if not attributes:  # a training recording reads parameters where they are
                continue
            recomputed = _recomputed(m)
            for key, value in m.__dict__.items():  # a tensor kept as a plain attribute
                if isinstance(value, torch.Tensor) and key not in recomputed:
                    owners.append(m.__dict__)
                    keys.append(key)
                    values.append(value)
        self._owners, self._keys, self._values = owners, keys, values
        self._tensors = [
            t for t in values if isinstance(t, torch.Tensor) and t.device.type == "cuda"
        ]
        self._ptrs = self._read(_DATA_PTR)
        self._versions = self._read(_VERSION)
        self._grads = self._read(_REQUIRES_GRAD)

    def _read(self, getter: Callable[[torch.Tensor], Any]) -> tuple[Any, ...]:
        return tuple(map(getter, self._tensors))

    def settle(self) -> None:
        """Take the tensors' versions as they are now (after a recording's own writes)."""
        self._versions = self._read(_VERSION)

    def unchanged(self, written_ok: bool = False) -> bool:
        """No slot holds another object, and no tensor has new storage or was written.

        ``written_ok``: in-place writes are fine (a training capture reads the parameters
        where they are, so an optimizer step needs no new recording; nothing is folded in
        training), but which parameters require grad must not have changed.
        """
        current = list(map(dict.get, self._owners, self._keys))
        if not all(map(operator.is_, current, self._values)):
            return False
        if self._read(_DATA_PTR) != self._ptrs:
            return False
        if written_ok:
            return self._read(_REQUIRES_GRAD) == self._grads
        return self._read(_VERSION) == self._versions


_VERSION: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
_DATA_PTR: Callable[[torch.Tensor], int] = torch.Tensor.data_ptr
_REQUIRES_GRAD: Callable[[torch.Tensor], bool] = operator.attrgetter("requires_grad")


#: a recording copies the module's CUDA buffers only up to this many bytes in all
SNAPSHOT_LIMIT_BYTES = 512 << 20


def buffer_snapshot(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Copies of what the warm-up calls may write besides the outputs (a counter or cache the
    forward keeps in a buffer), put back after the recording so that the call changes it once,
    in its replay. Buffers over :data:`SNAPSHOT_LIMIT_BYTES` in all (an LLM's preallocated KV
    cache) are not copied: a cache written at fixed positions is written the same way again by
    the replay."""
    buffers = [b for b in module.buffers() if b.is_cuda]
    total = sum(b.numel() * b.element_size() for b in buffers)
    if total > SNAPSHOT_LIMIT_BYTES:
        _log.info(
            "dnntune.torch: %s's buffers (%.1f GiB) are not copied around its CUDA-graph recording",
            type(module).__name__,
            total / 2**30,
        )
        return []
    return [(b, b.clone(), b._version) for b in buffers]


def put_back(saved: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Put back what :func:`buffer_snapshot` copied, where it was written since: a buffer
    copied back gets a new version, which would make every other recording that reads it
    (batch-norm statistics) record again."""
    with torch.no_grad():
        for buffer, value, version in saved:
            if buffer._version != version:
                buffer.copy_(value)
