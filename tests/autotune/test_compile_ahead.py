"""autotune compiles an engine's candidates ahead, together (``Engine.precompile``), before
compiling them one by one: Triton compiles its kernels on a thread pool there."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FakeEngines

WS = testing.ESTIMATED_WORKSPACE_BYTES


@pytest.fixture
def fakes() -> Iterator[FakeEngines]:
    with testing.fake_engines(names=[FAKE_ENGINE_A, FAKE_ENGINE_B], seed=3) as f:
        yield f


def _tune(f: FakeEngines, **config: Any) -> list[dt.AutotuneResult]:
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    g.add_engine(FAKE_ENGINE_A)
    g.add_engine_variants(
        [dt.EngineVariant(f.id(FAKE_ENGINE_A), {"fake.variant": v}) for v in (1, 2, 3)]
    )
    g.add_engine(FAKE_ENGINE_B)
    pack = testing.make_pack(g)
    ws = torch.empty(WS, dtype=torch.uint8)
    return g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config))


def _record(monkeypatch: pytest.MonkeyPatch, f: FakeEngines, fail: bool = False) -> list[Any]:
    """Every precompile call: (engine, the variant of each setting, compiles done before)."""
    calls: list[Any] = []
    engine_type = type(f[FAKE_ENGINE_A])

    def precompile(self: Any, graph: Any, knob_sets: Sequence[Any], handle: Any) -> None:
        variants = [
            dict((s.knob_id, s.value) for s in knobs).get("fake.variant", 0) for knobs in knob_sets
        ]
        calls.append((self.name, variants, sum(f.counters.compiles.values())))
        if fail:
            raise RuntimeError("compile pool broke")

    monkeypatch.setattr(engine_type, "precompile", precompile)
    return calls


def test_each_engines_candidates_are_compiled_ahead_before_one_by_one(
    monkeypatch: pytest.MonkeyPatch, fakes: FakeEngines
) -> None:
    calls = _record(monkeypatch, fakes)
    results = _tune(fakes)
    # one call for FAKE_ENGINE_A's four candidates, before any compile; none for B's one
    assert calls == [(FAKE_ENGINE_A, [0, 1, 2, 3], 0)]
    assert len(results) == 5 and all(r.succeeded for r in results)
    assert all(r.compile_time_ms >= 0.0 for r in results)


def test_a_compile_ahead_that_fails_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, fakes: FakeEngines
) -> None:
    before = _tune(fakes)
    calls = _record(monkeypatch, fakes, fail=True)
    after = _tune(fakes)
    assert len(calls) == 1
    assert [r.plan_name for r in after] == [r.plan_name for r in before]
    assert all(r.succeeded for r in after)


def test_no_compile_ahead_under_a_per_candidate_deadline_or_a_budget(
    monkeypatch: pytest.MonkeyPatch, fakes: FakeEngines
) -> None:
    calls = _record(monkeypatch, fakes)
    _tune(fakes, candidate_timeout_s=30.0)
    _tune(fakes, time_budget_s=60.0)  # under a budget each candidate is compiled in its turn
    assert calls == []


def test_the_default_engine_compiles_nothing_ahead() -> None:
    engine = dt.get_registry().find("TORCH_ENGINE")
    assert engine is not None
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    engine.precompile(g, [[], []], handle)  # type: ignore[arg-type]  # the base: does nothing
