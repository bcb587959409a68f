"""One kernel launch, or (``warmup``) only its compilation, with the same arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["launch"]


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: Sequence[Any],
    meta: Mapping[str, Any],
    warmup: bool = False,
) -> None:
    """``kernel[grid](*args, **meta)``; with ``warmup`` compile only (Triton's ``warmup``), so a
    search can compile every candidate ahead of timing, in parallel."""
    if warmup:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)
