"""autotune() with a config whose enum fields are the RFC's strings, or of the wrong type: the
strings work as the members, a wrong type fails by name before any candidate is compiled."""

from __future__ import annotations

from typing import Any

import pytest
from autotune_helpers import Pack, by_name, tune, workspace

import dnntune as dt
from dnntune import testing
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_C, PRIMED_KNOB, FakeEngines


def test_mode_given_as_the_rfc_string_runs_exhaustive(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    """``AutotuneConfig(mode="exhaustive")`` raised AttributeError 'str' object has no attribute
    'name' inside autotune (an audit's finding)."""
    graph.add_engine(FAKE_ENGINE_A)
    graph.add_engine(FAKE_ENGINE_C)
    fakes.timings.set(FAKE_ENGINE_A, 0.25, {PRIMED_KNOB: 1})  # its search helps
    results = by_name(tune(graph, handle, pack, mode="exhaustive", recheck_within=0.0))
    assert results[FAKE_ENGINE_A].mode_used is dt.TuneMode.EXHAUSTIVE
    assert results[FAKE_ENGINE_A].ran_exhaustive


def test_strategy_set_as_a_string_after_construction_is_used(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_all_engines()
    config = dt.AutotuneConfig(timed_iterations=3)
    config.strategy = "fixed_average"  # type: ignore[assignment]
    results = graph.autotune(handle, pack, workspace(), testing.ESTIMATED_WORKSPACE_BYTES, config)
    ok = [r for r in results if r.succeeded]
    assert ok and all(r.strategy_used is dt.AutotuneStrategy.FIXED_AVERAGE for r in ok)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"priming_failure_policy": "keep_going"}, "priming_failure_policy must be one of"),
        ({"strategy": "fixed_average", "timed_iterations": 2.5}, "timed_iterations must be an"),
        ({"strategy": "run_until_stable", "window_size": 1, "max_iterations": 0}, "window_size"),
        ({"mode": "Exhaustive"}, "did you mean 'exhaustive'"),
    ],
)
def test_a_wrong_field_fails_before_any_candidate_runs(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    fields: dict[str, Any],
    match: str,
) -> None:
    graph.add_all_engines()
    with pytest.raises(dt.InvalidValueError, match=match):
        tune(graph, handle, pack, **fields)
    assert sum(fakes.counters.compiles.values()) == 0 and not fakes.executions()
