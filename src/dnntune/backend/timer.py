"""Timers: CUDA events on the handle's stream, perf_counter_ns on CPU, injectable in tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["CpuTimer", "CudaEventTimer", "Timer"]


@runtime_checkable
class Timer(Protocol):
    """Times calls. ``time_ms(fn, repeats)`` runs ``fn`` ``repeats`` times back to back inside
    one timed span and returns the mean milliseconds per call."""

    kind: str

    def synchronize(self) -> None:
        """Wait until all work queued on the device (or stream) is done."""

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        """Mean milliseconds per call of ``repeats`` back-to-back calls of ``fn``."""
        ...


class CpuTimer:
    """Wall clock (perf_counter_ns) around synchronous CPU calls."""

    kind = "perf_counter"

    def synchronize(self) -> None:
        return None

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        start = time.perf_counter_ns()
        for _ in range(repeats):
            fn()
        return (time.perf_counter_ns() - start) / 1e6 / repeats


class CudaEventTimer:
    """CUDA events recorded on the handle's stream; synchronizes on the end event only."""

    kind = "cuda_event"

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None = None) -> None:
        self.device = device
        self.stream = stream

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        import torch

        stream = self.stream or torch.cuda.current_stream(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(repeats):
                fn()
            end.record(stream)
        end.synchronize()
        return float(start.elapsed_time(end)) / repeats
