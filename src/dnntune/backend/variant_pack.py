"""Variant packs: the caller's ``{tensor or uid: buffer}`` map, checked against the graph.

``normalize_variant_pack`` runs on every ``execute``, so it is kept cheap: what the graph expects
(uids, dims, strides, dtypes) is computed once per graph and cached on it, and a pack that matches
is checked with a few tuple comparisons per tensor. Anything unexpected falls back to the full
check, which produces the error message.

An output buffer must not share memory with an input or another output (RFC 6.3; the rules,
and the one exact in-place write they allow, are in ``pack_aliasing.py``). The check runs again
only when the buffers' addresses change, so a pack of the same buffers pays a data-pointer read
per tensor.
"""

from __future__ import annotations

import operator
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.backend.pack_aliasing import Aliasing
from dnntune.errors import InvalidValueError
from dnntune.graph.tensor import TensorAttributes, contiguous_strides

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "MisalignedPointers",
    "PointerPacks",
    "as_tensor",
    "gather_keys",
    "handle_place",
    "normalize_variant_pack",
]

_SPEC_ATTR = "_dnntune_pack_spec"


def as_tensor(value: Any) -> torch.Tensor:
    """A torch tensor from a tensor, a NumPy array or a DLPack-capable object (zero copy)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and min(value.strides, default=0) < 0:
        # torch (2.13) takes such an array through DLPack by aborting the process, where no
        # ``except`` can catch it (new-user audit, session 55)
        raise InvalidValueError(
            f"a NumPy array with negative strides {value.strides} (a reversed view such as "
            "a[::-1]) cannot be read zero-copy; pass a copy, e.g. numpy.ascontiguousarray(array)"
        )
    if hasattr(value, "__dlpack__"):
        try:
            return torch.from_dlpack(value)
        except Exception:  # NumPy arrays that DLPack refuses (e.g. read-only) go through NumPy
            pass
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            try:
                return torch.from_numpy(value)
            except (TypeError, ValueError) as exc:  # another byte order, a dtype torch lacks
                raise InvalidValueError(
                    f"a NumPy array of dtype {value.dtype.str!r} cannot be read zero-copy "
                    f"({exc}); convert it first, e.g. array.astype(array.dtype.newbyteorder('='))"
                    " for another byte order"
                ) from None
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise InvalidValueError(
        f"variant pack values must be torch tensors, NumPy arrays or DLPack objects, got "
        f"{type(value).__name__}"
    )


class MisalignedPointers(Exception):
    """A call's addresses break the alignment a plan was built for; ``pointers``: all of
    them, as ints, in the caller's order."""

    def __init__(self, pointers: tuple[int, ...]) -> None:
        super().__init__("a pointer breaks the plan's alignment")
        self.pointers = pointers


class PointerPacks:
    """``{uid: data pointer}`` packs of one plan, each built once per set of buffer addresses.

    An engine that takes raw pointers (cuDNN's variant pack) asks for the pack of this call's
    addresses: the same buffers again (a model's weights, a caching allocator's reused blocks)
    get the dict built before. The key is the addresses themselves, never a tensor's identity,
    so a buffer freed and reallocated elsewhere gets its own pack, and one reallocated at the
    same address gets a pack that is right for it too. Dims and strides are the caller's to
    have checked (the plan was built for them). Bounded: emptied when ``LIMIT`` packs are held.

    The addresses come in the caller's order (``uids``: the uid of each position; a position
    whose uid is None is not the plan's and is left out of the pack), as a tuple of ints or as
    the native helper's bytes (8 per address): no per-call reordering either way.
    """

    #: packs kept at most (a model with fresh activations every call cycles through addresses)
    LIMIT = 64

    __slots__ = ("_align", "_constants", "_packs", "_uids")

    def __init__(
        self,
        uids: tuple[int | None, ...],
        constants: Mapping[int, int] | None = None,
        align: int = 1,
    ) -> None:
        self._uids = uids
        self._constants = dict(constants or {})
        self._packs: dict[tuple[int, ...] | bytes, dict[int, int]] = {}
        #: the alignment, in bytes, the plan was built for (checked where a pack is made)
        self._align = align

    def get(self, pointers: tuple[int, ...] | bytes) -> dict[int, int]:
        """The pack for ``pointers`` (one per uid, in order); never mutate it.

        Raises:
            MisalignedPointers: a pointer of the plan's breaks the alignment it was built for
                (no pack is made: the caller runs the plan on aligned copies)
        """
        pack = self._packs.get(pointers)
        if pack is None:
            values = (
                struct.unpack(f"{len(pointers) // 8}Q", pointers)
                if type(pointers) is bytes
                else pointers
            )
            align, uids = self._align, self._uids
            if align > 1 and any(
                u is not None and p % align for u, p in zip(uids, values, strict=True)
            ):
                raise MisalignedPointers(tuple(values))
            pack = dict(self._constants)
            pack.update((u, p) for u, p in zip(self._uids, values, strict=True) if u is not None)
            if len(self._packs) >= self.LIMIT:
                self._packs.clear()  # the same dict: callers may hold its ``get`` (:attr:`lookup`)
            self._packs[pointers] = pack
        return pack

    @property
    def lookup(self) -> Callable[[tuple[int, ...] | bytes], dict[int, int] | None]:
        """The packs' own ``dict.get``: a hot caller tries it first and calls :meth:`get` only
        on a miss (one Python frame less per call)."""
        return self._packs.get

    def __len__(self) -> int:
        return len(self._packs)


class _PackSpec:
    """What a valid pack holds for one graph, precomputed for cheap per-call checks.

    The spec remembers the graph's revision: a graph changed since (a tensor or node added, a
    tensor's uid, dims, strides, type or flags edited, by a setter, an assignment or in place)
    is re-read.
    """

    __slots__ = ("checked", "data_ptr", "gather", "memory", "n_tensors", "revision", "rows")

    def __init__(self, graph: OpGraph) -> None:
        import torch

        self.n_tensors = len(graph.tensors)
        self.revision = graph.revision
        io = graph.io_tensors()
        #: who may share memory with whom, for the tensors in ``rows``' order
        self.memory = Aliasing(graph, io)
        #: the pack's tensors in ``memory.uids``' order (a tuple)
        self.gather = gather_keys(self.memory.uids)
        self.data_ptr = torch.Tensor.data_ptr
        #: the data pointers (``memory.uids``' order) of the last pack that passed ``memory``
        self.checked: tuple[int, ...] | None = None
        self.rows = [
            (
                t.uid,
                tuple(t.dims),
                # None: row-major, checked with one is_contiguous() call
                None if t.strides == contiguous_strides(t.dims) else tuple(t.strides),
                t.data_type.to_torch() if t.data_type else None,
            )
            for t in io
        ]

    def check_memory(self, by_uid: Mapping[int, Any], place: int | None) -> None:
        """Refuse a pack whose output overlaps another buffer (:class:`Aliasing`), checking
        again only when the buffers' addresses differ from the last pack that passed (with a
        handle: without one the buffers may be on several devices, so each pack is checked)."""
        tensors = self.gather(by_uid)
        pointers = tuple(map(self.data_ptr, tensors))
        if pointers == self.checked and place is not None:
            return
        self.memory.check(tensors, pointers)
        if place is not None:
            self.checked = pointers

    def matches(self, graph: OpGraph, pack: Mapping[Any, Any], place: int | None) -> bool | None:
        """True when every tensor is in ``pack`` by uid with exactly the expected dims, strides,
        dtype and device (:func:`handle_place`: on the handle's CUDA device, or ``is_cpu`` on a
        CPU one: a meta tensor is neither); False when not (or not exactly); None when the graph
        changed."""
        if graph.revision != self.revision or len(graph.tensors) != self.n_tensors:
            return None
        for uid, shape, stride, dtype in self.rows:
            tensor = pack.get(uid)
            if (
                tensor is None
                or tensor.dtype is not dtype  # also rejects NumPy arrays (converted below)
                or tensor.shape != shape
                or (
                    not tensor.is_contiguous()
                    if stride is None
                    else tensor.stride() != stride and tensor.numel() > 1
                )
                or (place is not None and not _placed(tensor, place))
                or tensor.is_neg()  # a lazy view: the full check names it
                or tensor.is_conj()
            ):
                return False
        return True


def handle_place(handle: Handle | None) -> int | None:
    """Where a pack's tensors must be for ``handle``: the index of its CUDA device, -1 for the
    CPU; None without a handle (anywhere)."""
    if handle is None:
        return None
    if not handle.is_cuda:
        return -1
    index = handle.device.index
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return int(index)


def _placed(tensor: Any, place: int) -> bool:
    """``tensor`` is where :func:`handle_place` says: on that CUDA device (the index too: a
    pointer on another GPU is not this device's memory), or on the CPU."""
    return bool(tensor.is_cpu if place < 0 else tensor.is_cuda and tensor.get_device() == place)


def _matching_spec(graph: OpGraph, pack: Mapping[Any, Any], place: int | None) -> _PackSpec | None:
    """The graph's current spec when ``pack`` matches it exactly, else None."""
    spec: _PackSpec | None = getattr(graph, _SPEC_ATTR, None)
    try:
        verdict = None if spec is None else spec.matches(graph, pack, place)
        if verdict is None:
            spec = _PackSpec(graph)
            setattr(graph, _SPEC_ATTR, spec)
            verdict = spec.matches(graph, pack, place)
    except AttributeError:  # a value that is no tensor: the full check says what it is
        return None
    return spec if verdict else None


def gather_keys(keys: Sequence[Any]) -> Callable[[Mapping[Any, Any]], tuple[Any, ...]]:
    """``pack -> (pack[k] for k in keys)`` as a tuple, at C speed."""
    if len(keys) == 1:
        (key,) = keys
        return lambda pack: (pack[key],)
    return operator.itemgetter(*keys)


def _int_keys(pack: Mapping[Any, Any]) -> bool:
    return all(type(key) is int for key in pack)


def _by_uid(graph: OpGraph, pack: Mapping[Any, Any]) -> dict[int, torch.Tensor]:
    """``{uid: tensor}`` for the caller's pack: each tensor key is one of this graph's, and a
    tensor given twice (by its TensorAttributes and by its uid) is given the same buffer."""
    import torch

    by_uid: dict[int, torch.Tensor] = {}
    given: dict[int, tuple[Any, Any]] = {}  # uid -> (key, value) as the caller gave them
    scalars = {t.uid: t for t in graph.iter_scalars()}
    for key, value in pack.items():
        if type(key) is int:
            uid = key
        elif key is None:
            # cuDNN frontend's execute skips a None key: its samples key optional tensors
            # (``bias: bias_gpu`` with ``bias = None``) in one dict literal
            continue
        elif isinstance(key, TensorAttributes):
            if not graph.holds(key):
                raise InvalidValueError(_foreign_key_message(graph, key))
            if key.uid is None:
                graph.assign_uids()
            assert key.uid is not None
            uid = key.uid
        elif isinstance(key, int) and not isinstance(key, bool):
            uid = int(key)
        else:
            raise InvalidValueError(
                f"variant pack keys must be TensorAttributes or int uids, got {key!r}"
            )
        if uid in given:
            first_key, first_value = given[uid]
            if first_value is not value:
                raise InvalidValueError(
                    f"variant pack: {_describe_uid(graph, uid)} is given twice, as "
                    f"{_describe_key(first_key)} and as {_describe_key(key)}, with different "
                    "buffers; give each tensor once (by its TensorAttributes or by its uid)"
                )
            continue
        given[uid] = (key, value)
        scalar = scalars.get(uid)
        if scalar is not None:  # its value is the graph's: checked, not bound
            _check_scalar_value(scalar, value)
            continue
        if type(value) is torch.Tensor:
            by_uid[uid] = value
            continue
        if not getattr(getattr(value, "flags", None), "writeable", True):
            _check_writable(graph, uid, value)
        try:
            by_uid[uid] = as_tensor(value)
        except InvalidValueError as exc:
            raise InvalidValueError(f"variant pack: {_describe_uid(graph, uid)}: {exc}") from None
    return by_uid


def _check_scalar_value(scalar: TensorAttributes, value: Any) -> None:
    """A pass-by-value scalar given in the pack, as cuDNN frontend code passes its attention
    scale or epsilon: its value is fixed when the graph is built, so an equal value (in the
    scalar's data type) is accepted and ignored, and another refused (before, any was ignored:
    a ported graph that changed its scale at run time ran the old one; new-user audit)."""
    import torch

    try:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"a tensor of {value.numel()} elements")
            given = value.detach().cpu().item()
        elif hasattr(value, "item"):  # a NumPy scalar or one-element array
            given = value.item()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            given = value
        else:
            raise ValueError(type(value).__name__)
        dtype = scalar.data_type.to_torch() if scalar.data_type is not None else torch.float32
        same = (
            torch.tensor(given, dtype=dtype).item()
            == torch.tensor(scalar.value, dtype=dtype).item()
        )
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise InvalidValueError(
            f"variant pack: {scalar.describe()} is a pass-by-value scalar; the pack gives "
            f"{exc} for it, not a number"
        ) from None
    if not same:
        raise InvalidValueError(
            f"variant pack: {scalar.describe()} is a pass-by-value scalar whose value is fixed "
            f"when the graph is built ({scalar.value!r}); the pack gives {given!r}. dnntune does "
            "not read scalars from the pack: set the new value on the graph and build its plans "
            "again (an equal value is accepted)"
        )


def _check_writable(graph: OpGraph, uid: int, value: Any) -> None:
    """Refuse a read-only NumPy array as an output buffer: converted zero-copy, it would be
    written through (into the bytes object under ``np.frombuffer``, say)."""
    if any(t.uid == uid for t in graph.output_tensors()):
        raise InvalidValueError(
            f"variant pack: {_describe_uid(graph, uid)} is an output, but its buffer is a "
            f"read-only {type(value).__name__} (flags.writeable is False), which execute would "
            "write into; give a writable buffer, e.g. numpy.empty_like(array) or a torch tensor"
        )


def _describe_uid(graph: OpGraph, uid: int) -> str:
    for t in graph.tensors:
        if t.uid == uid:
            return f"tensor {t.name or '?'} (uid {uid})"
    return f"uid {uid}"


def _describe_key(key: Any) -> str:
    if isinstance(key, TensorAttributes):
        return f"its TensorAttributes ({key.name or '?'})"
    return f"uid {key!r}"


def _foreign_key_message(graph: OpGraph, key: TensorAttributes) -> str:
    """Why a tensor of another graph cannot key this graph's pack (its uid would pick
    whichever of this graph's tensors has that number)."""
    here = ""
    if key.uid is not None:
        mine = next((t for t in graph.tensors if t.uid == key.uid), None)
        if mine is not None:
            here = f"; uid {key.uid} here is tensor {mine.name or '?'}"
    return (
        f"variant pack: key {key.describe()} is not a tensor of graph {graph.name!r} (it is "
        f"another graph's, or no graph's){here}; key the pack with this graph's tensors (the "
        "ones its builder calls returned) or with their uids"
    )


def normalize_variant_pack(
    graph: OpGraph, pack: Mapping[Any, Any], handle: Handle | None = None
) -> dict[int, torch.Tensor]:
    """``{uid: tensor}`` for the caller's pack, after checking every non-virtual tensor.

    Every non-virtual, non-scalar tensor of the graph must be present with matching dims,
    strides and dtype on the handle's device. Extra uids are accepted (and ignored), and so is
    a ``None`` key, as cuDNN frontend's execute skips it (an optional tensor left out). A dict
    that maps exactly the graph's uids to matching tensors is returned as is (read it, don't
    change it).

    Raises:
        InvalidValueError: listing missing uids, naming the tensor that does not match, naming
            an output and the buffer its memory overlaps, naming a key that is a tensor of
            another graph (its uid could be another tensor's here), or naming a tensor given
            twice (by TensorAttributes and by uid) with different buffers.
    """
    if not isinstance(pack, Mapping):
        raise InvalidValueError(
            f"variant pack must be a dict {{tensor or uid: buffer}}, got {type(pack).__name__}"
            + (" (a list of pairs? pass dict(pairs))" if isinstance(pack, list | tuple) else "")
        )
    if not pack:
        raise InvalidValueError(
            "variant pack is empty; pass {tensor or uid: buffer} for every non-virtual tensor"
        )
    place = handle_place(handle)
    if type(pack) is dict:
        spec = _matching_spec(graph, pack, place)
        # exactly the graph's uids, as ints (``True`` or ``1.0`` equal a uid and hash as it,
        # and go to _by_uid, which refuses them): no other key to check
        if spec is not None and len(pack) == len(spec.rows) and _int_keys(pack):
            spec.check_memory(pack, place)
            return pack
    by_uid = _by_uid(graph, pack)
    spec = _matching_spec(graph, by_uid, place)
    if spec is None:
        _check(graph, by_uid, handle)  # raises, or accepts what the exact check was too strict for
        spec = getattr(graph, _SPEC_ATTR, None) or _PackSpec(graph)
    spec.check_memory(by_uid, place)
    return by_uid


def _check(graph: OpGraph, by_uid: Mapping[int, torch.Tensor], handle: Handle | None) -> None:
    """The full check with messages (size-1 dims may have any stride)."""
    required = graph.io_tensors()
    missing = [t for t in required if t.uid not in by_uid]
    if missing:
        listing = ", ".join(f"{t.uid} ({t.name})" for t in missing)
        raise InvalidValueError(f"variant pack is missing tensor uid(s): {listing}")
    for t in required:
        assert t.uid is not None
        tensor = by_uid[t.uid]
        problem = t.matches_tensor(tensor)
        if problem:
            raise InvalidValueError(f"variant pack: {t.describe()}: {problem}")
        place = handle_place(handle)
        if handle is not None and place is not None and not _placed(tensor, place):
            raise InvalidValueError(
                f"variant pack: {t.describe()} is on {tensor.device}, the handle on {handle.device}"
            )
