"""What every dnntune.torch op does around its kernel: argument checks, and running dnntune
or, when it cannot, PyTorch's own op with a one-time warning."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from dnntune.errors import DnnTuneError
from dnntune.torch._support import unsupported_reason, warn_fallback
from dnntune.torch.graphs import ACTIVATIONS

__all__ = ["check_activation", "grad_wanted", "guarded", "pair"]

_log = logging.getLogger("dnntune.torch.functional")
T = TypeVar("T")


def pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    return (values[0], values[1])


def guarded(
    op: str,
    tensors: Sequence[torch.Tensor | None],
    run: Callable[[], T],
    fallback: Callable[[], T],
    extra_reason: str | None = None,
) -> T:
    reason = extra_reason or unsupported_reason(tensors)
    if reason is None:
        try:
            return run()
        except DnnTuneError as exc:
            reason = f"dnntune cannot run it ({exc})"
            _log.info("dnntune.torch.%s: %s", op, reason)
    warn_fallback(op, reason.split(" (", 1)[0] if reason.startswith("dnntune cannot") else reason)
    return fallback()


def check_activation(activation: str | None) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}"
        )


def grad_wanted(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
