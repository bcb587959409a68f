"""What a CUDA-graph recording of ``cuda_graphs`` may take in, what it baked in, and what it
may change.

A replay runs no Python: it reads the memory the recording read and writes what it wrote. Two
kinds of forward would then go wrong, silently, and are never recorded:

* one called with an argument that is neither a tensor nor a plain value (a cache object that
  its forward appends to, say): the replay would not update the object, and the recording's
  warm-up calls would have updated it three times (:func:`opaque_argument`);
* one that replaces its modules' tensors (``self.cache = torch.cat(...)``, a buffer given a new
  tensor): the replay would go on reading the old ones (:func:`Slots`);
* one that changes its modules' Python state (``self.pos += n``, ``self.kv.append(k)``): the
  replay would not change it, and the recording's warm-up calls would have changed it three
  times (:class:`PlainState`).

What a recording baked in (:mod:`dnntune.torch._baked`: tensors, and the Python state a forward
reads (:class:`PlainState`), such as a submodule's ``training`` flag, an ``eps``, a scale, its
forward hooks) is checked on every replay; the buffers its warm-up calls write are put back
(:mod:`dnntune.torch._buffers`).
"""

from __future__ import annotations

import collections
import copy
import enum
import operator
import types
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from dnntune.torch import _tags
from dnntune.torch._static_caches import key_part, static_tensors

__all__ = [
    "LEAVES",
    "MODULE_OWN",
    "PLAIN_VALUES",
    "ForwardState",
    "PlainState",
    "Slots",
    "opaque_argument",
    "opaque_output",
    "signature",
]


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
#: what a forward's output or arguments hold that needs no looking into: tensors and plain values
LEAVES = (torch.Tensor, *PLAIN_VALUES)
#: nn.Module's own attributes (its registries, hook dicts and the ``training`` flag): what every
#: module keeps in its ``__dict__``, which no forward reads as a setting of its own
MODULE_OWN = frozenset(nn.Module().__dict__)
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


def opaque_argument(flat: Sequence[Any], spec: Any, static_caches: bool = False) -> str | None:
    """The type of the first argument that is neither a tensor, a plain value (number, string,
    dtype, ...) nor a tuple, list or dict of them, or None when there is none.

    ``flat`` and ``spec`` are ``tree_flatten((args, kwargs))``. A library's own container (a
    transformers cache, flattened into its tensors by a registered pytree node) counts: its
    recording would replay into copies of its tensors and never update the object itself.
    ``static_caches``: a cache updated only in place (:mod:`._static_caches`) does not count.
    """
    for item in flat:
        if not isinstance(item, LEAVES) and not (static_caches and static_tensors(item)):
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


def opaque_output(output: Any) -> str | None:
    """The type of the first part of a forward's output that a replay cannot hand out afresh,
    or None. A replay returns its outputs rebuilt around clones of their tensors
    (``tree_map``), which works for tensors, plain values and the containers PyTorch's pytree
    knows (tuples, lists, dicts, named tuples, a library's registered output classes). Any
    other object is a leaf to pytree: it would be returned as the same object on every call,
    its tensors the graph's own memory, overwritten by the next replay."""
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten(output)[0]:
        if not isinstance(leaf, LEAVES):
            return type(leaf).__name__
    return None


def signature(
    flat: list[Any], spec: Any, device_type: str = "cuda"
) -> tuple[Hashable, list[torch.Tensor], torch.device] | None:
    """A call's signature from ``tree_flatten((args, kwargs))`` (or the positional arguments
    and None, when they are all leaves): (key, the tensors, their
    device), or None when it cannot be replayed (a tensor off ``device_type`` or on two
    devices, no tensor, an unhashable value). The key holds the arguments' structure too:
    ``f(x=a, y=b)`` and ``f(y=b, x=a)`` flatten to the same leaves in another order, and
    ``f(x, mask=t)`` and ``f(x, bias=t)`` to the same leaves."""
    key: list[Hashable]
    if spec is None:  # positional leaves only (``cuda_graphs._flatten``): keyed by their count
        key = [("positional", len(flat))]
    else:
        try:
            hash(spec)
            key = [spec]
        except TypeError:  # a TreeSpec that is not hashable (older PyTorch)
            key = [str(spec)]
    tensors: list[torch.Tensor] = []
    caches: list[torch.Tensor] = []  # the tensors of the static caches among the arguments
    device: torch.device | None = None
    for item in flat:
        if isinstance(item, torch.Tensor):
            where = item.device
            if device is None:
                if where.type != device_type:
                    return None
                device = where
            elif where != device:
                return None
            tensors.append(item)
            key.append((item.shape, item.stride(), item.dtype, item.requires_grad))
        elif not isinstance(item, PLAIN_VALUES):
            held = static_tensors(item)
            if held is None:
                # never recorded (``opaque_argument``): keyed by type, so that the signatures
                # refused keep no reference to the object (a cache and its tensors)
                key.append(("opaque", type(item)))
                continue
            # a static cache: replayed only on the memory it was recorded on (no reference)
            caches.extend(held)
            key.append(key_part(item, held))
        else:
            try:
                hash(item)
            except TypeError:
                return None
            key.append(("value", type(item), item))
    if device is None or any(t.device != device for t in caches):
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
            recomputed = recomputed_of(m)
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


def recomputed_of(module: nn.Module) -> set[str]:
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

#: the registries every module has (parameters, buffers, children: ``_baked.Weights``; hooks:
#: :class:`PlainState` reads the forward ones by their sizes)
_MODULE_REGISTRIES = frozenset(nn.Module().__dict__) - {"training"}
#: the hooks a forward call runs: each module's, and PyTorch's global ones
_FORWARD_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOKS = tuple(
    getattr(_nn_module, name)
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks")
    if isinstance(getattr(_nn_module, name, None), dict)
)
#: dnntune's own bookkeeping in a module's ``__dict__`` (its configuration, graph flags), which
#: no forward reads; kept: what forwards do read (a batch-norm fold, a fused Sequential's steps)
_OWN_PREFIX, _OWN_READ = "_dnntune_", frozenset({"_dnntune_fold", "_dnntune_steps"})
_CONTAINERS = (list, dict, set, tuple, collections.deque)


def _user_size(attrs: dict[str, Any]) -> int:
    """How many attributes a module's ``__dict__`` holds, dnntune's own bookkeeping left out."""
    return sum(1 for key in attrs if not key.startswith(_OWN_PREFIX) or key in _OWN_READ)


def _plain(value: Any) -> bool:
    """A value compared by value: a plain value, or a tuple of them (a kernel size)."""
    if isinstance(value, tuple):
        return all(map(_plain, value))
    return isinstance(value, PLAIN_VALUES)


def _contents(container: Any) -> tuple[Any, ...]:
    """What a container holds, by identity (a list that grew, a dict given another tensor)."""
    if isinstance(container, dict):
        return (*container, *map(id, container.values()))
    return tuple(map(id, container))


class PlainState:
    """The Python state of a module tree that a forward may read and a replay cannot follow:
    each module's plain attributes (numbers, strings, flags such as its own ``training``,
    tuples of them) by value; its other lists, dicts, sets and tuples (a list of cached
    tensors, a batch-norm fold) by identity and by what they hold, by identity; and which
    forward hooks are registered, on each module and globally.

    :meth:`unchanged` runs on every replay, on the host's critical path: a few C-level maps over
    flat lists, and shorter where the interpreter allows (:mod:`dnntune.torch._tags`): an attribute
    dict whose version tag has not moved holds the same values, and no forward hook was added
    anywhere while PyTorch's hook-handle counter has not moved (a hook removed changes a dict
    that held one). When a tag moved, the values are compared and, if equal, the tags taken
    again (a forward that sets a flag to the value it had on every call costs the full check,
    never a new recording).
    """

    __slots__ = (
        "_attr_dicts",
        "_attr_versions",
        "_box_dict_versions",
        "_box_dicts",
        "_box_keys",
        "_box_owners",
        "_boxes",
        "_contents",
        "_copies",
        "_dict_contents",
        "_hook_dicts",
        "_hook_id",
        "_hooked",
        "_hooked_contents",
        "_hooks",
        "_keys",
        "_open",
        "_owners",
        "_sizes",
        "_tags",
        "_user_sizes",
        "_values",
    )

    def __init__(self, module: nn.Module, keep_copies: bool = False) -> None:
        """``keep_copies``: also keep shallow copies of the containers, for :meth:`restore`."""
        owners: list[dict[str, Any]] = []
        keys: list[str] = []
        box_owners: list[dict[str, Any]] = []
        box_keys: list[str] = []
        hook_dicts: list[dict[Any, Any]] = list(_GLOBAL_HOOKS)
        attr_dicts: list[dict[str, Any]] = []
        for m in module.modules():
            attrs = m.__dict__
            attr_dicts.append(attrs)
            recomputed = recomputed_of(m)
            hook_dicts.extend(attrs[name] for name in _FORWARD_HOOKS if name in attrs)
            for key, value in attrs.items():
                if key in _MODULE_REGISTRIES or key in recomputed:
                    continue
                if key.startswith(_OWN_PREFIX) and key not in _OWN_READ:
                    continue
                if isinstance(value, torch.Tensor | nn.Module):
                    continue  # tensors and children: :class:`~dnntune.torch._baked.Weights`
                if _plain(value):
                    owners.append(attrs)
                    keys.append(key)
                elif isinstance(value, _CONTAINERS):
                    box_owners.append(attrs)
                    box_keys.append(key)
        self._owners, self._keys, self._hook_dicts = owners, keys, hook_dicts
        self._hooked = [d for d in hook_dicts if d]
        # an attribute added or deleted (read with getattr(self, name, default)); dnntune's own
        # bookkeeping added after the recording (``optimize``'s race of routes) is not one
        self._attr_dicts = attr_dicts
        self._sizes = tuple(map(len, attr_dicts))
        self._user_sizes = tuple(map(_user_size, attr_dicts))
        self._box_owners, self._box_keys = box_owners, box_keys
        self._values = self._read_values()
        self._boxes = self._read_boxes()
        self._copies = [copy.copy(b) for b in self._boxes] if keep_copies else None
        self._hooks = self._read_hooks()
        self._hooked_contents = self._hooks[1]
        self._hook_id = _tags.hook_id()
        self._tags = tags = _tags.tag_reader()
        self._attr_versions = tags(attr_dicts) if tags else None
        # what may change inside a box that is still there: not a tuple's contents; a dict's
        # show in its version tag where there is a reader (one C-level loop for all)
        self._box_dicts = [b for b in self._boxes if tags and type(b) is dict]
        self._box_dict_versions = tags(self._box_dicts) if tags and self._box_dicts else None
        self._dict_contents = tuple(map(_contents, self._box_dicts))
        # lists, sets and deques by their members' identities (a set by equality would miss
        # {2} becoming {2.0}: equal, and another type downstream)
        self._open = [
            b
            for b in self._boxes
            if not isinstance(b, tuple) and not any(b is d for d in self._box_dicts)
        ]
        self._contents = tuple(map(_contents, self._open))

    def _read_values(self) -> tuple[Any, ...]:
        return tuple(map(dict.get, self._owners, self._keys))

    def _read_boxes(self) -> list[Any]:
        return list(map(dict.get, self._box_owners, self._box_keys))

    def _read_hooks(self) -> tuple[tuple[int, ...], tuple[tuple[Any, ...], ...]]:
        # sizes of all (a hook added where there was none), handles of the non-empty ones
        # (one removed and another added); the empty ones cost one C-level len each
        return tuple(map(len, self._hook_dicts)), tuple(map(tuple, self._hooked))

    def unchanged(self) -> bool:
        """No plain attribute has another value, no container was replaced or holds other
        objects, and no forward hook was added or removed since the snapshot."""
        if _tags.hook_id() == self._hook_id:  # no hook added anywhere: one removed shows here
            if tuple(map(tuple, self._hooked)) != self._hooked_contents:
                return False
        elif self._read_hooks() == self._hooks:
            self._hook_id = _tags.hook_id()  # hooks added elsewhere (or added and removed)
        else:
            return False
        if self._tags is None or self._tags(self._attr_dicts) != self._attr_versions:
            if self._read_values() != self._values:
                return False
            if not self._sizes_unchanged():
                return False
            if self._boxes and not all(map(operator.is_, self._read_boxes(), self._boxes)):
                return False
            if self._tags is not None:  # written, not changed
                self._attr_versions = self._tags(self._attr_dicts)
        tags = self._tags
        if self._box_dicts and tags and tags(self._box_dicts) != self._box_dict_versions:
            if tuple(map(_contents, self._box_dicts)) != self._dict_contents:
                return False
            self._box_dict_versions = tags(self._box_dicts)  # written, not changed
        return not self._open or tuple(map(_contents, self._open)) == self._contents

    def _sizes_unchanged(self) -> bool:
        """No attribute was added or deleted but dnntune's own bookkeeping (which no forward
        reads): counted key by key only when a dict's size moved, then taken as it is."""
        sizes = tuple(map(len, self._attr_dicts))
        if sizes == self._sizes:
            return True
        if tuple(map(_user_size, self._attr_dicts)) != self._user_sizes:
            return False
        self._sizes = sizes
        return True

    def changed(self) -> list[str]:
        """The attributes that changed (and "forward hooks" when one was added or removed),
        for a message."""
        out = [
            key
            for key, old, new in zip(self._keys, self._values, self._read_values(), strict=True)
            if old is not new and old != new
        ]
        for key, old, box in zip(self._box_keys, self._boxes, self._read_boxes(), strict=True):
            if box is not old or self._box_changed(old):
                out.append(key)
        if self._read_hooks() != self._hooks:
            out.append("forward hooks")
        if not self._sizes_unchanged():
            out.append("an attribute added or deleted")
        return out

    def _box_changed(self, box: Any) -> bool:
        kept = ((self._box_dicts, self._dict_contents), (self._open, self._contents))
        for boxes, contents in kept:
            for b, held in zip(boxes, contents, strict=True):
                if b is box:
                    return _contents(b) != held
        return False  # a tuple: its contents cannot change

    def restore(self) -> None:
        """Put the plain attributes, the containers and their contents back as they were (a
        recording's warm-up calls changed them; needs ``keep_copies``)."""
        assert self._copies is not None, "PlainState(keep_copies=True) restores"
        for owner, key, value in zip(self._owners, self._keys, self._values, strict=True):
            owner[key] = value
        for owner, key, box, saved in zip(
            self._box_owners, self._box_keys, self._boxes, self._copies, strict=True
        ):
            owner[key] = box
            if isinstance(box, list | collections.deque):
                box.clear()
                box.extend(saved)
            elif isinstance(box, dict | set):
                box.clear()
                box.update(saved)


class ForwardState:
    """What a forward may change besides its outputs and buffers, and a replay would not: its
    modules' tensors (:class:`Slots`) and their Python state (:class:`PlainState`). A recording
    takes one before its warm-up calls (``keep_copies``, to put back) and one after the first
    (a cache built once), and refuses a forward that changed it since (:meth:`refusal`)."""

    __slots__ = ("_plain", "_slots")

    def __init__(self, module: nn.Module, keep_copies: bool = False) -> None:
        self._slots = Slots(module)
        self._plain = PlainState(module, keep_copies=keep_copies)

    def refusal(self) -> str | None:
        """Why a replay could not follow this forward (None: nothing changed since)."""
        replaced = self._slots.replaced()
        if replaced:
            return (
                f"the forward gives {', '.join(replaced[:3])} a new tensor on every call (a "
                "cache it grows?): a replay would read the old one"
            )
        changed = self._plain.changed()
        if changed:
            return f"the forward changes {', '.join(changed[:3])} on every call: a replay would not"
        return None

    def restore(self) -> None:
        """Put the tensors and the Python state back as they were (needs ``keep_copies``)."""
        self._slots.restore()
        self._plain.restore()
