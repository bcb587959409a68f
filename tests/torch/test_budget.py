"""The tuning budget's phases (``dnntune.torch._budget``), on a scripted clock."""

from __future__ import annotations

from typing import Any

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


def test_optimize_under_a_budget_does_not_start_a_first_inductor_compile(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, layer_tunes: list[list[Any]]
) -> None:
    """The real engines on the CPU: a layer tune under a 4 s budget may search for 1.4 s (half
    of the 2.8 s search share), which cannot hold torch.compile's first Inductor compile of a
    process (``first_compile_s``, 6 s; it took 3.8-8.0 s of optimize's search share on the
    H100, session 44), so its candidate is recorded as skipped for that reason, never built,
    and the layer is decided among the others."""
    import torch

    import dnntune.torch as dtt
    from dnntune.autotune import search
    from dnntune.providers.torch_compile import NAME as TORCH_COMPILE
    from dnntune.torch import runtime

    monkeypatch.setattr(search, "_compile_seen_s", {})  # as in a fresh process
    runtime.cache().clear()
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval(), torch.randn(3, 8)
    expected = model(x)
    dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "ov.json", time_budget_s=4.0)
    tunes = layer_tunes
    assert tunes, "the layer was not tuned"
    compiled = [r for r in tunes[0] if r.engine_name == TORCH_COMPILE]
    assert compiled and all(r.failure_kind == "budget" for r in compiled)
    assert all("compile is expected to take 6.0 s" in r.error_message for r in compiled)
    assert any(r.succeeded for r in tunes[0])
    torch.testing.assert_close(model(x), expected)
