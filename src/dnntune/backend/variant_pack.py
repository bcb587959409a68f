"""Variant packs: the caller's ``{tensor or uid: buffer}`` map, checked against the graph.

``normalize_variant_pack`` runs on every ``execute``, so it is kept cheap: what the graph expects
(uids, dims, strides, dtypes) is computed once per graph and cached on it, and a pack that matches
is checked with a few tuple comparisons per tensor. Anything unexpected falls back to the full
check, which produces the error message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dnntune.errors import InvalidValueError
from dnntune.graph.tensor import TensorAttributes

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["as_tensor", "normalize_variant_pack"]

_SPEC_ATTR = "_dnntune_pack_spec"


def as_tensor(value: Any) -> torch.Tensor:
    """A torch tensor from a tensor, a NumPy array or a DLPack-capable object (zero copy)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return torch.from_dlpack(value)
        except Exception:  # NumPy arrays that DLPack refuses (e.g. read-only) go through NumPy
            pass
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise InvalidValueError(
        f"variant pack values must be torch tensors, NumPy arrays or DLPack objects, got "
        f"{type(value).__name__}"
    )


class _PackSpec:
    """What a valid pack holds for one graph, precomputed for cheap per-call checks.

    Each row keeps the tensor with the uid, dims list, strides list and type it had when the spec
    was built, compared by identity on each call: a graph changed since (a tensor added, or
    ``set_dims``/``set_strides``/``set_data_type`` called) is re-read. Dims edited in place on a
    built graph are not seen; the plans were compiled for the old dims anyway.
    """

    __slots__ = ("n_tensors", "rows")

    def __init__(self, graph: OpGraph) -> None:
        from dnntune.graph.tensor import contiguous_strides

        self.n_tensors = len(graph.tensors)
        self.rows = [
            (
                t,
                t.uid,
                t.dims,
                t.strides,
                t.data_type,
                tuple(t.dims),
                # None: row-major, checked with one is_contiguous() call
                None if t.strides == contiguous_strides(t.dims) else tuple(t.strides),
                t.data_type.to_torch() if t.data_type else None,
            )
            for t in graph.io_tensors()
        ]

    def matches(self, graph: OpGraph, pack: Mapping[Any, Any], cuda: bool | None) -> bool | None:
        """True when every tensor is in ``pack`` by uid with exactly the expected dims, strides,
        dtype and device; False when not (or not exactly); None when the graph changed."""
        if len(graph.tensors) != self.n_tensors:
            return None
        ok = True
        for t, uid, dims, strides, data_type, shape, stride, dtype in self.rows:
            if (
                t.dims is not dims
                or t.strides is not strides
                or t.data_type is not data_type
                or t.uid != uid
            ):
                return None
            if not ok:
                continue  # keep checking that the graph is unchanged
            tensor = pack.get(uid)
            ok = not (
                tensor is None
                or tensor.dtype is not dtype  # also rejects NumPy arrays (converted below)
                or tensor.shape != shape
                or (
                    not tensor.is_contiguous()
                    if stride is None
                    else tensor.stride() != stride and tensor.numel() > 1
                )
                or (cuda is not None and tensor.is_cuda is not cuda)
            )
        return ok


def _matches(graph: OpGraph, pack: Mapping[Any, Any], cuda: bool | None) -> bool:
    spec: _PackSpec | None = getattr(graph, _SPEC_ATTR, None)
    try:
        verdict = None if spec is None else spec.matches(graph, pack, cuda)
        if verdict is None:
            spec = _PackSpec(graph)
            setattr(graph, _SPEC_ATTR, spec)
            verdict = spec.matches(graph, pack, cuda)
    except AttributeError:  # a value that is no tensor: the full check says what it is
        return False
    return bool(verdict)


def _by_uid(graph: OpGraph, pack: Mapping[Any, Any]) -> dict[int, torch.Tensor]:
    import torch

    by_uid: dict[int, torch.Tensor] = {}
    for key, value in pack.items():
        if type(key) is int:
            uid = key
        elif isinstance(key, TensorAttributes):
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
        by_uid[uid] = value if type(value) is torch.Tensor else as_tensor(value)
    return by_uid


def normalize_variant_pack(
    graph: OpGraph, pack: Mapping[Any, Any], handle: Handle | None = None
) -> dict[int, torch.Tensor]:
    """``{uid: tensor}`` for the caller's pack, after checking every non-virtual tensor.

    Every non-virtual, non-scalar tensor of the graph must be present with matching dims,
    strides and dtype on the handle's device. Extra uids are accepted (and ignored). A dict
    that already maps uids to matching tensors is returned as is (read it, don't change it).

    Raises:
        InvalidValueError: listing missing uids, or naming the tensor that does not match.
    """
    if not pack:
        raise InvalidValueError(
            "variant pack is empty; pass {tensor or uid: buffer} for every non-virtual tensor"
        )
    cuda = None if handle is None else handle.is_cuda
    if type(pack) is dict and _matches(graph, pack, cuda):
        return pack
    by_uid = _by_uid(graph, pack)
    if _matches(graph, by_uid, cuda):
        return by_uid
    _check(graph, by_uid, handle)  # raises, or accepts what the exact check was too strict for
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
        if handle is not None and tensor.device.type != handle.device.type:
            raise InvalidValueError(
                f"variant pack: {t.describe()} is on {tensor.device}, the handle on {handle.device}"
            )
