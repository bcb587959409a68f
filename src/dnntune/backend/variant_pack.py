"""Variant packs: the caller's ``{tensor or uid: buffer}`` map, checked against the graph."""

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


def normalize_variant_pack(
    graph: OpGraph, pack: Mapping[Any, Any], handle: Handle | None = None
) -> dict[int, torch.Tensor]:
    """``{uid: tensor}`` for the caller's pack, after checking every non-virtual tensor.

    Every non-virtual, non-scalar tensor of the graph must be present with matching dims,
    strides and dtype on the handle's device. Extra uids are accepted (and ignored).

    Raises:
        InvalidValueError: listing missing uids, or naming the tensor that does not match.
    """
    if not pack:
        raise InvalidValueError("variant pack is empty; pass {tensor or uid: buffer} for every "
                                "non-virtual tensor")
    by_uid: dict[int, torch.Tensor] = {}
    for key, value in pack.items():
        if isinstance(key, TensorAttributes):
            if key.uid is None:
                graph.assign_uids()
            uid = key.uid
        elif isinstance(key, int) and not isinstance(key, bool):
            uid = key
        else:
            raise InvalidValueError(
                f"variant pack keys must be TensorAttributes or int uids, got {key!r}"
            )
        assert uid is not None
        by_uid[uid] = as_tensor(value)
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
    return by_uid
