"""The workspaces of ``dnntune.torch``'s prepared calls: one kept buffer per CUDA stream.

A plan that needs a workspace (cuDNN's norm plans ask for a few hundred bytes) had one
allocated on every call, beside its output: a second trip through the caching allocator, about
as long as the whole of PyTorch's own op spends before its kernel (issue 22). Calls on one
stream run in stream order, so every plan on that stream can share one buffer: it is grown when
a plan needs more, and never shared across streams. While the current stream is recording a
CUDA graph a call gets a fresh buffer (from the graph's own pool, alive as long as the graph):
a recorded graph may be replayed on any stream, beside eager calls that use the kept one.

Buffers above :data:`SHARED_LIMIT` are not kept (such a plan's kernel runs long enough that
one allocation does not count, and the memory would stay held).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

__all__ = ["SHARED_LIMIT", "forget", "workspace_getter"]

#: workspaces of at most this many bytes are kept per stream; larger ones are per call
SHARED_LIMIT = 4 << 20
#: streams kept per device at most (the table is emptied when full: a buffer freed while a
#: kernel on its stream still reads it is safe, the caching allocator reuses it only in that
#: stream's order)
_STREAMS = 64

#: device index -> raw stream -> the stream's kept buffer
_kept: dict[int, dict[int, torch.Tensor]] = {}


def workspace_getter(size: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """``get()`` -> a workspace of at least ``size`` bytes for a call on ``device``'s
    current stream: the stream's kept buffer, or a fresh one (recording a CUDA graph, not
    CUDA, or above :data:`SHARED_LIMIT`)."""
    fresh = functools.partial(torch.empty_strided, (size,), (1,), dtype=torch.uint8, device=device)
    if device.type != "cuda" or device.index is None or size > SHARED_LIMIT:
        return fresh
    index = device.index
    kept = _kept.setdefault(index, {})
    raw_stream = torch._C._cuda_getCurrentRawStream  # noqa: SLF001
    capturing = torch._C._cuda_isCurrentStreamCapturing  # noqa: SLF001

    def get() -> torch.Tensor:
        stream = raw_stream(index)
        buffer = kept.get(stream)
        if buffer is not None and buffer.numel() >= size and not capturing():
            return buffer
        if capturing():
            return fresh()
        if len(kept) >= _STREAMS:
            kept.clear()
        # allocated on the current stream (that stream's order protects it), grown to the
        # largest size asked for on it
        buffer = kept[stream] = fresh() if buffer is None else _grown(buffer, size, device)
        return buffer

    return get


def _grown(old: torch.Tensor, size: int, device: torch.device) -> torch.Tensor:
    return torch.empty_strided((max(size, old.numel()),), (1,), dtype=torch.uint8, device=device)


def forget() -> None:
    """Drop every kept buffer (tests; the memory goes back to the caching allocator)."""
    for kept in _kept.values():
        kept.clear()
