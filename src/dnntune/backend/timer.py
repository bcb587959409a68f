"""Timers: CUDA events on the handle's stream, perf_counter_ns on CPU, injectable in tests.

Two ways to time a call (docs/measurement.md):

* ``time_ms(fn, repeats)``: the span from before the first call to after the last, divided by
  ``repeats``. With ``repeats=1`` on an idle device this is the call latency, host submit
  included (the RFC's per-iteration timing).
* ``device_time_ms(fn, repeats)`` (optional; CudaEventTimer has it): what the device spends.
  The stream is first held by a short spin kernel (a "stall gate") while the host queues the
  start event, the launches and the end event, so host overhead cannot open gaps between
  them; whether the gate outlasted the host's queueing is checked on every sample, and the
  gate grows and the sample is retaken when it did not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["CpuTimer", "CudaEventTimer", "Timer", "next_gate_us"]


@runtime_checkable
class Timer(Protocol):
    """Times calls. ``time_ms(fn, repeats)`` runs ``fn`` ``repeats`` times back to back inside
    one timed span and returns the mean milliseconds per call.

    A timer may also offer ``device_time_ms(fn, repeats)`` (same contract, host overhead kept
    out of the span, see the module docstring); autotune uses it for device-time samples and
    falls back to ``time_ms`` when it is absent.
    """

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


#: GPU clock cycles per microsecond assumed when sizing the stall gate (a longer gate than
#: needed costs only wall time, never accuracy: it lies outside the timed span)
_GATE_CYCLES_PER_US = 2000
_GATE_MIN_US = 50.0
_GATE_MAX_US = 200_000.0
_GATE_ATTEMPTS = 3


def next_gate_us(current_us: float, host_us: float) -> float:
    """The stall gate for the next sample: twice what the host took to queue the last one.

    It grows at once when the host needed more, and otherwise shrinks halfway toward what it
    needed, so one slow sample (a JIT compile, a garbage collection) does not leave every later
    sample waiting behind a long gate. (It used to only grow. In session 3's second H200 suite
    run every graph took 5-7 s longer than in the first with its tuning and compile times
    unchanged, about 8 ms per gated sample: what a gate ratcheted up by one slow host call
    costs. Not yet re-measured.) A gate too short for a sample is caught by the held check and
    the sample retaken with a doubled gate.
    """
    wanted = 2.0 * host_us
    gate = wanted if wanted > current_us else 0.5 * (current_us + wanted)
    return min(_GATE_MAX_US, max(_GATE_MIN_US, gate))


class CudaEventTimer:
    """CUDA events recorded on the handle's stream; synchronizes on the end event only."""

    kind = "cuda_event"

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None = None) -> None:
        self.device = device
        self.stream = stream
        self.gate_us = _GATE_MIN_US
        #: whether the last device_time_ms sample's gate held until the host had queued all
        #: launches (None: no gate available in this PyTorch)
        self.last_gate_held: bool | None = None

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

    def device_time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        """Mean device milliseconds per call of ``repeats`` back-to-back calls behind a gate."""
        ms = 0.0
        for _ in range(_GATE_ATTEMPTS):
            ms, held, host_us = self._gated(fn, repeats)
            self.last_gate_held = held
            self.gate_us = next_gate_us(self.gate_us, host_us)
            if held is not False:
                return ms
            self.gate_us = min(_GATE_MAX_US, 2.0 * self.gate_us)
        return ms

    def _gated(self, fn: Callable[[], object], repeats: int) -> tuple[float, bool | None, float]:
        import torch

        stream = self.stream or torch.cuda.current_stream(self.device)
        sleep = getattr(torch.cuda, "_sleep", None)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            if sleep is not None:
                sleep(int(self.gate_us * _GATE_CYCLES_PER_US))
            start.record(stream)
            t0 = time.perf_counter_ns()
            for _ in range(repeats):
                fn()
            end.record(stream)
            host_us = (time.perf_counter_ns() - t0) / 1e3
            # the start event still pending means the gate held the stream until every launch
            # was queued: no host gap can be inside the span
            held = None if sleep is None else not start.query()
        end.synchronize()
        return float(start.elapsed_time(end)) / repeats, held, host_us
