"""Cold-cache measurement: the flush that runs before every cold sample, outside its span.

The flushing buffer itself is a device resource beside the timer
(:class:`~dnntune.backend.cache_flush.CacheFlusher`: a buffer at least twice the device L2 or
the CPU's last-level cache); this module turns a cache mode into the flush call the samplers
take (``flush=`` of :mod:`~dnntune.measure.clocks`), so "cold" means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dnntune.backend import cache_flush

if TYPE_CHECKING:
    import torch

__all__ = ["cold_flush"]


def cold_flush(device: torch.device, cache_mode: str) -> Callable[[], None] | None:
    """The flush to run before each sample on ``device`` in ``cache_mode`` (None when "warm").

    The buffer is allocated here, once: keep the returned call for the whole measurement.
    """
    if cache_mode != "cold":
        return None
    return cache_flush.CacheFlusher(device).flush
