"""What every CUDA-graph recording in dnntune holds around its capture."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

__all__ = ["capture", "collection_paused"]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector from running while a CUDA graph is captured.

    A collection can run at any allocation. One that frees an earlier recording (a
    ``torch.cuda.CUDAGraph`` left in a reference cycle when its signature was recorded again)
    destroys that graph while the stream is capturing, which CUDA refuses ("operation not
    permitted when stream is capturing"), and the capture in progress is invalidated: the
    forward then ran uncaptured (H100, session 36, a module re-recorded after each of three
    weight replacements). PyTorch's ``torch.cuda.graph`` collected before each capture until
    2.9; it now does so only with ``torch.compiler.config.force_cudagraph_gc``. The garbage is
    collected later, outside the capture.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def capture(graph: Any, stream: Any = None, pool: Any = None) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local")``
    that leaves the calling thread's current stream as it found it, also when the capture
    fails.

    ``torch.cuda.graph`` makes its capture stream current, then begins the capture; at the end
    it ends the capture, then makes the caller's stream current again. When the capture cannot
    begin (the pool still marked as being recorded to after an earlier capture failed,
    "already recording to mempool_id", seen on the H200), or cannot end (the forward did what
    a capture refuses, a sync say, and the capture was invalidated), the step after is never
    taken: the thread's later work, the user's own included, then ran on dnntune's recording
    stream instead of theirs, unordered with the events and waits they make on their own
    (session 54, H100: a later GPU test's new stream was that very stream). ``thread_local``:
    CUDA work another thread issues meanwhile (a timed-out autotune candidate whose thread was
    abandoned, say) does not invalidate the capture.
    """
    import torch

    current_device = torch.cuda.current_device()
    device = stream.device if stream is not None else current_device
    before = torch.cuda.current_stream(device)
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            yield
    finally:
        if torch.cuda.current_stream(device) != before:
            torch.cuda.set_stream(before)  # (which makes its device current too)
            torch.cuda.set_device(current_device)
