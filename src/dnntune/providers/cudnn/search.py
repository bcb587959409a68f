"""CUDNN_ENGINE's internal search (``global.benchmarking=1``): time cuDNN's plans, keep the best.

Timings come from the handle's timer on buffers the search allocates itself, since a build
sees no variant pack: its device clock where it has one (``device_time_ms``: the runs held
behind a stall gate, so the host's launch cost stays out of the span, as in the Triton
search), its call clock otherwise. Timed on the call clock, back-to-back runs of a kernel
shorter than cuDNN's launch cost measure the host, not the plan: on the H200 (session 23) the
search, so timed, chose plans that ran 1.1-1.9x slower than cuDNN's first choice on the
device (1x1 convolutions of ~14 us), host-bound timing being the likely cause (not yet
re-measured with this clock). Which plan suits the caller's clock is the tuner's question
(EXHAUSTIVE confirms every primed plan against the unprimed default on that clock); the
engine's search answers which kernel is fastest. Each plan gets a few
warmup runs, then samples of back-to-back runs; the median ranks it. A plan whose first sample
is far slower than the best so far is not sampled further: cuDNN's worst plans are 100-300x
slower than its best, and timing them fully would dominate the search. The fastest few and
cuDNN's own first choice are then re-timed in a final, interleaved round that decides. The
sampling, the interleaved rounds and the median are :mod:`dnntune.measure`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dnntune.measure import device_clock, interleaved_rounds, median, steady_samples
from dnntune.providers.cudnn._runtime import cudnn_handle, current_stream_ptr
from dnntune.providers.cudnn.selection import PlanTiming, SearchFn

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph
    from dnntune.providers.cudnn.problem import CudnnProblem

__all__ = ["make_search", "random_buffers"]

WARMUP_RUNS = 2
#: extra runs before the first plan, so that the GPU clocks are up before anything is timed
CLOCK_WARMUP_RUNS = 20
SAMPLES = 5
REPEATS_PER_SAMPLE = 3
#: stop sampling a plan whose first sample is this many times slower than the best so far
CUTOFF_RATIO = 4.0
#: the final round: this many fastest plans (plus cuDNN's first choice), samples, repeats
FINALISTS = 4
FINAL_SAMPLES = 10
FINAL_REPEATS = 5


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

        def runner(index: int) -> Callable[[], None]:
            def run() -> None:
                problem.execute(index, pointers, workspace.data_ptr(), cudnn)

            return run

        with handle.stream_context():
            timings = _screen(candidates, problem, handle, runner)
            _final_round(timings, handle, runner)
        handle.synchronize()
        return timings

    return search


def _screen(
    candidates: Sequence[tuple[int, int]],
    problem: CudnnProblem,
    handle: Handle,
    runner: Callable[[int], Callable[[], None]],
) -> list[PlanTiming]:
    """Round 1: every plan, a few samples each (one sample for plans far behind the best)."""
    timings: list[PlanTiming] = []
    best = float("inf")
    for n, (index, ws) in enumerate(candidates):
        timing = PlanTiming(index, problem.name_at(index), ws)
        try:
            timing.samples_ms = _screen_samples(runner(index), handle, n == 0, best)
            timing.median_ms = median(timing.samples_ms)
            best = min(best, timing.median_ms)
        except Exception as exc:  # a plan that fails to run is a failed candidate
            timing.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            timing.samples_ms.clear()
        timings.append(timing)
    return timings


def _screen_samples(
    run: Callable[[], None], handle: Handle, first: bool, best_ms: float
) -> list[float]:
    """One plan's screening samples: warm runs (more before the first plan, so the clocks are
    up), then SAMPLES, or only one when it is far behind the best so far (CUTOFF_RATIO)."""
    clock = device_clock(handle.timer)
    return steady_samples(
        lambda: clock(run, REPEATS_PER_SAMPLE),
        SAMPLES,
        warm=run,
        warm_runs=WARMUP_RUNS + (CLOCK_WARMUP_RUNS if first else 0),
        synchronize=handle.synchronize,
        stop=lambda samples: not samples[0] <= CUTOFF_RATIO * best_ms,
    ).samples_ms


def _final_round(
    timings: list[PlanTiming], handle: Handle, runner: Callable[[int], Callable[[], None]]
) -> None:
    """Round 2: the fastest few and cuDNN's own first choice, re-timed interleaved.

    Round-robin sampling gives every finalist the same clock, cache and thermal conditions,
    so the ranking between close plans is not decided by when each happened to be screened.
    """
    ok = [t for t in timings if t.ok]
    if len(ok) < 2:
        return
    finalists = sorted(ok, key=lambda t: t.median_ms)[:FINALISTS]
    if ok[0] not in finalists:
        finalists.append(ok[0])  # cuDNN's heuristic choice always reaches the final

    clock = device_clock(handle.timer)

    def sampler(run: Callable[[], None]) -> Callable[[], float]:
        return lambda: clock(run, FINAL_REPEATS)

    try:
        final = interleaved_rounds(
            {i: sampler(runner(t.index)) for i, t in enumerate(finalists)}, FINAL_SAMPLES
        )
    except Exception:  # keep the screening results if a finalist breaks now
        return
    for i, t in enumerate(finalists):
        t.samples_ms = final.samples_ms[i]
        t.median_ms = median(t.samples_ms)
        t.round = 2
