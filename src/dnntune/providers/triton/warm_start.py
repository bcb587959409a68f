"""Triton's once-a-process setup, started in the background when ``optimize`` begins.

A process's first Triton compile pays for more than its kernel: the key of Triton's own
installation (``triton_key``: every file of the package read and hashed, 0.5 s), and the
driver's C helper (``driver.active.utils``: compiled with the C compiler on an empty Triton
cache, else loaded). On the H100 (session 46, thread samples of ``optimize`` on GPT-2 and a
LLaMA-style decode step, empty caches) the hashing alone held ``optimize``'s main thread for
about 0.55 s, inside the tune of the first layer that had a Triton candidate. Both are file
reads, hashing and a compiler process, which leave the interpreter free for most of their time:
started when ``optimize`` begins, they overlap with its tracing and its first searches, and a
compile that needs them before they are done waits for them as it would have made them
(``triton_key`` is cached per process; the helper is built once into Triton's cache and loaded
from it).

Best effort: without Triton, or where anything here fails, nothing changes (the first compile
does the work, as before); ``DNNTUNE_DISABLE_NATIVE`` does not cover this (it is Triton's own
setup, not dnntune's helper).
"""

from __future__ import annotations

import logging
import threading

__all__ = ["prefetch"]

_log = logging.getLogger(__name__)

_lock = threading.Lock()
_started = False


def prefetch() -> None:
    """Start Triton's per-process setup in a background thread, once per process."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    # a daemon: an interpreter that exits meanwhile does not wait for setup it never needed
    threading.Thread(target=_warm, name="dnntune-triton-warm", daemon=True).start()


def _warm() -> None:
    try:
        import triton.runtime.cache as cache
        from triton.runtime import driver
    except Exception as exc:  # no Triton (a CPU build of PyTorch): nothing to set up
        _log.debug("triton warm start: no Triton (%s)", exc)
        return
    try:
        key = getattr(cache, "triton_key", None)  # Triton 3.3 and later keep it here
        if key is None:
            from triton.compiler import compiler

            key = getattr(compiler, "triton_key", None)
        if key is not None:
            key()
        _ = driver.active.utils  # the driver's C helper: built into Triton's cache, or loaded
    except Exception as exc:  # the first compile makes them, as before
        _log.debug("triton warm start: %s: %s", type(exc).__name__, exc)
