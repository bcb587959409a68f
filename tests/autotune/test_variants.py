"""knob_variants: bounded knob spaces, and the first N values of an ordered knob."""

from __future__ import annotations

from typing import Any, cast

from dnntune.autotune.variants import knob_variants
from dnntune.backend.engine import Engine
from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType, StringConstraint


class _Engine:
    name = "X_ENGINE"

    def __init__(self, knobs: list[Knob]) -> None:
        self._knobs = knobs

    def knobs(self, graph: Any = None) -> list[Knob]:
        return self._knobs


PLANS = Knob("x.config", "plan index", KnobValueType.INT64, -1, IntConstraint(-1, 20), ranked=True)
MODE = Knob("x.mode", "mode", KnobValueType.STRING, "a", StringConstraint(frozenset({"a", "b"})))


def _variants(**kwargs: Any) -> list[dict[str, Any]]:
    engine = cast(Engine, _Engine([PLANS, MODE]))
    return knob_variants(engine, cast(Any, None), one_at_a_time=True, **kwargs)


def test_a_large_knob_is_left_to_the_engine_unless_it_is_ranked() -> None:
    assert _variants(max_values_per_knob=6) == [{"x.mode": "b"}]
    assert _variants(max_values_per_knob=6, ranked_values=3) == [
        {"x.config": 0},
        {"x.config": 1},
        {"x.config": 2},
        {"x.mode": "b"},
    ]


def test_the_default_value_is_never_a_variant() -> None:
    swept = _variants(ranked_values=50)
    assert {"x.config": -1} not in swept
    assert len(swept) == 21 + 1  # 0..20 and mode b


# ---- suggested variants (every tuning run) ---------------------------------------------------
def _epilogue_graph(io: Any) -> Any:
    import dnntune as dt

    f32 = dt.DataType.FLOAT
    g = dt.Graph("mm_gelu", io_data_type=io, compute_data_type=f32, intermediate_data_type=f32)
    c = g.matmul(g.tensor("A", [16, 32]), g.tensor("B", [32, 24]))
    y = g.pointwise(c, g.tensor("BIAS", [1, 24]), mode=dt.PointwiseMode.ADD)
    g.pointwise(y, mode=dt.PointwiseMode.GELU_FWD).set_output(True)
    g.validate()
    return g


def test_torch_engine_suggests_io_intermediates_only_when_they_are_narrower() -> None:
    import dnntune as dt
    from dnntune.backend.registry import get_registry

    engine = get_registry().find("TORCH_ENGINE")
    assert engine is not None
    assert engine.suggested_variants(_epilogue_graph(dt.DataType.HALF)) == [
        {"torch.intermediate_type": "io"}
    ]
    assert engine.suggested_variants(_epilogue_graph(dt.DataType.FLOAT)) == []


def test_suggested_variants_are_tuned_and_verified(cpu_handle: Any) -> None:
    import dnntune as dt
    from dnntune import reference
    from dnntune.autotune.variants import add_suggested_variants

    g = _epilogue_graph(dt.DataType.BFLOAT16)
    g.build_operation_graph(cpu_handle)
    g.add_all_engines()
    before = len(g.plan_specs)
    assert add_suggested_variants(g) == 1
    assert add_suggested_variants(g, exclude=frozenset({"torch.intermediate_type"})) == 0
    assert len(g.plan_specs) == before + 1
    pack = reference.make_inputs(g, cpu_handle.device, seed=0)
    results = g.autotune(
        cpu_handle, pack, None, 0, dt.AutotuneConfig(max_iterations=3, warmup_iterations=1)
    )
    io = [r for r in results if r.knobs.get("torch.intermediate_type") == "io"]
    assert len(io) == 1 and io[0].succeeded and io[0].verified


def test_dnntune_tune_includes_suggested_variants(cpu_handle: Any) -> None:
    import dnntune as dt
    from dnntune.tuning import TuneOptions, tune_graph

    g = _epilogue_graph(dt.DataType.HALF)
    report = tune_graph(g, cpu_handle, TuneOptions(max_iterations=3, timed_iterations=3))
    assert report.ok, report.error
    assert any(r.knobs.get("torch.intermediate_type") == "io" for r in report.results)
