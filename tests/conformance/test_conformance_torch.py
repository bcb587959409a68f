"""The CPU conformance tier: generated graphs on TORCH_ENGINE and TORCH_COMPILE_ENGINE.

The same generator as ``benchmarks/conformance.py`` (``dnntune.testing.conformance``), at the
small size, driven by Hypothesis. A plan may refuse a graph (``NotSupportedError`` /
``InvalidValueError``); one that runs must match ``dnntune.reference`` within the default
tolerance, with its output buffers filled with NaN beforehand (a kernel that skips elements
fails). A failing example prints the graph JSON: save it to a file and replay it with
``python benchmarks/conformance.py --replay FILE --device cpu`` or
``dnntune bench -g FILE --validate reference --device cpu``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import dnntune as dt
from dnntune import reference
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.testing.conformance import (
    DTYPES,
    OPS,
    SHAPE_CLASSES,
    ConformanceCase,
    build_case,
    layouts_for,
)

TORCH = "TORCH_ENGINE"
COMPILE = "TORCH_COMPILE_ENGINE"


@st.composite
def conformance_cases(draw: Any, ops: tuple[str, ...] = OPS) -> ConformanceCase:
    op = draw(st.sampled_from(ops))
    return build_case(
        op,
        draw(st.sampled_from(DTYPES)),
        draw(st.sampled_from(SHAPE_CLASSES)),
        draw(st.sampled_from(layouts_for(op))),
        seed=draw(st.integers(0, 2**20)),
        size="small",
    )


def _replay_hint(case: ConformanceCase, engine: str, knobs: dict[str, Any]) -> str:
    return (
        f"\n{case.name} ({case.detail}) on {engine} {knobs or '[default]'}; graph JSON (save it "
        "and run `python benchmarks/conformance.py --replay FILE --device cpu`):\n"
        + case.graph_json
    )


def check_plan(
    case: ConformanceCase, engine: str, knobs: dict[str, Any] | None = None, hypothesis: bool = True
) -> str:
    """Build ``engine`` with ``knobs`` for the case and check one execute; 'refused: ...' or
    'ok'. A wrong output fails the test with the graph JSON in the message."""
    knobs = knobs or {}
    if hypothesis:  # printed with the failing example
        note(_replay_hint(case, engine, knobs))
    handle = dt.create_handle("cpu")
    graph = case.graph()
    graph.build_operation_graph(handle)
    try:
        graph.create_execution_plan_ext(engine, knobs)
        graph.check_support()
        graph.build_plans()
    except (NotSupportedError, InvalidValueError) as exc:
        return f"refused: {exc}"
    pack = reference.make_inputs(graph, "cpu", seed=case.seed)
    outputs = graph.output_tensors()
    expected = reference.run(
        graph, {u: t for u, t in pack.items() if u not in {o.uid for o in outputs}}
    )
    for tensor in outputs:
        pack[tensor.uid].fill_(float("nan"))  # type: ignore[index]
    graph.execute(handle, pack, None)
    for tensor in outputs:
        assert tensor.uid is not None
        result = reference.compare(
            pack[tensor.uid], expected[tensor.uid], reference.tolerance_for(graph, tensor)
        )
        assert result.ok, f"output {tensor.name!r}: {result.message}" + _replay_hint(
            case, engine, knobs
        )
    return "ok"


_SLOW_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=100, deadline=None, suppress_health_check=_SLOW_HEALTH)
@given(case=conformance_cases())
def test_torch_engine_default_plan_matches_the_reference(case: ConformanceCase) -> None:
    # TORCH_ENGINE is every graph's fallback on the CPU: it must run each one, not refuse
    assert check_plan(case, TORCH) == "ok"


@settings(max_examples=60, deadline=None, suppress_health_check=_SLOW_HEALTH)
@given(case=conformance_cases(), data=st.data())
def test_torch_engine_variants_refuse_or_match(case: ConformanceCase, data: Any) -> None:
    from dnntune.autotune.variants import knob_variants
    from dnntune.backend.registry import get_registry

    engine = get_registry().get(TORCH)
    graph = case.graph()
    offered = [*engine.suggested_variants(graph), *knob_variants(engine, graph)]
    # CUDA-graph replay and the GPU-only attention kernels are refused on the CPU
    cpu = [
        v
        for v in offered
        if not v.get("torch.cuda_graph") and v.get("torch.sdpa_backend", "math") == "math"
    ]
    assert offered
    if not cpu:
        assert check_plan(case, TORCH, data.draw(st.sampled_from(offered))).startswith("refused")
        return
    knobs = data.draw(st.sampled_from(cpu))
    # a variant may refuse with a reason (NotSupportedError), never run and be wrong
    outcome = check_plan(case, TORCH, knobs)
    assert outcome == "ok" or outcome.startswith("refused"), outcome


def test_cpu_bf16_grouped_dilated_wgrad_in_channels_last_is_refused() -> None:
    """PyTorch's CPU defect found by this tier (torch 2.13): the weight gradient of a grouped,
    dilated bfloat16 convolution on channels-last tensors is garbage (1e20, NaN) in
    ``aten.convolution_backward`` itself. TORCH_ENGINE refuses its ``torch.memory_format=
    channels_last`` variant there; the default layout matches the reference."""
    # the example Hypothesis found: depthwise 7x7, dilation 2, padding 6, 17x31, bfloat16
    g = dt.Graph("wgrad", dt.DataType.BFLOAT16, dt.DataType.FLOAT, dt.DataType.FLOAT)
    dy, x = g.tensor("DY", [1, 6, 17, 31]), g.tensor("X", [1, 6, 17, 31])
    dw = g.conv_wgrad(dy, x, padding=6, stride=1, dilation=2, dw_dims=[6, 1, 7, 7])
    dw.set_name("DW").set_output(True)
    case = ConformanceCase(
        0, -1, "small", "conv_wgrad", "bf16", "contiguous", "tail", "", g.to_json()
    )
    knobs = {"torch.memory_format": "channels_last"}
    assert check_plan(case, TORCH, knobs, hypothesis=False).startswith("refused")
    assert check_plan(case, TORCH, {}, hypothesis=False) == "ok"


def test_every_cell_once_on_torch_engine() -> None:
    """A deterministic pass: one case of every (op, dtype, shape class) cell."""
    from dnntune.testing.conformance import generate_cases

    cases = list(generate_cases(seed=0, count=len(OPS) * len(DTYPES) * len(SHAPE_CLASSES)))
    assert {c.cell for c in cases} == {
        (o, d, s) for o in OPS for d in DTYPES for s in SHAPE_CLASSES
    }
    for case in cases:
        assert check_plan(case, TORCH, hypothesis=False) == "ok", case.name


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=_SLOW_HEALTH)
@given(case=conformance_cases(ops=("pointwise", "layernorm", "matmul", "reduction", "conv_fprop")))
def test_torch_compile_engine_refuses_or_matches(case: ConformanceCase) -> None:
    # torch.compile costs seconds per graph on two cores: few examples, ops it fuses
    outcome = check_plan(case, COMPILE)
    assert outcome == "ok" or "C++ compiler" in outcome, outcome
