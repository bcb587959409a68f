"""Engine discovery and plan-spec collection (RFC 6.2.3-6.2.5, 10.2 graph API guards)."""

from __future__ import annotations

import logging

import pytest

import dnntune as dt
from dnntune import testing
from dnntune.backend.knobs import BENCHMARKING, KnobSetting
from dnntune.errors import BadStateError, InvalidValueError
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C, FakeEngines

BOGUS_ID = 123456789


def _specs(g: dt.Graph) -> list[tuple[str, dict[str, object]]]:
    names = {dt.engine_id(n): n for n in testing.ALL_FAKE_ENGINES}
    return [
        (names.get(s.engine_id, str(s.engine_id)), {k.knob_id: k.value for k in s.knob_settings})
        for s in g.plan_specs
    ]


# ---- discovery ---------------------------------------------------------------------------
def test_engine_configs_describe_every_applicable_engine(graph: dt.Graph) -> None:
    configs = graph.get_engine_configs()
    assert [c.engine_name for c in configs] == list(testing.ALL_FAKE_ENGINES)
    info = {c.engine_name: c for c in configs}
    assert info[FAKE_ENGINE_A].supports_exhaustive
    assert not info[FAKE_ENGINE_B].supports_exhaustive
    assert {k.knob_id for k in info[FAKE_ENGINE_A].knobs} == {BENCHMARKING, "fake.variant"}
    assert info[FAKE_ENGINE_C].knobs == ()
    assert all(c.estimated_workspace_size == 1024 for c in configs)
    assert all(c.engine_id == dt.engine_id(c.engine_name) for c in configs)
    assert graph.plan_specs == []  # discovery stores nothing


def test_discovery_compiles_nothing(graph: dt.Graph, fakes: FakeEngines) -> None:
    graph.get_engine_configs()
    graph.add_all_engines()
    graph.get_estimated_max_workspace_size()
    assert sum(fakes.counters.compiles.values()) == 0


def test_engine_configs_with_several_modes_has_no_duplicates(graph: dt.Graph) -> None:
    configs = graph.get_engine_configs([dt.HeuristicMode.A, dt.HeuristicMode.FALLBACK])
    assert len(configs) == len({c.engine_id for c in configs}) == 7


# ---- add_engine_configs / add_all_engines -------------------------------------------------
def test_add_all_engines_adds_default_knob_specs(graph: dt.Graph) -> None:
    graph.add_all_engines()
    assert _specs(graph) == [(n, {}) for n in testing.ALL_FAKE_ENGINES]


def test_add_engine_configs_trusts_ids(graph: dt.Graph) -> None:
    graph.add_engine_configs([dt.EngineConfigInfo(engine_id=BOGUS_ID, estimated_workspace_size=7)])
    assert [(s.engine_id, s.estimated_workspace_size) for s in graph.plan_specs] == [(BOGUS_ID, 7)]


@pytest.mark.parametrize(
    "method", ["add_engine_configs", "add_engines", "add_engine_variants", "add_engine_sweep"]
)
def test_empty_input_is_an_error(graph: dt.Graph, method: str) -> None:
    with pytest.raises(InvalidValueError, match=r"no .* given"):
        getattr(graph, method)([])


def test_configs_are_deduplicated_across_calls(graph: dt.Graph) -> None:
    configs = graph.get_engine_configs()
    graph.add_engine_configs(configs)
    graph.add_engine_configs(configs[:2])
    graph.add_engines([FAKE_ENGINE_A])
    graph.add_engine(FAKE_ENGINE_A, {})
    assert len(graph.plan_specs) == 7


# ---- add_engine / add_engines -----------------------------------------------------------
def test_add_engine_by_id_name_or_hex(graph: dt.Graph) -> None:
    eid = dt.engine_id(FAKE_ENGINE_C)
    graph.add_engine(eid)
    graph.add_engine(FAKE_ENGINE_C)
    graph.add_engine(hex(eid & 0xFFFFFFFFFFFFFFFF))
    assert _specs(graph) == [(FAKE_ENGINE_C, {})]


def test_add_engine_invalid_id_is_a_hard_error(graph: dt.Graph) -> None:
    with pytest.raises(InvalidValueError, match="unknown engine"):
        graph.add_engine(BOGUS_ID)
    assert graph.plan_specs == []


@pytest.mark.parametrize(
    "knobs, match",
    [
        ({"no.such.knob": 1}, "unknown knob 'no.such.knob'"),
        ({"fake.variant": 4}, "fake.variant: value 4 is invalid"),
        ({"fake.variant": "x"}, "expected a int value"),
    ],
)
def test_add_engine_invalid_knob_is_a_hard_error(graph: dt.Graph, knobs: dict, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        graph.add_engine(FAKE_ENGINE_A, knobs)


def test_add_engine_knob_order_is_irrelevant(graph: dt.Graph) -> None:
    graph.add_engine(FAKE_ENGINE_A, [KnobSetting("fake.variant", 2)])
    graph.add_engine(FAKE_ENGINE_A, {"fake.variant": 2})
    graph.add_engine(FAKE_ENGINE_A, {"fake.variant": 3})
    assert _specs(graph) == [
        (FAKE_ENGINE_A, {"fake.variant": 2}),
        (FAKE_ENGINE_A, {"fake.variant": 3}),
    ]


def test_add_engine_estimates_workspace(graph: dt.Graph) -> None:
    graph.add_engine(FAKE_ENGINE_B, {"fake.algorithm": "fft"})
    assert graph.plan_specs[0].estimated_workspace_size == 1024
    assert graph.get_estimated_max_workspace_size() == 1024


def test_add_engines_is_fail_fast(graph: dt.Graph) -> None:
    with pytest.raises(InvalidValueError, match="unknown engine"):
        graph.add_engines([FAKE_ENGINE_A, BOGUS_ID, FAKE_ENGINE_B])
    assert _specs(graph) == [(FAKE_ENGINE_A, {})]


# ---- add_engine_variants ------------------------------------------------------------------
def test_variants_skip_invalid_ids_with_warning(
    graph: dt.Graph, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        graph.add_engine_variants(
            [
                dt.EngineVariant(BOGUS_ID, {}),
                dt.EngineVariant(dt.engine_id(FAKE_ENGINE_A), {"fake.variant": 1}),
            ]
        )
    assert _specs(graph) == [(FAKE_ENGINE_A, {"fake.variant": 1})]
    assert "autotune: add_engine_variants: variant 0: unknown engine id" in caplog.text


def test_variants_all_skipped_is_success(graph: dt.Graph, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        graph.add_engine_variants([dt.EngineVariant(BOGUS_ID), dt.EngineVariant(BOGUS_ID + 1)])
    assert graph.plan_specs == []
    assert caplog.text.count("unknown engine id") == 2


def test_variants_partial_application_on_bad_knob(graph: dt.Graph) -> None:
    a = dt.engine_id(FAKE_ENGINE_A)
    with pytest.raises(InvalidValueError, match=r"variant 1: .*fake\.variant"):
        graph.add_engine_variants(
            [
                dt.EngineVariant(a, {"fake.variant": 1}),
                dt.EngineVariant(a, {"fake.variant": 9}),
                dt.EngineVariant(a, {"fake.variant": 2}),
            ]
        )
    assert _specs(graph) == [(FAKE_ENGINE_A, {"fake.variant": 1})]


def test_variants_dedup_with_configs(graph: dt.Graph) -> None:
    graph.add_all_engines()
    graph.add_engine_variants(
        [
            dt.EngineVariant(dt.engine_id(FAKE_ENGINE_C), {}),
            dt.EngineVariant(dt.engine_id(FAKE_ENGINE_B), {"fake.algorithm": "fft"}),
        ]
    )
    assert len(graph.plan_specs) == 8


# ---- global.benchmarking stripping --------------------------------------------------------
def test_benchmarking_knob_is_stripped_everywhere(
    graph: dt.Graph, caplog: pytest.LogCaptureFixture
) -> None:
    a = dt.engine_id(FAKE_ENGINE_A)
    with caplog.at_level(logging.WARNING):
        graph.add_engine(a, {BENCHMARKING: 1})
        graph.add_engine_variants([dt.EngineVariant(a, {BENCHMARKING: 1, "fake.variant": 1})])
        graph.add_engine_sweep(
            [
                dt.EngineSweepSpec(
                    a,
                    [dt.KnobSweepAxis(BENCHMARKING, [0, 1]), dt.KnobSweepAxis("fake.variant", [2])],
                    {BENCHMARKING: 1},
                )
            ]
        )
    assert _specs(graph) == [
        (FAKE_ENGINE_A, {}),
        (FAKE_ENGINE_A, {"fake.variant": 1}),
        (FAKE_ENGINE_A, {"fake.variant": 2}),
    ]
    assert caplog.text.count("stripping internal knob 'global.benchmarking'") == 4
    assert "managed by autotune() in EXHAUSTIVE mode" in caplog.text


# ---- add_engine_sweep ---------------------------------------------------------------------
def test_sweep_cartesian_product_with_fixed(graph: dt.Graph) -> None:
    spec = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_A), [dt.KnobSweepAxis("fake.variant", [0, 1, 2, 3])], {}
    )
    graph.add_engine_sweep([spec])
    assert _specs(graph) == [(FAKE_ENGINE_A, {"fake.variant": v}) for v in range(4)]


def test_sweep_all_axes_stripped_gives_fixed_only(
    graph: dt.Graph, caplog: pytest.LogCaptureFixture
) -> None:
    spec = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_B),
        [dt.KnobSweepAxis("fake.algorithm", [])],
        {"fake.algorithm": "fft"},
    )
    with caplog.at_level(logging.WARNING):
        graph.add_engine_sweep([spec])
    assert _specs(graph) == [(FAKE_ENGINE_B, {"fake.algorithm": "fft"})]
    assert "axis 'fake.algorithm' has no values; dropped" in caplog.text


def test_sweep_empty_axis_keeps_other_combinations(graph: dt.Graph) -> None:
    spec = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_A),
        [dt.KnobSweepAxis("fake.variant", [1, 2]), dt.KnobSweepAxis(BENCHMARKING, [])],
    )
    graph.add_engine_sweep([spec])
    assert len(graph.plan_specs) == 2


def test_sweep_over_limit_is_an_error(graph: dt.Graph) -> None:
    a = dt.engine_id(FAKE_ENGINE_A)
    graph.add_engine_sweep([dt.EngineSweepSpec(a, [dt.KnobSweepAxis("fake.variant", [0])])])
    too_many = dt.EngineSweepSpec(a, [dt.KnobSweepAxis("fake.variant", [0, 1, 2, 3] * 2501)])
    with pytest.raises(InvalidValueError, match="10004 combinations exceeds the limit of 10000"):
        graph.add_engine_sweep([too_many])
    assert len(graph.plan_specs) == 1  # earlier sweep kept


def test_sweep_warns_above_1000(graph: dt.Graph, caplog: pytest.LogCaptureFixture) -> None:
    many = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_A), [dt.KnobSweepAxis("fake.variant", [0, 1, 2, 3] * 251)]
    )
    with caplog.at_level(logging.WARNING):
        graph.add_engine_sweep([many])
    assert "expands to 1004 plan specs" in caplog.text
    assert len(graph.plan_specs) == 4  # duplicates collapse


def test_sweep_skips_invalid_engine_and_errors_on_bad_knob(
    graph: dt.Graph, caplog: pytest.LogCaptureFixture
) -> None:
    good = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_B), [dt.KnobSweepAxis("fake.algorithm", ["direct", "fft"])]
    )
    unknown = dt.EngineSweepSpec(BOGUS_ID, [dt.KnobSweepAxis("x", [1])])
    bad = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_A), [dt.KnobSweepAxis("fake.variant", [1, 7])]
    )
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidValueError, match="spec 2"):
        graph.add_engine_sweep([good, unknown, bad])
    assert _specs(graph) == [
        (FAKE_ENGINE_B, {"fake.algorithm": "direct"}),
        (FAKE_ENGINE_B, {"fake.algorithm": "fft"}),
    ]
    assert "spec 1: unknown engine id" in caplog.text


def test_sweep_knob_in_axis_and_fixed_is_an_error(graph: dt.Graph) -> None:
    spec = dt.EngineSweepSpec(
        dt.engine_id(FAKE_ENGINE_A), [dt.KnobSweepAxis("fake.variant", [1])], {"fake.variant": 2}
    )
    with pytest.raises(InvalidValueError, match="appears in an axis and in fixed_settings"):
        graph.add_engine_sweep([spec])


# ---- workspace estimate and guards ---------------------------------------------------------
def test_estimated_workspace_needs_specs(graph: dt.Graph) -> None:
    with pytest.raises(BadStateError, match="no plan specs"):
        graph.get_estimated_max_workspace_size()


def test_add_before_build_operation_graph_is_an_error(fakes: FakeEngines) -> None:
    g = testing.small_pointwise_graph()
    for call in (
        lambda: g.add_engine(FAKE_ENGINE_A),
        g.add_all_engines,
        g.get_engine_configs,
        lambda: g.add_engine_configs([dt.EngineConfigInfo(engine_id=1)]),
    ):
        with pytest.raises(BadStateError, match="build_operation_graph"):
            call()


def test_mutual_exclusion_specs_then_plans(graph: dt.Graph) -> None:
    graph.add_engine(FAKE_ENGINE_A)
    with pytest.raises(BadStateError, match="mutually exclusive"):
        graph.create_execution_plans()
    with pytest.raises(BadStateError, match="mutually exclusive"):
        graph.create_execution_plan_ext(FAKE_ENGINE_A)


def test_mutual_exclusion_plans_then_specs(graph: dt.Graph) -> None:
    graph.create_execution_plans()
    for call in (
        lambda: graph.add_engine(FAKE_ENGINE_A),
        graph.add_all_engines,
        lambda: graph.add_engine_variants([dt.EngineVariant(1)]),
        lambda: graph.add_engine_sweep([dt.EngineSweepSpec(1)]),
    ):
        with pytest.raises(BadStateError, match="mutually exclusive"):
            call()
