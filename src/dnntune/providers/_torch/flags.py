"""Process-wide torch switches a plan sets around its run and restores afterwards.

TF32, deterministic algorithms, cuDNN benchmark mode and the SDPA backend are global flags in
PyTorch. A plan that needs one sets it just before running and puts the caller's value back
after, so that plans with different knobs never leak settings into each other or the caller.
Plans that need no flag pay nothing: :func:`with_flags` returns the run function itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
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
    """One switch: how to read it, how to set it, and the value the plan wants."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]
    value: Any


def _attr_flag(name: str, owner: Any, attr: str, value: Any) -> Flag:
    return Flag(name, lambda: getattr(owner, attr), lambda v: setattr(owner, attr, v), value)


def tf32_flags(allow: bool) -> list[Flag]:
    """TF32 for float32 matmuls (cuBLAS) and convolutions (cuDNN)."""
    return [
        _attr_flag("cuda.matmul.allow_tf32", torch.backends.cuda.matmul, "allow_tf32", allow),
        _attr_flag("cudnn.allow_tf32", torch.backends.cudnn, "allow_tf32", allow),
    ]


def deterministic_flags() -> list[Flag]:
    return [
        Flag(
            "use_deterministic_algorithms",
            torch.are_deterministic_algorithms_enabled,
            torch.use_deterministic_algorithms,
            True,
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
        saved = [f.get() for f in flags]
        for f in flags:
            f.set(f.value)
        try:
            return run(args)
        finally:
            for f, value in zip(flags, saved, strict=True):
                f.set(value)

    return run_with_flags
