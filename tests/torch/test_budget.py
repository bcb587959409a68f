"""The tuning budget's phases (``dnntune.torch._budget``), on a scripted clock."""

from __future__ import annotations

import pytest

from dnntune.torch import _budget
from dnntune.torch._budget import (
    MIN_SEARCH_S,
    SEARCH_CAP,
    Phase,
    phase,
    search_seconds_left,
    tuning_budget,
)


def test_no_budget_always_searches_without_a_limit() -> None:
    assert phase() is Phase.SEARCH and search_seconds_left() is None
    with tuning_budget(None):
        assert phase() is Phase.SEARCH and search_seconds_left() is None


def test_the_phases_follow_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(_budget, "_now", lambda: now[0])
    with tuning_budget(10.0):  # search until 107, race until 110
        assert phase() is Phase.SEARCH
        # one search may take half of what is left of the share, so that a slow first
        # search leaves time for the layers after it
        assert SEARCH_CAP == 0.5
        assert search_seconds_left() == pytest.approx(3.5)
        now[0] = 106.0
        assert search_seconds_left() == pytest.approx(0.5)
        now[0] = 106.9
        assert search_seconds_left() == MIN_SEARCH_S
        now[0] = 107.0
        assert phase() is Phase.RACE
        assert search_seconds_left() == MIN_SEARCH_S  # never a zero budget for a search
        now[0] = 109.9
        assert phase() is Phase.RACE
        now[0] = 110.0
        assert phase() is Phase.SPENT
    assert phase() is Phase.SEARCH and search_seconds_left() is None  # the context is gone


def test_an_inner_budget_is_undone_on_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(_budget, "_now", lambda: now[0])
    with tuning_budget(100.0):
        with tuning_budget(1.0):
            now[0] = 2.0
            assert phase() is Phase.SPENT
        assert phase() is Phase.SEARCH and search_seconds_left() == pytest.approx(34.0)
