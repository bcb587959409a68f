"""Issue 8, bullet 5: what tuning cost, per candidate and per call, and when it pays."""

from __future__ import annotations

import json
import logging

import pytest
from autotune_helpers import Pack, by_name, tune

import dnntune as dt
from dnntune.autotune import AutotuneSummary, break_even_calls
from dnntune.errors import AutotuneError
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    PRIMED_KNOB,
    FakeEngines,
)


def test_times_are_split_per_candidate(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    fakes.timings.set(FAKE_ENGINE_A, 0.25, {PRIMED_KNOB: 1})  # its search helps
    results = by_name(tune(graph, handle, pack, mode=dt.TuneMode.EXHAUSTIVE))
    a, c = results[FAKE_ENGINE_A], results[FAKE_ENGINE_C]
    assert a.compile_time_ms > 0 and c.compile_time_ms > 0
    assert a.benchmark_time_ms > 0 and c.benchmark_time_ms > 0
    assert a.priming_time_ms > 0 and a.ran_exhaustive  # A has global.benchmarking
    assert c.priming_time_ms == 0 and not c.ran_exhaustive


def test_summary_is_left_on_the_graph(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, caplog: pytest.LogCaptureFixture
) -> None:
    assert graph.last_autotune_summary is None
    graph.add_all_engines()
    with caplog.at_level(logging.INFO, logger="dnntune.autotune"):
        results = tune(graph, handle, pack)
    s = graph.last_autotune_summary
    assert isinstance(s, AutotuneSummary)
    assert s.candidates == len(results) == 7 and s.succeeded == 5 and s.failed == 2
    assert s.failed_verification == 1 and s.excluded == 0 and s.benchmarked == 5
    parts = s.compile_time_ms + s.priming_time_ms + s.benchmark_time_ms + s.recheck_time_ms
    assert 0 < parts <= s.total_time_ms
    assert s.compile_time_ms == pytest.approx(sum(r.compile_time_ms for r in results))
    assert s.winner == FAKE_ENGINE_A and s.margin is not None and s.margin.separated
    assert s.cache_mode == "warm" and s.ranking_metric == "latency" and not s.isolate
    data = json.loads(json.dumps(s.to_dict()))
    assert data["margin"]["winner"] == FAKE_ENGINE_A and data["margin"]["runner_up"]
    assert "autotune: session done in" in caplog.text
    assert f"autotune: {FAKE_ENGINE_A}: cost - compile" in caplog.text


def test_summary_is_left_when_every_candidate_fails(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.add_engines([FAKE_ENGINE_FAILS])
    with pytest.raises(AutotuneError):
        tune(graph, handle, pack)
    s = graph.last_autotune_summary
    assert s is not None and s.succeeded == 0 and s.failed == 1 and s.winner == ""
    assert s.margin is None and s.total_time_ms > 0


def test_break_even_calls() -> None:
    assert break_even_calls(1000.0, 2.0, 1.0) == 1000
    assert break_even_calls(1000.0, 2.0, 1.5) == 2000
    assert break_even_calls(0.1, 2.0, 1.0) == 1
    assert break_even_calls(1000.0, 1.0, 1.0) is None
    assert break_even_calls(1000.0, 1.0, 2.0) is None
