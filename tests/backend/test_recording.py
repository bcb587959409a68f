"""``collection_paused``: no automatic garbage collection runs inside it (a CUDA graph freed by
one inside a capture spoils the capture), and the collector is left as it was found."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from dnntune.backend.recording import collection_paused


@pytest.fixture
def eager_collector() -> Iterator[list[str]]:
    """The phases of every collection while the test runs, with one due at every allocation."""
    phases: list[str] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        phases.append(phase)

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(seen)
    try:
        yield phases
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()


def _allocate() -> None:
    for _ in range(50):
        cycle: list[object] = []
        cycle.append(cycle)


def test_no_collection_runs_inside_and_the_collector_is_back_after(
    eager_collector: list[str],
) -> None:
    _allocate()
    assert eager_collector  # the fixture's collector runs at allocations
    with collection_paused():
        before = len(eager_collector)  # (entering may allocate, and collect, before the pause)
        assert not gc.isenabled()
        _allocate()
        with collection_paused():  # nested: still paused, and after it too
            _allocate()
        assert not gc.isenabled()
        _allocate()
        inside = len(eager_collector) - before  # read before the block ends
    assert inside == 0
    assert gc.isenabled()
    _allocate()
    assert "start" in eager_collector


def test_a_collector_disabled_before_stays_disabled(eager_collector: list[str]) -> None:
    gc.disable()
    with collection_paused():
        _allocate()
    assert not gc.isenabled()


def test_the_collector_comes_back_when_the_capture_raises(eager_collector: list[str]) -> None:
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("a capture that failed")
    assert gc.isenabled()
