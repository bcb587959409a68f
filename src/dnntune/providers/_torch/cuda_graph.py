"""CUDA-graph replay of a plan: capture once per set of buffers, then replay.

The first call with a given set of buffer addresses runs the plan for real (a warm-up on a side
stream, as CUDA-graph capture requires) and captures it; later calls with the same addresses
replay the captured graph, a single launch, writing straight into the caller's buffers. Buffers
are matched by address because a capture bakes them in; their dims, strides and types are fixed
by the graph and checked by the variant pack. A few captures are kept, least recently used out.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch

from dnntune.backend.recording import capture, collection_paused
from dnntune.providers._torch.plan import RunFn

__all__ = ["CudaGraphRunner"]

_log = logging.getLogger(__name__)


class CudaGraphRunner:
    """Wraps a run function with capture-and-replay keyed by the arguments' addresses."""

    def __init__(self, run: RunFn, device: torch.device, max_graphs: int = 4) -> None:
        self._run = run
        self._device = device
        self._max_graphs = max_graphs
        self._graphs: OrderedDict[tuple[int, ...], torch.cuda.CUDAGraph] = OrderedDict()

    def __call__(self, args: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        key = tuple(a.data_ptr() for a in args)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            self._graphs.move_to_end(key)
            return ()
        self._capture(args, key)
        return ()

    def _capture(self, args: Sequence[torch.Tensor], key: tuple[int, ...]) -> None:
        current = torch.cuda.current_stream(self._device)
        side = torch.cuda.Stream(self._device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._run(args)  # the warm-up computes this call's outputs
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # (thread_local: CUDA work another thread issues meanwhile must not invalidate it)
        with collection_paused(), capture(graph):
            self._run(args)
        self._graphs[key] = graph
        while len(self._graphs) > self._max_graphs:
            self._graphs.popitem(last=False)
        _log.debug("cuda graph captured for %d buffers (%d kept)", len(args), len(self._graphs))

    def clear(self) -> None:
        """Drop every capture (their memory pools are freed)."""
        self._graphs.clear()
