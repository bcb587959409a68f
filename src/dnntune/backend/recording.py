"""What every CUDA-graph recording in dnntune holds around its capture."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collection_paused"]


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
