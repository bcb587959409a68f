"""CUDNN_ENGINE's internal search (``global.benchmarking=1``): time cuDNN's plans, keep the best.

Timings come from the handle's timer (CUDA events on the handle's stream; a fake in tests) on
buffers the search allocates itself, since a build sees no variant pack. Each plan gets a few
warmup runs, then samples of back-to-back runs; the median ranks it. A plan whose first sample
is far slower than the best so far is not sampled further: cuDNN's worst plans are 100-300x
slower than its best, and timing them fully would dominate the search.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dnntune.providers.cudnn._runtime import cudnn_handle, current_stream_ptr
from dnntune.providers.cudnn.selection import PlanTiming, SearchFn

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph
    from dnntune.providers.cudnn.problem import CudnnProblem

__all__ = ["make_search", "random_buffers"]

WARMUP_RUNS = 2
SAMPLES = 5
REPEATS_PER_SAMPLE = 3
#: stop sampling a plan whose first sample is this many times slower than the best so far
CUTOFF_RATIO = 4.0


def random_buffers(graph: OpGraph, device: torch.device, seed: int = 0) -> dict[int, torch.Tensor]:
    """A buffer per non-virtual, non-scalar tensor with its dims, strides and dtype.

    Inputs hold small random values (normal, std 0.5; random bits for booleans), outputs are
    left uninitialised.
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    produced = {id(t) for n in graph.nodes for t in n.outputs.values() if t is not None}
    out: dict[int, torch.Tensor] = {}
    for t in graph.io_tensors():
        assert t.uid is not None and t.data_type is not None
        dtype = t.data_type.to_torch()
        buf = torch.empty_strided(t.dims, t.strides, dtype=dtype, device=device)
        if id(t) not in produced and buf.numel() > 0:
            if dtype.is_floating_point:
                values = torch.randn(t.dims, generator=gen) * 0.5
            elif dtype == torch.bool:
                values = torch.rand(t.dims, generator=gen) > 0.5
            else:
                values = torch.randint(0, 4, t.dims, generator=gen)
            buf.copy_(values.to(dtype))
        out[t.uid] = buf
    return out


def make_search(problem: CudnnProblem, graph: OpGraph, handle: Handle) -> SearchFn:
    """A search function timing ``problem``'s plans on ``handle``'s stream and timer."""

    def search(candidates: Sequence[tuple[int, int]]) -> list[PlanTiming]:
        import torch

        device_index = handle.device.index or 0
        buffers = random_buffers(graph, handle.device)
        pointers = dict(problem.scalar_pointers)
        pointers.update({uid: buffers[uid].data_ptr() for uid in problem.io_uids})
        workspace = torch.empty(
            max([ws for _, ws in candidates] + [1]), dtype=torch.uint8, device=handle.device
        )
        stream_ptr = (
            handle.stream.cuda_stream
            if handle.stream is not None
            else current_stream_ptr(device_index)
        )
        cudnn = cudnn_handle(device_index, stream_ptr)
        timings: list[PlanTiming] = []
        best = float("inf")
        with handle.stream_context():
            for index, ws in candidates:
                timing = PlanTiming(index, problem.name_at(index), ws)

                def run(index: int = index) -> None:
                    problem.execute(index, pointers, workspace.data_ptr(), cudnn)

                try:
                    for _ in range(WARMUP_RUNS):
                        run()
                    handle.synchronize()
                    timing.samples_ms.append(handle.timer.time_ms(run, REPEATS_PER_SAMPLE))
                    if timing.samples_ms[0] <= CUTOFF_RATIO * best:
                        for _ in range(SAMPLES - 1):
                            timing.samples_ms.append(handle.timer.time_ms(run, REPEATS_PER_SAMPLE))
                    timing.median_ms = float(statistics.median(timing.samples_ms))
                    best = min(best, timing.median_ms)
                except Exception as exc:  # a plan that fails to run is a failed candidate
                    timing.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                    timing.samples_ms.clear()
                timings.append(timing)
        handle.synchronize()
        return timings

    return search
