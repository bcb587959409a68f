"""EXHAUSTIVE mode is never worse than the untuned default: the default plan is also timed
unprimed, compiled before anything is primed, and every primed plan must beat it.

On the H200 (session 23), primed cuDNN convs ran up to 1.9x slower than the heuristic plan:
priming had changed what the default's own candidate built, so the confirmation compared the
primed plan with itself. The fakes script a primed build's speed (``PRIMED_KNOB``) to make an
engine's search help or hurt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from autotune_helpers import Pack, by_name, check_coverage, tune

import dnntune as dt
from dnntune import testing
from dnntune.autotune.unprimed import UNPRIMED_DEFAULT
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_C, PRIMED_KNOB, FakeEngines

EXHAUSTIVE: dict[str, Any] = {"mode": dt.TuneMode.EXHAUSTIVE, "recheck_within": 0.0}


def _search(fakes: FakeEngines, primed_ms: float) -> None:
    """A (the heuristics' pick, 1 ms unprimed) builds a ``primed_ms`` plan once primed; C is
    slower than both."""
    fakes.timings.set(FAKE_ENGINE_A, 1.0).set(FAKE_ENGINE_A, primed_ms, {PRIMED_KNOB: 1})
    fakes.timings.set(FAKE_ENGINE_C, 3.0)


def _active_is_primed(graph: dt.Graph) -> bool:
    plan = graph.active_plan
    assert isinstance(plan, testing.FakePlan)
    return plan.primed


def test_a_search_that_hurts_keeps_the_unprimed_default(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines, tmp_path: Path
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    _search(fakes, primed_ms=2.0)
    path = tmp_path / "overrides.json"
    storage = dt.AutotuneStorageConfig(file_path=str(path))
    ws = torch.empty(1024, dtype=torch.uint8)
    results = graph.autotune(handle, pack, ws, 1024, dt.AutotuneConfig(**EXHAUSTIVE), storage)
    check_coverage(graph, results)  # one result per plan spec, the unprimed copy folded in
    a = by_name(results)[FAKE_ENGINE_A]
    assert a.rank == 0 and a.is_default and not a.ran_exhaustive
    assert a.exhaustive_not_run_reason.startswith(UNPRIMED_DEFAULT)
    assert (
        "kept: the primed build FAKE_ENGINE_A ran 2 ms against 1 ms" in a.exhaustive_not_run_reason
    )
    assert a.median_time_ms == pytest.approx(1.0)
    # the plan that runs is the unprimed one, although A was primed (its priming plan ran)
    assert fakes.counters.priming_executes[FAKE_ENGINE_A] == 1
    assert not _active_is_primed(graph)
    # the override entry is A's spec as it was (no benchmarking knob): a later build of it is
    # the heuristic plan again
    (entry,) = json.loads(path.read_text())["engine_overrides"]
    assert entry["engine_name"] == FAKE_ENGINE_A
    assert not entry["autotune_metadata"].get("knobs")


def test_a_search_that_helps_wins_against_the_unprimed_default(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    _search(fakes, primed_ms=0.5)
    results = tune(graph, handle, pack, **EXHAUSTIVE)
    a = results[0]
    assert a.engine_name == FAKE_ENGINE_A and a.ran_exhaustive and a.is_default
    assert a.median_time_ms == pytest.approx(0.5)
    # confirmed against the unprimed default in interleaved rounds: 2x faster
    assert a.confirmation == "confirmed" and a.speedup_vs_default == pytest.approx(2.0)
    assert _active_is_primed(graph)


def test_the_unprimed_default_is_built_before_any_priming(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    """Built after the priming, the default's build would have been the primed one (an engine's
    search record, such as cuDNN's find db, reaches builds with the same settings)."""
    graph.add_engines([FAKE_ENGINE_C, FAKE_ENGINE_A])
    _search(fakes, primed_ms=2.0)
    for budget in (None, 100.0):  # all at once, and one candidate at a time under a budget
        results = tune(graph, handle, pack, time_budget_s=budget, **EXHAUSTIVE)
        assert results[0].engine_name == FAKE_ENGINE_A and not results[0].ran_exhaustive
        assert results[0].median_time_ms == pytest.approx(1.0)
        assert not _active_is_primed(graph)
        fakes[FAKE_ENGINE_A].primed.clear()  # type: ignore[attr-defined]


def test_no_copy_without_a_baseline_or_without_priming(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    _search(fakes, primed_ms=2.0)
    # baseline=None (the RFC alone): the primed A is the only A, and it is timed as it is
    results = by_name(tune(graph, handle, pack, baseline=None, **EXHAUSTIVE))
    assert results[FAKE_ENGINE_A].ran_exhaustive
    assert results[FAKE_ENGINE_A].median_time_ms == pytest.approx(2.0)
    compiles = fakes.counters.compiles[FAKE_ENGINE_A]
    assert compiles == 2  # the priming plan and the real plan, no unprimed copy
    # priming switched off: nothing would differ, so nothing is copied
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "0")
    fakes[FAKE_ENGINE_A].primed.clear()  # type: ignore[attr-defined]
    tune(graph, handle, pack, **EXHAUSTIVE)
    assert fakes.counters.compiles[FAKE_ENGINE_A] == compiles + 1


def test_a_default_that_breaks_stays_visible_in_its_spec_result(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unprimed default fails its first run; the primed A does not and C wins: A's spec
    result is the failed one (a failure of the plan users run untuned is not hidden)."""
    graph.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
    fakes.timings.set(FAKE_ENGINE_A, 2.0).set(FAKE_ENGINE_C, 1.0)
    engine = fakes[FAKE_ENGINE_A]

    def check_execute(plan: Any) -> None:
        if not plan.primed and not plan.benchmarking:
            raise dt.ExecutionError("unprimed build broke (test)")

    monkeypatch.setattr(engine, "check_execute", check_execute)
    results = tune(graph, handle, pack, **EXHAUSTIVE)
    named = by_name(results)
    assert results[0].engine_name == FAKE_ENGINE_C
    a = named[FAKE_ENGINE_A]
    assert not a.succeeded and a.is_default and "unprimed build broke" in a.error_message


def test_isolated_workers_build_the_unprimed_default_first(fakes: FakeEngines) -> None:
    with testing.fake_engines(names=[FAKE_ENGINE_A, FAKE_ENGINE_C]) as isolated:
        _search(isolated, primed_ms=2.0)
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C])
        pack = testing.make_pack(g)
        ws = torch.empty(1024, dtype=torch.uint8)
        config = dt.AutotuneConfig(isolate=True, **isolated.worker_config(), **EXHAUSTIVE)
        results = g.autotune(handle, pack, ws, 1024, config)
    check_coverage(g, results)
    a = results[0]
    assert a.engine_name == FAKE_ENGINE_A and not a.ran_exhaustive
    assert a.median_time_ms == pytest.approx(1.0)
    assert "kept: the primed build" in a.exhaustive_not_run_reason
