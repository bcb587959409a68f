"""Cold-cache measurement: flush the last-level cache before a sample, outside the timed span."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["CacheFlusher", "cpu_llc_bytes"]

_log = logging.getLogger(__name__)

_MIN_FLUSH_BYTES = 64 << 20


def cpu_llc_bytes() -> int:
    """Size of the CPU's last-level cache from sysfs (0 when unknown)."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = 1
        if text.endswith("K"):
            scale, text = 1 << 10, text[:-1]
        elif text.endswith("M"):
            scale, text = 1 << 20, text[:-1]
        try:
            best = max(best, int(text) * scale)
        except ValueError:
            continue
    return best


class CacheFlusher:
    """Writes a buffer at least twice the last-level cache (device L2 or CPU LLC) per flush."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self.device = device
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            size = max(2 * l2, 256 << 20)
        else:
            size = max(2 * cpu_llc_bytes(), _MIN_FLUSH_BYTES)
        self.flush_bytes = size
        self._buffer = torch.empty(size // 4, dtype=torch.float32, device=device)
        _log.debug("cold cache: flushing %d bytes per sample on %s", size, device)

    def flush(self) -> None:
        """Overwrite the buffer and wait for it (not part of any timed span)."""
        import torch

        self._buffer.fill_(1.0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
