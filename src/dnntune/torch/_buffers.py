"""The buffers a CUDA-graph recording's warm-up calls may write (a counter, a cache the forward
keeps in a buffer): copied before them and put back after, so that a call changes them once,
in its replay. ``optimize`` puts back the same way what its own forwards write, lazy buffers
included (:func:`snapshot_when_materialized`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

__all__ = [
    "SNAPSHOT_LIMIT_BYTES",
    "buffer_snapshot",
    "put_back",
    "put_back_values",
    "snapshot_of",
    "snapshot_when_materialized",
    "version_of",
]

_log = logging.getLogger(__name__)

#: a recording copies the module's CUDA buffers only up to this many bytes in all
SNAPSHOT_LIMIT_BYTES = 512 << 20


def buffer_snapshot(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Copies of what the warm-up calls may write besides the outputs (a counter or cache the
    forward keeps in a buffer), put back after the recording so that the call changes it once,
    in its replay (:func:`snapshot_of` the module's CUDA buffers)."""
    return snapshot_of([b for b in module.buffers() if b.is_cuda])


def snapshot_of(
    buffers: Sequence[torch.Tensor], limit: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(buffer, copy, version) of ``buffers``, the smallest first, up to ``limit`` bytes in all
    (:data:`SNAPSHOT_LIMIT_BYTES`): the largest (an LLM's preallocated KV cache, written at
    fixed positions, which the replay writes the same way again) are left out, never a small
    counter beside them."""
    limit = SNAPSHOT_LIMIT_BYTES if limit is None else limit
    taken: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    total = 0
    # a lazy module's buffer before its first forward (``nn.LazyBatchNorm2d``) has no values
    # yet, and refuses even ``numel`` (optimize of a model with lazy modules raised ValueError;
    # new-user audit)
    buffers = [b for b in buffers if not is_lazy(b)]
    for b in sorted(buffers, key=lambda t: t.numel() * t.element_size()):
        size = b.numel() * b.element_size()
        if total + size > limit:
            _log.info(
                "dnntune.torch: a %.1f MiB buffer is not copied around a CUDA-graph recording",
                size / 2**20,
            )
            continue
        total += size
        taken.append((b, b.clone(), version_of(b)))
    return taken


def version_of(t: torch.Tensor) -> int:
    """``t._version``, or -1 for an inference tensor, which keeps no version counter (made
    under ``torch.inference_mode``: an inference script's example inputs, or a model built
    there): reading it raised RuntimeError, so ``optimize`` of such a model or with such
    inputs failed at once (new-user audit). Such a tensor is compared by value instead."""
    return -1 if t.is_inference() else t._version


def snapshot_when_materialized(
    module: nn.Module, saved: list[tuple[torch.Tensor, torch.Tensor, int]]
) -> Callable[[], None]:
    """Add to ``saved`` (:func:`snapshot_of`'s list) the lazy buffers of ``module``'s modules
    (``nn.LazyBatchNorm2d``'s running statistics before its first forward) as their
    materialization gives them (zeros, ones), taken by a forward pre-hook that runs after the
    module's own (which materializes them) and before its forward updates them; each hook
    goes once its module has nothing lazy left. Put back with the rest, the statistics read as
    if only the user's forwards had run, and the module stays materialized (new-user audit: a
    lazy batch norm in training mode kept the statistics of ``optimize``'s forwards).

    Returns what removes the hooks still there (modules not called): call it when done."""
    handles: list[RemovableHandle] = []
    for m in module.modules():
        names = [n for n, b in m._buffers.items() if b is not None and is_lazy(b)]
        if names:
            handles.append(_take_when_materialized(m, names, saved))

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _take_when_materialized(
    m: nn.Module, names: list[str], saved: list[tuple[torch.Tensor, torch.Tensor, int]]
) -> RemovableHandle:
    # registered after the lazy module's own pre-hook (in its __init__), so it runs after it;
    # it lives only until the module's first call, before which the module fuses with nothing
    def take(sub: nn.Module, args: Any) -> None:
        now = {n: sub._buffers.get(n) for n in names}
        ready = {n: b for n, b in now.items() if b is None or not is_lazy(b)}
        saved.extend(snapshot_of([b for b in ready.values() if b is not None]))
        names[:] = [n for n in names if n not in ready]
        if not names:
            handle.remove()

    handle = m.register_forward_pre_hook(take)
    return handle


def put_back(saved: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Put back what :func:`buffer_snapshot` copied, where it was written since: a buffer
    copied back gets a new version, which would make every other recording that reads it
    (batch-norm statistics) record again."""
    with torch.no_grad():
        for buffer, value, version in saved:
            if version < 0:  # an inference tensor: no version counter, compared by value
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
            elif buffer._version != version:
                buffer.copy_(value)


def put_back_values(saved: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Put back what :func:`snapshot_of` copied wherever the value differs (not by version:
    batch norm updates its running statistics inside its kernel without a new version)."""
    with torch.no_grad():
        for buffer, value, version in saved:
            if _comparable(buffer):
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
            elif version >= 0 and buffer._version != version and not buffer.is_meta:
                buffer.copy_(value)


def _comparable(t: torch.Tensor) -> bool:
    """Whether ``torch.equal`` takes ``t``: a dense tensor with values. A sparse or nested one
    (a graph network's adjacency buffer, a jagged batch given as an example input) and one on
    the meta device (a model built there, to be materialized later) have no kernel for it, and
    ``optimize`` raised NotImplementedError (new-user audit): those are compared by version
    (an in-place write to them counts one), and a meta tensor has no values to put back."""
    return t.layout is torch.strided and not t.is_nested and not t.is_meta
