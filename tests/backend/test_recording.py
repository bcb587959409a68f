"""``collection_paused``: no automatic garbage collection runs inside it (a CUDA graph freed by
one inside a capture spoils the capture), and the collector is left as it was found.
``capture``: the calling thread's current stream is its own again after a capture, also one
that could not begin or end (``torch.cuda.graph`` then leaves its capture stream current)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from dnntune.backend.recording import capture, collection_paused


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


class _Streams:
    """torch.cuda's current stream and device, for one thread, as a stand-in keeps them."""

    def __init__(self) -> None:
        self.current, self.device = "theirs", 0

    def set_stream(self, stream: str) -> None:
        self.current, self.device = stream, 1  # torch.cuda.set_stream makes its device current

    def set_device(self, device: int) -> None:
        self.device = device


class _Graph:
    """``torch.cuda.graph``'s order of steps (torch 2.13): the capture stream made current, then
    the capture begun; at the end, the capture ended, then the caller's stream made current
    again. ``fail`` names the step that raises."""

    def __init__(self, streams: _Streams, fail: str | None) -> None:
        self.streams, self.fail, self.saved = streams, fail, ""

    def __call__(self, graph: Any, **options: Any) -> _Graph:
        return self

    def __enter__(self) -> None:
        self.saved, self.streams.current = self.streams.current, "recording"
        if self.fail == "begin":
            raise RuntimeError("already recording to mempool_id")

    def __exit__(self, *exc: object) -> None:
        if self.fail == "end":
            raise RuntimeError("operation failed due to a previous error during capture")
        self.streams.current = self.saved


@pytest.mark.parametrize("fail", [None, "body", "begin", "end"])
def test_the_callers_stream_is_current_after_a_capture(
    fail: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = _Streams()
    monkeypatch.setattr(torch.cuda, "graph", _Graph(streams, fail))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams.current)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_stream", streams.set_stream)
    monkeypatch.setattr(torch.cuda, "set_device", streams.set_device)
    try:
        with capture(object()):
            assert streams.current == "recording"
            if fail is not None:
                raise RuntimeError("operation not permitted when stream is capturing")
    except RuntimeError:
        assert fail is not None
    assert (streams.current, streams.device) == ("theirs", 0)


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.gpu
def test_a_capture_invalidated_by_a_sync_leaves_the_callers_stream() -> None:
    device = _cuda()
    theirs = torch.cuda.Stream(device)
    x = torch.ones(8, device=device)
    with torch.cuda.stream(theirs):
        with pytest.raises(RuntimeError), capture(torch.cuda.CUDAGraph(), torch.cuda.Stream()):
            (x * 2).sum().item()  # a host sync: the capture refuses it, and cannot end
        assert torch.cuda.current_stream(device) == theirs
        graph = torch.cuda.CUDAGraph()  # a capture after it records and replays
        with capture(graph, torch.cuda.Stream()):
            y = x * 3
        graph.replay()
        torch.cuda.synchronize(device)
        assert torch.equal(y, torch.full_like(x, 3.0))
        assert torch.cuda.current_stream(device) == theirs
    assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
