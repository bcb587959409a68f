"""What a CUDA-graph recording baked in, checked before every replay (:class:`Weights`), and
whether a module's parameters want gradients (:class:`Parameters`), asked on calls with
autograd on: both on the host's critical path, so both walk flat lists with C-level maps and
take the short paths of :mod:`dnntune.torch._tags`."""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import nn

from dnntune.backend import native as _native
from dnntune.torch import _tags
from dnntune.torch._recorded import PlainState, recomputed_of
from dnntune.torch._support import OPTIMIZER_STEPS

__all__ = ["Parameters", "Weights"]


class Weights:
    """What a capture baked in: every parameter, buffer, child slot and plain tensor attribute
    of the module, the storage of each CUDA tensor, the modules' Python state
    (:class:`PlainState`), and the versions of the tensors dnntune derived a value from on the
    host (a batch-norm fold's sources), snapshotted once when the graph is recorded.

    A replay reads every tensor where it is, so an in-place write to a parameter or buffer (an
    optimizer step, ``load_state_dict``, ``copy_``) is read by the next replay as by an
    uncaptured forward: no new recording. What the forward computed on the host from a
    tensor's values and the graph holds as it was is another matter: a batch-norm fold made
    before the recording (``_bn_fold.folded``, refreshed when its sources' versions change)
    is checked by those sources' versions and by the count of optimizer steps (a fused
    optimizer counts no versions), so a change re-records the graph and the fold with it.

    ``unchanged`` runs before every replay, on the host's critical path (a replay after a
    sync pays it in full: an LLM decode step that samples on the host), so it walks flat lists
    with C-level maps instead of ``module.parameters()`` (a recursive generator: about 0.5 ms
    for a ResNet-50's 371 tensors, against about 0.07 ms here, measured on the CPU).
    """

    __slots__ = (
        "_grads",
        "_keys",
        "_owners",
        "_plain",
        "_pointers",
        "_ptrs",
        "_slot_sizes",
        "_slot_versions",
        "_slots",
        "_steps",
        "_tags",
        "_tensors",
        "_upgrade",
        "_values",
        "_versions",
        "_watched",
    )

    def __init__(self, module: nn.Module, attributes: bool = True) -> None:
        owners: list[dict[str, Any]] = []
        keys: list[str] = []
        values: list[Any] = []
        watched: dict[int, torch.Tensor] = {}
        for m in module.modules():
            for slots in (m._parameters, m._buffers, m._modules):
                for key, value in slots.items():
                    owners.append(slots)
                    keys.append(key)
                    values.append(value)
            if not attributes:  # a training recording reads parameters where they are
                continue
            recomputed = recomputed_of(m)
            for key, value in m.__dict__.items():  # a tensor kept as a plain attribute
                if isinstance(value, torch.Tensor) and key not in recomputed:
                    owners.append(m.__dict__)
                    keys.append(key)
                    values.append(value)
            for source in _derived_from(m):
                watched[id(source)] = source
        self._owners, self._keys, self._values = owners, keys, values
        # the dicts that hold the slots, each once: their version tags, where available, say
        # in one C-level map that no slot holds another object
        self._slots = list({id(d): d for d in owners}.values())
        self._tags = _tags.tag_reader()
        self._slot_versions = self._tags(self._slots) if self._tags else None
        self._slot_sizes = tuple(map(len, self._slots))
        self._tensors = tuple(
            t for t in values if isinstance(t, torch.Tensor) and t.device.type == "cuda"
        )
        self._watched = list(watched.values())
        # plain tensors and parameters (a subclass may keep no storage): one C++ loop, once
        # the compiled reader is built. A recording never waits for its first build (seconds:
        # cuda_graph="auto" records PyTorch's forward at once, while optimize's background
        # build runs); until it is there the pointers are read in Python, and the first check
        # that finds them unchanged after it is built takes the reader's snapshot
        plain = all(map(_plain_tensor, values))
        self._pointers = _native.built_pointer_reader() if plain else None
        self._upgrade = plain and self._pointers is None and _native.pointer_reader_pending()
        if self._upgrade:
            _native.prefetch()
        self._ptrs = self._read_pointers()
        self._versions = self._read_versions()
        self._steps = OPTIMIZER_STEPS[0] if self._watched else None
        self._grads = tuple(map(_REQUIRES_GRAD, self._tensors))
        # what else a forward reads: its modules' plain attributes (a submodule's training
        # flag, an eps, a scale), their lists and dicts, and the forward hooks
        self._plain = PlainState(module)

    def _read_pointers(self) -> Hashable:
        if self._pointers is not None:
            return self._pointers(self._tensors)
        return tuple(map(_DATA_PTR, self._tensors))

    def _take_reader(self) -> None:
        """Read the pointers with the compiled reader from now on, if it is built: called
        right after they were found unchanged, so its snapshot is the recording's pointers."""
        read = _native.built_pointer_reader()
        if read is not None:
            self._pointers, self._upgrade = read, False
            self._ptrs = read(self._tensors)
        elif not _native.pointer_reader_pending():
            self._upgrade = False  # it cannot be built here: Python reads them for good

    def _read_versions(self) -> tuple[int, ...]:
        return tuple(map(_VERSION, self._watched))

    def settle(self) -> None:
        """Take the watched tensors' versions as they are now (after a recording's own
        writes)."""
        self._versions = self._read_versions()

    def storage_unchanged(self) -> bool:
        """No slot holds another object and no tensor has new storage: every tensor the graph
        reads from the module is where it was recorded, and alive (this object holds them).
        The cheap first part of :meth:`unchanged` (a few µs): what must hold before a replay
        that is checked in full only after its launch (``cuda_graphs.call``), so that it never
        reads memory a tensor gave up (``model.half()``, then ``torch.cuda.empty_cache()``)."""
        if self._tags is None or self._tags(self._slots) != self._slot_versions:
            current = list(map(dict.get, self._owners, self._keys))
            if not all(map(operator.is_, current, self._values)):
                return False
            if tuple(map(len, self._slots)) != self._slot_sizes:
                return False  # a slot added (read with getattr(self, name, default))
            if self._tags is not None:  # written, not changed
                self._slot_versions = self._tags(self._slots)
        return bool(self._read_pointers() == self._ptrs)

    def unchanged(self, written_ok: bool = False) -> bool:
        """No slot holds another object, no tensor has new storage, no Python state changed,
        and no tensor a host-side value was derived from was written.

        ``written_ok``: such writes are fine too (a training capture folds nothing), but which
        parameters require grad must not have changed.
        """
        if not self.storage_unchanged() or not self._plain.unchanged():
            return False
        if self._upgrade:
            self._take_reader()
        if written_ok:
            return tuple(map(_REQUIRES_GRAD, self._tensors)) == self._grads
        if self._steps is not None and OPTIMIZER_STEPS[0] != self._steps:
            return False
        return self._read_versions() == self._versions


def _derived_from(module: nn.Module) -> Sequence[torch.Tensor]:
    """The tensors whose values dnntune computed something from on the host and keeps (the
    sources of a batch-norm fold, ``_bn_fold.folded``'s cache in the conv's ``__dict__``)."""
    fold = module.__dict__.get("_dnntune_fold")
    return fold[2] if isinstance(fold, tuple) and len(fold) > 2 else ()


def _plain_tensor(value: Any) -> bool:
    """Not a tensor, or a strided plain tensor or parameter: its data pointer is readable
    whenever it has storage (a subclass, a sparse tensor may keep none)."""
    if not isinstance(value, torch.Tensor):
        return True
    return type(value) in (torch.Tensor, nn.Parameter) and value.layout == torch.strided


_VERSION: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
_DATA_PTR: Callable[[torch.Tensor], int] = torch.Tensor.data_ptr
_REQUIRES_GRAD: Callable[[torch.Tensor], bool] = operator.attrgetter("requires_grad")


class Parameters:
    """Whether any parameter of a module tree requires grad, asked on every call with autograd
    on (an eval-mode model called without ``torch.no_grad()``): ``module.parameters()`` walks
    the tree in Python (about 0.5 ms for a ResNet-50), so the parameters are kept as a flat
    list, taken again whenever a parameter or child dict of the tree changed (their version
    tags, where :func:`~dnntune.torch._tags.tag_reader` has a reader; else every call)."""

    __slots__ = ("_dicts", "_flat", "_tags", "_versions")

    def __init__(self) -> None:
        self._dicts: list[dict[str, Any]] = []
        self._flat: list[torch.Tensor] = []
        self._tags = _tags.tag_reader()
        self._versions: Hashable = None

    def any_requires_grad(self, module: nn.Module) -> bool:
        if self._tags is None or not self._dicts or self._tags(self._dicts) != self._versions:
            modules = list(module.modules())
            self._dicts = [m._parameters for m in modules] + [m._modules for m in modules]
            self._flat = [p for m in modules for p in m._parameters.values() if p is not None]
            self._versions = self._tags(self._dicts) if self._tags else None
        return any(map(_REQUIRES_GRAD, self._flat))
