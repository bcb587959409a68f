"""Handle: the device, the stream and the timer that plans run and are timed on."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import platform
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from dnntune.backend.timer import CpuTimer, CudaEventTimer, Timer
from dnntune.errors import InvalidValueError

if TYPE_CHECKING:
    import torch

__all__ = ["Handle", "create_handle", "timer_override"]

#: reusable: entering a nullcontext has no effect, and execute() should not allocate one per call
_NO_STREAM: contextlib.nullcontext[None] = contextlib.nullcontext()

TimerFactory = Callable[["Handle"], Timer]
_TIMER_OVERRIDE: contextvars.ContextVar[TimerFactory | None] = contextvars.ContextVar(
    "dnntune_timer_override", default=None
)


@contextlib.contextmanager
def timer_override(factory: TimerFactory) -> Iterator[None]:
    """Handles created inside this block get ``factory(handle)`` as their timer (tests, fakes)."""
    token = _TIMER_OVERRIDE.set(factory)
    try:
        yield
    finally:
        _TIMER_OVERRIDE.reset(token)


class Handle:
    """What cuDNN and hipDNN call a handle: a device, a stream, and (here) a timer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: torch.cuda.Stream | None = None
        factory = _TIMER_OVERRIDE.get()
        self.timer: Timer = factory(self) if factory else self._default_timer()

    @property
    def device(self) -> torch.device:
        return self._device

    @device.setter
    def device(self, device: torch.device) -> None:
        self._device = device
        # read on every execute: torch.device.type costs more than a plain attribute
        self._is_cuda = device.type == "cuda"

    @property
    def is_cuda(self) -> bool:
        return self._is_cuda

    def _default_timer(self) -> Timer:
        if self.is_cuda:
            return CudaEventTimer(self.device, self.stream)
        return CpuTimer()

    def set_stream(self, stream: torch.cuda.Stream | None) -> Handle:
        """Use ``stream`` for execute and autotune (CUDA handles only)."""
        if stream is not None and not self.is_cuda:
            raise InvalidValueError(f"set_stream: handle is on {self.device}; streams need CUDA")
        self.stream = stream
        if isinstance(self.timer, CudaEventTimer):
            self.timer.stream = stream
        return self

    def set_timer(self, timer: Timer) -> Handle:
        self.timer = timer
        return self

    def synchronize(self) -> None:
        self.timer.synchronize()

    def stream_context(self) -> contextlib.AbstractContextManager[Any]:
        """A context that makes the handle's stream current (no-op on CPU or default stream)."""
        if self.is_cuda and self.stream is not None:
            import torch

            return torch.cuda.stream(self.stream)
        return _NO_STREAM

    def device_signature(self) -> dict[str, Any]:
        """What identifies the hardware: GPU name, capability, SMs, memory; or CPU model, cores."""
        if self.is_cuda:
            return _cuda_signature(self.device.index or 0)
        return _cpu_signature()

    def device_key(self) -> str:
        """A short stable hash of :meth:`device_signature`."""
        text = json.dumps(self.device_signature(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Handle(device={self.device}, timer={self.timer.kind})"


@cache
def _cuda_signature(index: int) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(index)
    return {
        "type": "cuda",
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
    }


@cache
def _cpu_signature() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "type": "cpu",
        "name": model,
        "cores": os.cpu_count() or 1,
        "machine": platform.machine(),
    }


def create_handle(device: str | torch.device | None = None) -> Handle:
    """A handle on ``device``; None picks ``cuda`` when a GPU is available, else ``cpu``."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        # not PyTorch's message: it lists twenty device types (mps, xla, ...) dnntune refuses
        raise InvalidValueError(
            f"create_handle: bad device {device!r}: dnntune runs on 'cpu' and 'cuda' "
            "('cuda:N' for GPU N)"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidValueError(
                "create_handle: CUDA was requested but no GPU is available; use device='cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise InvalidValueError(
            f"create_handle: device type {dev.type!r} is not supported (cpu, cuda)"
        )
    return Handle(dev)
