"""knob_variants: bounded knob spaces, and the first N values of an ordered knob."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

import dnntune as dt
from dnntune.autotune.variants import knob_variants
from dnntune.backend.engine import Engine
from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType, StringConstraint
from dnntune.errors import InvalidValueError


class _Engine:
    name = "X_ENGINE"

    def __init__(self, knobs: list[Knob]) -> None:
        self._knobs = knobs

    def knobs(self, graph: Any = None) -> list[Knob]:
        return self._knobs

    def validate_knobs(self, settings: Any, graph: Any = None) -> None:
        return None


class _PickyEngine(_Engine):
    def validate_knobs(self, settings: Any, graph: Any = None) -> None:
        for s in settings:  # this engine cannot run plan index 2 (say, for this graph)
            if s.knob_id == "x.config" and s.value == 2:
                raise InvalidValueError("engine X_ENGINE: knob x.config: 2 does not fit")


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
    from dnntune.workflows.tuning import TuneOptions, tune_graph

    g = _epilogue_graph(dt.DataType.HALF)
    report = tune_graph(g, cpu_handle, TuneOptions(max_iterations=3, timed_iterations=3))
    assert report.ok, report.error
    assert any(r.knobs.get("torch.intermediate_type") == "io" for r in report.results)


def _conv_graph(channels_last: bool) -> Any:
    import dnntune as dt

    f32, f16 = dt.DataType.FLOAT, dt.DataType.HALF
    g = dt.Graph("conv_relu", io_data_type=f16, compute_data_type=f32, intermediate_data_type=f32)
    n, c, h, w = 2, 8, 6, 6
    strides = [c * h * w, 1, w * c, c] if channels_last else [c * h * w, h * w, w, 1]
    x = g.tensor("X", [n, c, h, w], strides=strides)
    wt = g.tensor("W", [4, c, 3, 3], strides=[c * 9, 1, 3 * c, c] if channels_last else None)
    y = g.conv_fprop(x, wt, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True)
    g.validate()
    return g


@pytest.mark.parametrize("cuda", [False, True])
def test_torch_engine_suggests_io_intermediates_and_cudnn_search_for_a_half_conv(
    monkeypatch: Any, cuda: bool
) -> None:
    # channels_last around an NCHW convolution lost 1.8x on the H200: not suggested; cuDNN's
    # own search (cudnn.benchmark) is, on CUDA: what eager PyTorch runs with benchmark on
    from dnntune.backend.registry import get_registry
    from dnntune.providers import torch_eager

    engine = get_registry().find("TORCH_ENGINE")
    assert engine is not None
    monkeypatch.setattr(torch_eager, "on_cuda", lambda graph: cuda)
    io = {"torch.intermediate_type": "io"}
    search = {"global.benchmarking": 1}
    want = [io, search, {**io, **search}] if cuda else [io]
    assert engine.suggested_variants(_conv_graph(channels_last=False)) == want
    assert engine.suggested_variants(_conv_graph(channels_last=True)) == want
    # not for graphs without a convolution
    assert engine.suggested_variants(_epilogue_graph(dt.DataType.HALF)) == [io]


def test_a_channels_last_io_plan_of_an_nchw_conv_matches_the_reference(cpu_handle: Any) -> None:
    from dnntune import testing
    from dnntune.graph import OpKind

    knobs = {"torch.memory_format": "channels_last", "torch.intermediate_type": "io"}
    g = _conv_graph(channels_last=False)
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", knobs, OpKind.CONV_FPROP, seed=1)


def test_plans_say_whether_they_run_pytorchs_own_ops(cpu_handle: Any) -> None:
    from dnntune.backend.knobs import KnobSetting
    from dnntune.backend.registry import get_registry

    g = _conv_graph(channels_last=False)
    g.build_operation_graph(cpu_handle)
    engine = get_registry().find("TORCH_ENGINE")
    assert engine is not None

    def plan(**knobs: Any) -> Any:
        return engine.compile(g, [KnobSetting(k, v) for k, v in knobs.items()], cpu_handle)

    assert plan().runs_eager_ops
    assert plan(**{"torch.intermediate_type": "io"}).runs_eager_ops
    assert not plan(**{"torch.memory_format": "channels_last"}).runs_eager_ops
    assert not plan(**{"global.deterministic": 1}).runs_eager_ops


def test_candidate_sharded_distributed_tuning_includes_suggested_variants(tmp_path: Any) -> None:
    import dnntune as dt
    from dnntune.distributed import tune_library
    from dnntune.workflows.tuning import GraphTuneReport, TuneOptions

    reports: list[GraphTuneReport] = []
    g = _epilogue_graph(dt.DataType.HALF)
    tune_library(
        [("mm_gelu.json", g)],
        tmp_path / "o.json",
        TuneOptions(max_iterations=3, timed_iterations=3),
        shard="candidates",
        device="cpu",
        on_report=reports.append,
    )
    (report,) = reports
    assert any(r.knobs.get("torch.intermediate_type") == "io" for r in report.results)


def test_a_variant_the_engine_refuses_for_the_graph_is_never_suggested() -> None:
    # issue 20: a variant an engine's own knob validation rejects must not reach a sweep
    engine = cast(Engine, _PickyEngine([PLANS, MODE]))
    variants = knob_variants(
        engine, cast(Any, None), one_at_a_time=True, max_values_per_knob=6, ranked_values=4
    )
    assert {"x.config": 2} not in variants
    assert {"x.config": 3} in variants
    full = knob_variants(engine, cast(Any, None), cap=1000)
    assert full and all(v.get("x.config") != 2 for v in full)


def test_a_providers_own_search_is_never_a_variant() -> None:
    """``Knob.search_values`` (torch.compile's max-autotune) are EXHAUSTIVE mode's priming: no
    enumeration, product or one knob at a time, offers them as variants."""
    searching = Knob(
        "x.mode",
        "mode",
        KnobValueType.STRING,
        "a",
        StringConstraint(frozenset({"a", "b", "search"})),
        search_values=frozenset({"search"}),
    )
    engine = cast(Engine, _Engine([searching]))
    for one_at_a_time in (False, True):
        assert knob_variants(engine, cast(Any, None), one_at_a_time=one_at_a_time) == [
            {"x.mode": "b"}
        ]


def test_torch_compile_leaves_max_autotune_to_exhaustive_priming() -> None:
    from dnntune.autotune.variants import sweep_variants
    from dnntune.backend.knobs import BENCHMARKING
    from dnntune.backend.registry import get_registry

    engine = get_registry().get("TORCH_COMPILE_ENGINE")
    mode = next(k for k in engine.knobs(None) if k.knob_id == "torch_compile.mode")
    assert "max-autotune-no-cudagraphs" in mode.search_values
    offered = [*knob_variants(engine, cast(Any, None)), *sweep_variants(engine, cast(Any, None))]
    assert offered and all("max-autotune" not in str(v) for v in offered)
    # the search itself stays reachable: EXHAUSTIVE priming sets global.benchmarking
    assert any(k.knob_id == BENCHMARKING for k in engine.knobs(None))


def test_values_that_write_an_engines_records_are_never_variants() -> None:
    """``Knob.persistent_values`` (Triton's perf-db policies): a sweep must not change what the
    builds after it read, so no sweep offers them, distinct or not."""
    knob = Knob(
        "x.policy",
        "policy",
        KnobValueType.INT64,
        0,
        IntConstraint(0, 3),
        persistent_values=frozenset({2, 3}),
    )
    engine = cast(Engine, _Engine([knob]))
    for one_at_a_time in (False, True):
        for distinct in (False, True):
            assert knob_variants(
                engine, cast(Any, None), one_at_a_time=one_at_a_time, distinct=distinct
            ) == [{"x.policy": 1}]


def _same_kernel_submit() -> Knob:
    """A submit knob whose value "graph" launches the default's kernels (in a CUDA graph)."""
    return Knob(
        "x.submit",
        "how the kernels are submitted",
        KnobValueType.STRING,
        "plain",
        StringConstraint(frozenset({"plain", "graph"})),
        same_kernel_values=frozenset({"graph"}),
    )


def _default_plan_pin() -> Knob:
    """A tile knob whose value 64 alone builds the default's plan."""
    return Knob(
        "x.block",
        "tile",
        KnobValueType.INT64,
        0,
        IntConstraint(valid_values=frozenset({0, 32, 64})),
        default_plan_values=frozenset({64}),
    )


def test_distinct_leaves_out_single_knob_values_that_build_the_default_plan() -> None:
    """``Knob.default_plan_values``: alone, such a value builds the default's plan (a pin of
    what the default config has); ``distinct`` drops it, a plain sweep keeps it, and a
    combination holding it is kept (not provably the same)."""
    pin = _default_plan_pin()
    engine = cast(Engine, _Engine([pin, MODE]))
    plain = knob_variants(engine, cast(Any, None), one_at_a_time=True)
    assert {"x.block": 64} in plain
    assert knob_variants(engine, cast(Any, None), one_at_a_time=True, distinct=True) == [
        {"x.block": 32},
        {"x.mode": "b"},
    ]
    product = knob_variants(engine, cast(Any, None), distinct=True)
    assert {"x.block": 64} not in product
    assert {"x.block": 64, "x.mode": "b"} in product


def _listed_plans(values: Any) -> Any:
    """A ranked plan index whose lists per mode name engine configs; -1 is not known."""
    lists = {"a": ["e0", "e1", "e2"], "b": ["e2", "e5", "e0"]}
    index = int(values["x.config"])
    return None if index < 0 else lists[str(values["x.mode"])][index]


def test_distinct_keeps_one_variant_per_plan_identity() -> None:
    """``Knob.plan_key``: variants naming one plan (by identity, not by index) are one
    candidate, the first in sweep order; unknown identities (-1 here) are all kept."""
    config = Knob(
        "x.config",
        "plan index",
        KnobValueType.INT64,
        -1,
        IntConstraint(-1, 2),
        ranked=True,
        plan_key=_listed_plans,
    )
    engine = cast(Engine, _Engine([MODE, config]))
    plain = knob_variants(engine, cast(Any, None))
    assert len(plain) == 2 * 4 - 1  # every (mode, index) but the default
    got = knob_variants(engine, cast(Any, None), distinct=True)
    assert got == [
        {"x.config": 0},
        {"x.config": 1},
        {"x.config": 2},
        {"x.mode": "b"},  # b's heuristic choice: not known without building, kept
        {"x.mode": "b", "x.config": 1},  # e5: not in a's list
    ]
    # a knob whose identity equals the default's: the default's plan, left out
    engine = cast(Engine, _Engine([dataclasses.replace(config, plan_key=lambda v: "same")]))
    assert knob_variants(engine, cast(Any, None), distinct=True) == []


def test_device_clock_sweeps_leave_out_values_that_launch_the_default_kernels() -> None:
    """``Knob.same_kernel_values`` (torch.compile's reduce-overhead: the default's kernels in a
    CUDA graph): a distinct sweep on the device clock drops such a value alone, since it
    times as the default does there; any other sweep keeps it, and so does a combination."""
    submit = _same_kernel_submit()
    engine = cast(Engine, _Engine([submit, MODE]))
    every = knob_variants(engine, cast(Any, None), distinct=True)
    assert {"x.submit": "graph"} in every
    assert knob_variants(engine, cast(Any, None), device_clock=True) == knob_variants(
        engine, cast(Any, None)
    )  # not distinct: kept
    on_device = knob_variants(engine, cast(Any, None), distinct=True, device_clock=True)
    assert {"x.submit": "graph"} not in on_device
    assert {"x.mode": "b"} in on_device and {"x.submit": "graph", "x.mode": "b"} in on_device


def test_the_oracle_leaves_torch_compiles_cuda_graph_mode_to_other_clocks() -> None:
    """bench --oracle ranks on the device clock: reduce-overhead (the default mode's Inductor
    kernels replayed through a CUDA graph) is no candidate of its STANDARD sweep, while
    EXHAUSTIVE (primed: max-autotune with CUDA graphs, other kernels) keeps it, and so does
    the tuner's own sweep, which ranks on call latency by default."""
    from dnntune.backend.registry import get_registry
    from dnntune.bench.oracle import oracle_variants
    from dnntune.rfc import TuneMode

    engine = get_registry().get("TORCH_COMPILE_ENGINE")
    graph = cast(Any, None)
    assert {"torch_compile.mode": "reduce-overhead"} not in oracle_variants(
        engine, graph, TuneMode.STANDARD
    )
    assert {"torch_compile.mode": "reduce-overhead"} in oracle_variants(
        engine, graph, TuneMode.EXHAUSTIVE
    )
    assert {"torch_compile.mode": "reduce-overhead"} in knob_variants(engine, graph)


def test_variant_log_messages_carry_the_autotune_prefix(caplog: pytest.LogCaptureFixture) -> None:
    """RFC 0013 6.4: every autotune log message starts with "autotune:", so one grep finds
    them; the variant enumeration's debug lines (refused, default-plan, same-kernel and
    duplicate variants, the one-knob-at-a-time fallback) were the only ones without it."""
    pin = _default_plan_pin()
    submit = _same_kernel_submit()
    same = dataclasses.replace(PLANS, plan_key=lambda v: None if int(v["x.config"]) < 3 else 1)
    caplog.set_level("DEBUG", logger="dnntune.autotune.variants")
    knob_variants(cast(Engine, _PickyEngine([PLANS, MODE])), cast(Any, None), cap=1000)
    engine = cast(Engine, _Engine([pin, submit, same]))
    knob_variants(engine, cast(Any, None), one_at_a_time=True, distinct=True, device_clock=True)
    messages = [r.getMessage() for r in caplog.records]
    for what in ("not valid", "one knob at a time", "default's plan", "default's kernels"):
        assert any(what in m for m in messages), (what, messages)
    assert any("already in the sweep" in m for m in messages), messages
    assert all(m.startswith("autotune: ") for m in messages), messages
