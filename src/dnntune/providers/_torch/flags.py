"""Process-wide torch switches a plan sets around its run and restores afterwards.

TF32, deterministic algorithms, cuDNN benchmark mode and the SDPA backend are global flags in
PyTorch. A plan that needs one sets it just before running and puts the caller's value back
after, so that plans with different knobs never leak settings into each other or the caller.
Plans that need no flag pay nothing: :func:`with_flags` returns the run function itself.

The flags belong to the process, not to a thread, so set, run and restore happen under one
process-wide re-entrant lock (:data:`FLAGS_LOCK`): two threads running such plans at once would
otherwise each save the other's value as "the caller's" and one would put it back last (four
threads left ``use_deterministic_algorithms`` on). Plans with flags run one at a time; on a GPU
the lock covers the launch only, not the kernels. A thread running a plan without flags takes
no lock, so it sees whatever another thread's plan set while it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "FLAGS_LOCK",
    "SDPA_BACKENDS",
    "Flag",
    "benchmark_flags",
    "deterministic_flags",
    "sdpa_backend_flags",
    "tf32_flags",
    "with_flags",
]


@dataclass(frozen=True)
class Flag:
    """One switch: how to read it, how to set it, and the value the plan wants.

    ``restore`` puts back what ``get`` read when that is more than ``set`` takes (None: ``set``
    does): ``use_deterministic_algorithms`` reads as (enabled, warn_only).
    """

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]
    value: Any
    restore: Callable[[Any], None] | None = None


#: held while a plan's flags are set, it runs, and the caller's values are put back (re-entrant:
#: a plan with flags may run another)
FLAGS_LOCK = threading.RLock()


def _attr_flag(name: str, owner: Any, attr: str, value: Any) -> Flag:
    return Flag(name, lambda: getattr(owner, attr), lambda v: setattr(owner, attr, v), value)


def tf32_flags(allow: bool) -> list[Flag]:
    """TF32 for float32 matmuls (cuBLAS) and convolutions (cuDNN)."""
    return [
        _attr_flag("cuda.matmul.allow_tf32", torch.backends.cuda.matmul, "allow_tf32", allow),
        _attr_flag("cudnn.allow_tf32", torch.backends.cudnn, "allow_tf32", allow),
    ]


def _deterministic_mode() -> tuple[bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def _set_deterministic_mode(mode: tuple[bool, bool]) -> None:
    enabled, warn_only = mode
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def deterministic_flags() -> list[Flag]:
    """Deterministic algorithms (an error on a nondeterministic one) and cuDNN's deterministic
    mode. The caller's state is read and restored with its ``warn_only``, so that a caller's
    ``use_deterministic_algorithms(True, warn_only=True)`` comes back as it was."""
    return [
        Flag(
            "use_deterministic_algorithms",
            _deterministic_mode,
            torch.use_deterministic_algorithms,
            True,
            restore=_set_deterministic_mode,
        ),
        _attr_flag("cudnn.deterministic", torch.backends.cudnn, "deterministic", True),
    ]


def benchmark_flags() -> list[Flag]:
    """cuDNN's own algorithm search (``torch.backends.cudnn.benchmark``)."""
    return [_attr_flag("cudnn.benchmark", torch.backends.cudnn, "benchmark", True)]


#: the values of the ``torch.sdpa_backend`` knob besides ``auto``
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def _sdpa_switches() -> dict[str, tuple[Callable[[], bool], Callable[[bool], None]]]:
    b = torch.backends.cuda
    return {
        "flash": (b.flash_sdp_enabled, b.enable_flash_sdp),
        "efficient": (b.mem_efficient_sdp_enabled, b.enable_mem_efficient_sdp),
        "cudnn": (b.cudnn_sdp_enabled, b.enable_cudnn_sdp),
        "math": (b.math_sdp_enabled, b.enable_math_sdp),
    }


def sdpa_backend_flags(backend: str) -> list[Flag]:
    """Enable exactly one SDPA backend (what ``torch.nn.attention.sdpa_kernel`` does)."""
    if backend == "auto":
        return []
    return [
        Flag(f"sdpa.{name}", get, set_, name == backend)
        for name, (get, set_) in _sdpa_switches().items()
    ]


def with_flags(
    run: Callable[[Sequence[torch.Tensor]], Any], flags: Sequence[Flag]
) -> Callable[[Sequence[torch.Tensor]], Any]:
    """``run`` wrapped so that ``flags`` hold while it runs (``run`` itself if there are none)."""
    if not flags:
        return run
    flags = tuple(flags)

    def run_with_flags(args: Sequence[torch.Tensor]) -> Any:
        with FLAGS_LOCK:
            saved = [f.get() for f in flags]
            try:
                for f in flags:
                    f.set(f.value)
                return run(args)
            finally:
                for f, value in zip(flags, saved, strict=True):
                    (f.set if f.restore is None else f.restore)(value)

    return run_with_flags
