"""Fixtures for autotune tests: the fake engines, a handle on their clock, a small graph."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.testing import FakeEngines


@pytest.fixture
def fakes() -> Iterator[FakeEngines]:
    with testing.fake_engines() as f:
        yield f


@pytest.fixture
def handle(fakes: FakeEngines) -> dt.Handle:
    return dt.create_handle("cpu")


@pytest.fixture
def graph(handle: dt.Handle) -> dt.Graph:
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    return g


@pytest.fixture
def pack(graph: dt.Graph) -> dict[int, torch.Tensor]:
    return testing.make_pack(graph)
