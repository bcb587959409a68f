"""What ``dnntune bench --oracle`` tunes TRITON_ENGINE over: no tuning policy that searches
or touches the perf db, and, in the standard mode, no pin that builds the default config again
(issue 25: policies 3 and 4 ran Triton's search inside the tune, 4 and 5 wrote and deleted
perf-db records mid-benchmark, and pins of the default's own values rebuilt and re-timed the
default's kernel). Pure Python: the decision table and the solvers, no GPU."""

from __future__ import annotations

from typing import Any

import pytest
from triton_cases import matmul_graph, norm_graph, pointwise_graph

from dnntune.backend.knobs import WORKSPACE_SIZE_LIMIT
from dnntune.bench.oracle import oracle_variants
from dnntune.providers.triton import TritonEngine
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.policy import (
    TUNING_POLICY,
    TuningPolicy,
    decide,
    tuning_policy_knob,
)
from dnntune.providers.triton.solvers import KNOB_PREFIX, DeviceLimits, solver_for
from dnntune.rfc import TuneMode

GRAPHS = {
    "matmul": lambda: matmul_graph(512, 768, 1024),
    "norm": lambda: norm_graph("ln", [4096], 1024),
    "pointwise": lambda: pointwise_graph([4096, 1024]),
}


def test_the_policy_knob_declares_its_values_from_the_decision_table() -> None:
    knob = tuning_policy_knob()
    assert knob.search_values == {TuningPolicy.SEARCH, TuningPolicy.SEARCH_DB_UPDATE}
    assert knob.persistent_values == {
        TuningPolicy.SEARCH,
        TuningPolicy.SEARCH_DB_UPDATE,
        TuningPolicy.DB_CLEAN,
    }
    # NONE and DB_UPDATE without benchmarking decide as FOLLOW does, with a record or without
    assert knob.default_plan_values == {TuningPolicy.NONE, TuningPolicy.DB_UPDATE}
    for policy in knob.default_plan_values:
        for present in (False, True):
            assert decide(int(policy), present, 0) == decide(0, present, 0)
    # DNNTUNE_FORCE_BENCHMARKING=1: the default searches, so NONE is a plan of its own and
    # DB_UPDATE searches and overwrites
    forced = tuning_policy_knob(force_benchmarking=True)
    assert forced.default_plan_values == frozenset()
    assert TuningPolicy.DB_UPDATE in forced.search_values
    assert TuningPolicy.DB_UPDATE in forced.persistent_values
    assert TuningPolicy.NONE not in forced.search_values | forced.persistent_values


@pytest.mark.parametrize("kind", sorted(GRAPHS))
def test_the_standard_oracle_sweeps_no_policy_and_no_pin_of_the_default(kind: str) -> None:
    graph = GRAPHS[kind]()
    engine = TritonEngine()
    match = match_graph(graph)
    solver = solver_for(match)
    limits = DeviceLimits()
    limit = int(engine.resolve_settings([], graph)[WORKSPACE_SIZE_LIMIT])
    default = TritonEngine._default(solver, match, limits, {}, limit)

    def built(variant: dict[str, Any]) -> dict[str, int]:
        """The config a read-only build of ``variant`` compiles (no perf-db record)."""
        pins = {k.removeprefix(KNOB_PREFIX): int(v) for k, v in variant.items() if v}
        return TritonEngine._default(solver, match, limits, pins, limit)

    standard = oracle_variants(engine, graph, TuneMode.STANDARD)
    exhaustive = oracle_variants(engine, graph, TuneMode.EXHAUSTIVE)
    assert standard and not any(TUNING_POLICY in v for v in standard)
    # exhaustive primes every candidate (global.benchmarking=1), under which NONE (never
    # search) and DB_UPDATE (always search) differ from the default; never 3-5
    assert [v[TUNING_POLICY] for v in exhaustive if TUNING_POLICY in v] == [1, 2]
    exhaustive = [v for v in exhaustive if TUNING_POLICY not in v]
    # what the standard mode leaves out is exactly the pins that build the default config
    left_out = [v for v in exhaustive if v not in standard]
    assert left_out, "the default config pins some value of its own"
    assert all(len(v) == 1 and built(v) == default for v in left_out)
    assert all(built(v) != default for v in standard)
    assert [v for v in exhaustive if v in standard] == standard  # order kept


def test_forced_benchmarking_keeps_the_never_searching_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "1")
    variants = oracle_variants(TritonEngine(), GRAPHS["norm"](), TuneMode.STANDARD)
    assert [v for v in variants if TUNING_POLICY in v] == [{TUNING_POLICY: 1}]
