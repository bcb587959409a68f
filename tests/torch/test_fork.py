"""A process forked while another thread builds a kernel (a DataLoader worker started while a
model is served) builds that kernel itself instead of waiting for the parent's thread."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from dnntune.torch._kernel_cache import KernelCache

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _child_status(pid: int, timeout_s: float) -> int | None:
    """The forked child's exit code, or None if it has not ended in time (then killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_kernel_being_built_at_a_fork_is_built_in_the_child() -> None:
    """The parent's thread holds the signature's build lock at the fork; the child's copy of
    the lock stayed held with no thread to release it, so the child's first call of that
    signature hung for good (concurrency audit)."""
    cache = KernelCache()
    building, release = threading.Event(), threading.Event()
    parents: list[Any] = []

    def slow_build() -> Any:
        building.set()
        assert release.wait(timeout=60)
        return "parent's kernel"

    thread = threading.Thread(target=lambda: parents.append(cache.get("key", 8, slow_build)))
    thread.start()
    try:
        assert building.wait(timeout=60)
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                kernel: Any = cache.get("key", 8, lambda: "child's kernel")  # type: ignore[arg-type, return-value]
                code = 0 if kernel == "child's kernel" else 2
            finally:
                os._exit(code)
        assert _child_status(pid, timeout_s=30) == 0
    finally:
        release.set()
        thread.join(timeout=60)
    assert parents == ["parent's kernel"]
    assert cache.get("key", 8, lambda: "again") == "parent's kernel"  # type: ignore[arg-type, return-value, comparison-overlap]
