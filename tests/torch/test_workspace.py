"""The prepared calls' workspaces (``dnntune.torch._workspace``): one kept buffer per CUDA
stream instead of an allocation per call; a fresh one on the CPU, above the shared limit and
while a CUDA graph records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from dnntune.torch import _workspace
from dnntune.torch._workspace import SHARED_LIMIT, workspace_getter


@pytest.fixture(autouse=True)
def _no_kept_buffers() -> Iterator[None]:
    _workspace.forget()
    yield
    _workspace.forget()


def test_on_the_cpu_every_call_gets_its_own_buffer() -> None:
    get = workspace_getter(128, torch.device("cpu"))
    a, b = get(), get()
    assert a.numel() == 128 and a.dtype == torch.uint8
    assert a.data_ptr() != b.data_ptr() or a is not b


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.gpu
def test_one_stream_keeps_one_buffer_grown_to_the_largest_size() -> None:
    dev = _cuda()
    small, large = workspace_getter(128, dev), workspace_getter(4096, dev)
    first = small()
    assert small() is first  # kept: no allocation per call
    grown = large()
    assert grown.numel() >= 4096 and grown is not first
    assert small() is grown and large() is grown  # the larger buffer serves both


@pytest.mark.gpu
def test_each_stream_has_its_own_buffer() -> None:
    dev = _cuda()
    get = workspace_getter(256, dev)
    here = get()
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        there = get()
        assert get() is there
    assert there is not here and there.data_ptr() != here.data_ptr()


@pytest.mark.gpu
def test_large_workspaces_and_recording_get_fresh_buffers() -> None:
    dev = _cuda()
    big = workspace_getter(SHARED_LIMIT + 1, dev)
    assert big() is not big()
    get = workspace_getter(256, dev)
    kept = get()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        get()  # the side stream's own kept buffer, made before recording
        with torch.cuda.graph(graph, stream=side):
            recorded = get()
            torch.zeros(1, device=dev)
        assert recorded is not get()  # the graph's buffer is its own
    torch.cuda.current_stream(dev).wait_stream(side)
    assert get() is kept
