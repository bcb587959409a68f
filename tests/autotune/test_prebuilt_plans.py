"""``PlanSet.prebuilt``: a plan built before the call (a bench row's heuristic plan) is taken by
the plan spec that would build it again, not compiled a second time, and only by that spec: other
knobs, another graph, or a build after priming are compiled as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.plan_specs import PlanSpecCollection
from dnntune.autotune.session import AutotuneOutcome, run_autotune
from dnntune.backend.engine import Plan
from dnntune.backend.plan_choice import choose_plan
from dnntune.testing import FAKE_ENGINE_A, FakeEngines

WS = testing.ESTIMATED_WORKSPACE_BYTES
VARIANT = "fake.variant"


@pytest.fixture
def fakes() -> Iterator[FakeEngines]:
    with testing.fake_engines(names=[FAKE_ENGINE_A], seed=5) as f:
        yield f


def _graph(handle: dt.Handle) -> dt.Graph:
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    return g


def _tune(
    f: FakeEngines,
    g: dt.Graph,
    handle: dt.Handle,
    prebuilt: tuple[Plan, ...],
    mode: dt.TuneMode = dt.TuneMode.STANDARD,
    budget_s: float | None = None,
) -> AutotuneOutcome:
    """The default-knob spec of FAKE_ENGINE_A and its variants 1-3, as bench --oracle tunes."""
    specs = PlanSpecCollection(g, handle)
    specs.add_engine(FAKE_ENGINE_A)
    specs.add_engine_variants(
        [dt.EngineVariant(f.id(FAKE_ENGINE_A), {VARIANT: v}) for v in (1, 2, 3)]
    )
    plans = PlanSet(handle=handle, specs=specs, prebuilt=prebuilt)
    ws = torch.empty(WS, dtype=torch.uint8)
    config = dt.AutotuneConfig(mode=mode, warmup_iterations=1, time_budget_s=budget_s)
    return run_autotune(g, plans, handle, testing.make_pack(g), ws, WS, config)


def test_the_spec_of_a_prebuilt_plan_takes_it_and_is_not_compiled_again(
    fakes: FakeEngines,
) -> None:
    handle = dt.create_handle("cpu")
    g = _graph(handle)
    row_plan = choose_plan(g, handle, engine=FAKE_ENGINE_A).plan  # the bench row's plan
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 1
    outcome = _tune(fakes, g, handle, (row_plan,))
    # the three variants only: the default-knob spec took the row's plan
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 1 + 3
    default = next(r for r in outcome.results if r.is_default)
    assert default.succeeded and default.verified, default.error_message
    assert default.plan_name == row_plan.name
    assert outcome.confirmation is not None  # confirmed against the row's plan itself
    if outcome.winner_result is default:
        assert outcome.winner is row_plan


def test_under_a_budget_the_default_takes_the_prebuilt_plan_in_its_turn(
    fakes: FakeEngines,
) -> None:
    """Under a budget each candidate is built in its turn (the default first): the row's plan
    costs the budget nothing, and the variants are built as before."""
    handle = dt.create_handle("cpu")
    g = _graph(handle)
    row_plan = choose_plan(g, handle, engine=FAKE_ENGINE_A).plan
    outcome = _tune(fakes, g, handle, (row_plan,), budget_s=60.0)
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 1 + 3
    assert sum(r.succeeded for r in outcome.results) == 4


def test_without_prebuilt_plans_every_spec_is_compiled(fakes: FakeEngines) -> None:
    handle = dt.create_handle("cpu")
    g = _graph(handle)
    _tune(fakes, g, handle, ())
    assert fakes.counters.compiles[FAKE_ENGINE_A] == 4


def test_a_prebuilt_plan_is_taken_only_by_its_own_knobs_graph_and_handle(
    fakes: FakeEngines,
) -> None:
    handle = dt.create_handle("cpu")
    g = _graph(handle)
    variant_2 = choose_plan(g, handle, engine=FAKE_ENGINE_A, knobs={VARIANT: 2}).plan
    other_graph = choose_plan(_graph(handle), handle, engine=FAKE_ENGINE_A).plan
    other_handle = choose_plan(g, dt.create_handle("cpu"), engine=FAKE_ENGINE_A).plan
    before = fakes.counters.compiles[FAKE_ENGINE_A]
    outcome = _tune(fakes, g, handle, (other_graph, other_handle, variant_2))
    # variant 2 is taken; the default spec's plan is built here: the other two plans were
    # built for another graph and another handle
    assert fakes.counters.compiles[FAKE_ENGINE_A] - before == 3
    assert all(r.succeeded for r in outcome.results)


def test_under_exhaustive_only_the_unprimed_default_is_taken(fakes: FakeEngines) -> None:
    """A primed build reads the engine's search (the fake: a priming run of the same knobs)
    and is another plan: the row's plan stands in for the unprimed default only."""
    handle = dt.create_handle("cpu")
    g = _graph(handle)
    row_plan = choose_plan(g, handle, engine=FAKE_ENGINE_A).plan
    before = fakes.counters.compiles[FAKE_ENGINE_A]
    outcome = _tune(fakes, g, handle, (row_plan,), dt.TuneMode.EXHAUSTIVE)
    priming = fakes.counters.priming_compiles[FAKE_ENGINE_A]
    assert priming == 4  # each spec primed
    # four primed builds after their priming, none for the unprimed default (the row's plan)
    assert fakes.counters.compiles[FAKE_ENGINE_A] - before == priming + 4
    assert all(r.succeeded for r in outcome.results), [r.error_message for r in outcome.results]
