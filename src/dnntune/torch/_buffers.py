"""The buffers a CUDA-graph recording's warm-up calls may write (a counter, a cache the forward
keeps in a buffer): copied before them and put back after, so that a call changes them once,
in its replay."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.parameter import is_lazy

__all__ = [
    "SNAPSHOT_LIMIT_BYTES",
    "buffer_snapshot",
    "put_back",
    "put_back_values",
    "snapshot_of",
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
        taken.append((b, b.clone(), b._version))
    return taken


def put_back(saved: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Put back what :func:`buffer_snapshot` copied, where it was written since: a buffer
    copied back gets a new version, which would make every other recording that reads it
    (batch-norm statistics) record again."""
    with torch.no_grad():
        for buffer, value, version in saved:
            if buffer._version != version:
                buffer.copy_(value)


def put_back_values(saved: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Put back what :func:`snapshot_of` copied wherever the value differs (not by version:
    batch norm updates its running statistics inside its kernel without a new version)."""
    with torch.no_grad():
        for buffer, value, version in saved:
            if _comparable(buffer):
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
            elif buffer._version != version and not buffer.is_meta:
                buffer.copy_(value)


def _comparable(t: torch.Tensor) -> bool:
    """Whether ``torch.equal`` takes ``t``: a dense tensor with values. A sparse or nested one
    (a graph network's adjacency buffer, a jagged batch given as an example input) and one on
    the meta device (a model built there, to be materialized later) have no kernel for it, and
    ``optimize`` raised NotImplementedError (new-user audit): those are compared by version
    (an in-place write to them counts one), and a meta tensor has no values to put back."""
    return t.layout is torch.strided and not t.is_nested and not t.is_meta
