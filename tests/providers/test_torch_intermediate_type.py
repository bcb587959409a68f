"""TORCH_ENGINE's torch.intermediate_type knob: intermediates in the io type when asked."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import reference
from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LowerContext, LoweringOptions


def _fp16_matmul_bias_gelu() -> dt.Graph:
    g = dt.Graph(
        "mm_bias_gelu",
        io_data_type=dt.DataType.HALF,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    a, b = g.tensor("A", [32, 64]), g.tensor("B", [64, 48])
    bias = g.tensor("BIAS", [1, 48])
    y = g.pointwise(
        g.pointwise(g.matmul(a, b), bias, mode=dt.PointwiseMode.ADD), mode=dt.PointwiseMode.GELU_FWD
    )
    y.set_output(True)
    g.validate()
    return g


def test_knob_is_advertised_only_where_it_changes_something() -> None:
    engine = dt.get_registry().get("TORCH_ENGINE")
    assert "torch.intermediate_type" in {k.knob_id for k in engine.knobs(_fp16_matmul_bias_gelu())}
    g32 = dt.Graph(
        "f32",
        io_data_type=dt.DataType.FLOAT,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    a = g32.tensor("A", [4, 4])
    y = g32.pointwise(g32.pointwise(a, mode=dt.PointwiseMode.EXP), mode=dt.PointwiseMode.NEG)
    y.set_output(True)
    g32.validate()
    assert "torch.intermediate_type" not in {k.knob_id for k in engine.knobs(g32)}


def test_io_intermediates_lower_to_the_io_type() -> None:
    g = _fp16_matmul_bias_gelu()
    virtual = [t for t in g.tensors if t.is_virtual]
    assert lower(g, torch.device("cpu"), LoweringOptions(io_intermediates=True)).steps
    ctx = LowerContext(g, torch.device("cpu"), LoweringOptions(io_intermediates=True))
    assert {ctx.dtype(t) for t in virtual} == {torch.float16}
    ctx_exact = LowerContext(g, torch.device("cpu"), LoweringOptions())
    assert {ctx_exact.dtype(t) for t in virtual} == {torch.float32}


@pytest.mark.parametrize("mode", ["graph", "io"])
def test_both_modes_match_the_reference_at_fp16_tolerance(mode: str, cpu_handle: dt.Handle) -> None:
    g = _fp16_matmul_bias_gelu()
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext("TORCH_ENGINE", {"torch.intermediate_type": mode})
    g.check_support()
    g.build_plans()
    assert g.active_plan is not None
    assert g.active_plan.metadata["intermediate_type"] == mode
    pack = reference.make_inputs(g, cpu_handle.device, seed=3)
    expected = reference.run(g, pack)
    g.execute(cpu_handle, pack)
    (out,) = g.output_tensors()
    assert out.uid is not None and out.data_type is not None
    tol = reference.default_tolerance(out.data_type, dt.graph.OpKind.MATMUL)
    assert reference.compare(pack[out.uid], expected[out.uid], tol).ok
