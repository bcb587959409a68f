"""A deadline for each compile and execute of a candidate (``AutotuneConfig.candidate_timeout_s``).

With a timeout set, every guarded call runs on a helper thread while the tuning thread waits
for at most ``candidate_timeout_s``. A call that does not return in time raises
:class:`~dnntune.autotune.failures.CandidateTimeout` in the tuning thread, which fails that
candidate; the helper thread is abandoned (it is a daemon) and a fresh one serves the next call.

Python cannot kill a thread: an abandoned call keeps running until it returns on its own, and
a GPU kernel that never ends keeps the device busy, so every later candidate would time out
too. ``isolate=True`` runs candidates in a worker process that *can* be killed; use it when a
candidate may hang the device.

A call that was only slow (a JIT compile longer than the deadline) does return later, and
until then it keeps issuing GPU work next to the following candidates, which disturbs their
measurements and, on the H200, broke a later CUDA-graph capture. So before the next call, the
watchdog gives each abandoned call one grace period (the same deadline) to finish; one that
is still running after it is given up for good (a warning says so) and never waited for again.

The helper thread inherits what PyTorch keeps per thread and the candidates rely on: the CUDA
device and current stream, grad mode and inference mode of the tuning thread, and the
caller's context variables. The handoff happens outside every timed span. Without a timeout,
calls run inline on the tuning thread (no thread at all, the RFC's behaviour).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dnntune.autotune.failures import CandidateTimeout

if TYPE_CHECKING:
    import torch

__all__ = ["Watchdog"]

_log = logging.getLogger(__name__)

T = TypeVar("T")


class _Job:
    __slots__ = ("context", "done", "error", "fn", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.context = contextvars.copy_context()
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _ThreadState:
    """The per-thread PyTorch state of the tuning thread, replayed on the helper thread."""

    def __init__(self, device: torch.device | None) -> None:
        torch = sys.modules.get("torch")
        self.grad = True
        self.inference = False
        self.stream: Any = None
        self.device = device
        if torch is None:
            return
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()
        if device is not None and device.type == "cuda" and torch.cuda.is_initialized():
            if device.index is None:
                # "cuda" means the tuning thread's current device; the helper needs its index
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.stream = torch.cuda.current_stream(self.device)

    def enter(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        torch = sys.modules.get("torch")
        if torch is None:
            return stack
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if self.stream is not None:
                stack.enter_context(torch.cuda.stream(self.stream))
        stack.enter_context(torch.inference_mode(self.inference))
        stack.enter_context(torch.set_grad_enabled(self.grad))
        return stack


class _Helper(threading.Thread):
    def __init__(self, state: _ThreadState, number: int) -> None:
        super().__init__(name=f"dnntune-autotune-watchdog-{number}", daemon=True)
        self.state = state
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.abandoned = False

    def run(self) -> None:
        try:
            stack = self.state.enter()
        except BaseException as exc:
            # no call can run here: fail every one at once instead of letting it time out
            while (job := self.jobs.get()) is not None:
                job.error = exc
                job.done.set()
            return
        with stack:
            while True:
                job = self.jobs.get()
                if job is None or self.abandoned:
                    return
                try:
                    job.value = job.context.run(job.fn)
                except BaseException as exc:  # handed to the tuning thread, which re-raises
                    job.error = exc
                finally:
                    job.done.set()
                    del job


class Watchdog:
    """Runs calls with a deadline (see the module docstring); inline when ``timeout_s`` is None.

    Args:
        timeout_s: the deadline of each call in seconds, or None for no deadline.
        device: the device the calls run on (its CUDA state is set on the helper thread).
    """

    def __init__(self, timeout_s: float | None = None, device: torch.device | None = None):
        self.timeout_s = timeout_s
        self.device = device
        self._state: _ThreadState | None = None
        self._helper: _Helper | None = None
        self._started = 0
        #: helper threads given up on (each still runs a call that timed out)
        self.abandoned = 0
        #: abandoned calls not yet given their grace period
        self._pending: list[tuple[_Job, str]] = []
        #: abandoned calls that finished within their grace period
        self.settled = 0

    @property
    def enabled(self) -> bool:
        return self.timeout_s is not None

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()``, or CandidateTimeout if it does not return within the deadline.

        Exceptions raised by ``fn`` propagate unchanged.
        """
        if self.timeout_s is None:
            return fn()
        self._settle()
        helper = self._ensure_helper()
        job = _Job(fn)
        helper.jobs.put(job)
        if not job.done.wait(self.timeout_s):
            helper.abandoned = True
            self._helper = None
            self.abandoned += 1
            self._pending.append((job, what))
            _log.warning(
                "autotune: %s did not return within %g s; abandoning its thread (a hung GPU "
                "kernel needs isolate=True to be stopped)",
                what,
                self.timeout_s,
            )
            raise CandidateTimeout(what, self.timeout_s)
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        value: T = job.value
        return value

    def _settle(self) -> None:
        """Give abandoned calls one grace period each to return (see the module docstring)."""
        pending, self._pending = self._pending, []
        for job, what in pending:
            assert self.timeout_s is not None
            if job.done.wait(self.timeout_s):
                self.settled += 1
                _log.info("autotune: %s returned after its deadline; continuing", what)
            else:
                _log.warning(
                    "autotune: %s is still running after a grace period of %g s; later "
                    "candidates may be measured next to it",
                    what,
                    self.timeout_s,
                )

    def _ensure_helper(self) -> _Helper:
        if self._helper is None or not self._helper.is_alive():
            if self._state is None:
                # captured on the tuning thread, the first time a call needs the helper
                self._state = _ThreadState(self.device)
            self._started += 1
            self._helper = _Helper(self._state, self._started)
            self._helper.start()
        return self._helper

    def close(self) -> None:
        """Stop the helper thread (an abandoned one ends when its call returns)."""
        if self._helper is not None:
            self._helper.jobs.put(None)
            self._helper = None
