"""When a call cannot run on dnntune: a one-time warning, then PyTorch's own op."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence

import torch

__all__ = [
    "SUPPORTED_DTYPES",
    "DnnTuneFallbackWarning",
    "unsupported_reason",
    "warn_fallback",
    "warn_once",
]

SUPPORTED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
_DEVICE_TYPES = frozenset({"cpu", "cuda"})


class DnnTuneFallbackWarning(UserWarning):
    """dnntune.torch ran PyTorch's own op because dnntune cannot run this call."""


_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def unsupported_reason(tensors: Sequence[torch.Tensor | None]) -> str | None:
    """Why these tensors cannot go through dnntune (device, dtype, autograd-less ops), or None.

    Runs on every call: one pass, no set, each tensor's device read once.
    """
    first: torch.device | None = None
    for t in tensors:
        if t is None:
            continue
        device = t.device
        if device.type not in _DEVICE_TYPES:
            return f"tensors on {device.type} are not supported (cpu and cuda are)"
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {t.dtype} is not supported (float32, float16, bfloat16 are)"
        if first is None:
            first = device
        elif device != first:
            devices = {str(x.device) for x in tensors if x is not None}
            return f"tensors are on different devices: {sorted(devices)}"
    return None


def warn_fallback(op: str, reason: str) -> None:
    """Warn once per (op, reason) that PyTorch's op is used instead."""
    warn_once(
        (op, reason), f"dnntune.torch.{op}: {reason}; using PyTorch's own op for such calls", 4
    )


def warn_once(key: tuple[str, str], message: str, stacklevel: int = 3) -> None:
    """A ``DnnTuneFallbackWarning`` with ``message``, once per ``key`` in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, DnnTuneFallbackWarning, stacklevel=stacklevel)


def reset_warnings() -> None:
    with _lock:
        _warned.clear()
