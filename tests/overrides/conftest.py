"""Fixtures shared by the override-file tests."""

from __future__ import annotations

import pytest
from overrides_helpers import FakeEngine, engines

import dnntune as dt
from dnntune.backend.handle import Handle


@pytest.fixture
def handle() -> Handle:
    return dt.create_handle("cpu")


@pytest.fixture
def cands() -> list[FakeEngine]:
    return engines("FAKE_Z", "FAKE_A", "FAKE_B", "FAKE_C")
