"""How a candidate can fail besides giving a wrong answer: hangs, out-of-memory, crashes.

Each becomes data in the candidate's result (``error_message`` and ``failure_kind``), never an
exception out of autotune(): the session goes on with the next candidate. After an
out-of-memory failure the memory the candidate held is handed back (garbage collection, then
the CUDA caching allocator's free blocks) so the next candidate starts from the same place.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import sys
from typing import TYPE_CHECKING

from dnntune.errors import NotSupportedError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CRASH",
    "ERROR",
    "OOM",
    "TIMEOUT",
    "BUDGET",
    "FLOOR",
    "UNSUPPORTED",
    "VERIFICATION",
    "CandidateTimeout",
    "RemoteFailure",
    "WorkerCrashed",
    "describe_failure",
    "expected_failure",
    "failure_kind",
    "is_out_of_memory",
    "release_memory",
]

_log = logging.getLogger(__name__)

# values of AutotuneResult.failure_kind
TIMEOUT = "timeout"
OOM = "oom"
CRASH = "crash"
VERIFICATION = "verification"
ERROR = "error"
#: the engine cannot run this variant here (a CUDA-only knob value on the CPU, a knob value
#: out of range for this graph): an expected sweep outcome, logged at INFO (``-v``), not a
#: warning, and not counted as a failed candidate (DESIGN "Logging")
UNSUPPORTED = "unsupported"
#: not compiled or timed: ``AutotuneConfig.time_budget_s`` was spent before its turn (a
#: choice of the caller, counted as excluded, never as a failure)
BUDGET = "budget"
#: not compiled or timed: its engine's measured call floor (``Engine.call_floor_ms``) was
#: already slower than the best candidate so far, so it could not win (``autotune.call_floor``)
FLOOR = "floor"


class CandidateTimeout(Exception):
    """A compile or an execution did not return within ``candidate_timeout_s``."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(
            f"timed out: {what} did not finish within candidate_timeout_s={timeout_s:g} s"
        )
        self.what = what
        self.timeout_s = timeout_s


class WorkerCrashed(Exception):
    """The isolate worker process died (a segfault, an abort, an illegal memory access)."""

    def __init__(self, exit_code: int | None, what: str = "") -> None:
        self.exit_code = exit_code
        detail = f"exit code {exit_code}"
        if exit_code is not None and exit_code < 0:
            with contextlib.suppress(ValueError):
                detail += f", {signal.Signals(-exit_code).name}"
        during = f" during {what}" if what else ""
        super().__init__(f"worker crashed ({detail}){during}")


class RemoteFailure(Exception):
    """A failure reported by the isolate worker, already described (``kind`` kept)."""

    def __init__(self, message: str, kind: str = ERROR) -> None:
        super().__init__(message)
        self.kind = kind


def is_out_of_memory(exc: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError``, MemoryError, or an "out of memory" error."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if isinstance(oom_type, type) and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def failure_kind(exc: BaseException) -> str:
    """The ``AutotuneResult.failure_kind`` of an exception."""
    if isinstance(exc, RemoteFailure):
        return exc.kind
    if isinstance(exc, CandidateTimeout):
        return TIMEOUT
    if isinstance(exc, WorkerCrashed):
        return CRASH
    if is_out_of_memory(exc):
        return OOM
    if isinstance(exc, NotSupportedError):
        return UNSUPPORTED
    return ERROR


def expected_failure(kind: str) -> bool:
    """True for the failure kinds that are results of a sweep, logged at INFO (``-v``), not as
    warnings: a variant the engine cannot run here, and a wrong answer caught by verification
    (a reduced-precision variant such as TF32 on a float32 graph: never a winner, and nothing
    the user must act on; the candidate's result records it)."""
    return kind in (UNSUPPORTED, VERIFICATION, BUDGET, FLOOR)


def describe_failure(exc: BaseException) -> str:
    """A one-line description that starts with "timed out" / "out of memory" when it is one."""
    if isinstance(exc, CandidateTimeout | WorkerCrashed | RemoteFailure):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    if is_out_of_memory(exc):
        return f"out of memory: {text}"
    return text


def release_memory(device: torch.device | None) -> None:
    """Free what a failed candidate left behind: unreachable objects, then cached CUDA blocks.

    Call it outside the ``except`` block: the exception's traceback keeps the failed call's
    frames (and their tensors) alive until the block ends.
    """
    gc.collect()
    if device is None or device.type != "cuda":
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        torch.cuda.empty_cache()
    except Exception as exc:
        _log.debug("autotune: torch.cuda.empty_cache() failed: %s", exc)
