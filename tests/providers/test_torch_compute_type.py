"""The torch engines compute an op whose result is kept wider than its operands (fp16/bf16 data
into a float32 output) in that wider type, as cuDNN computes it in its compute type; graphs
whose outputs are as narrow as their inputs lower exactly as before (no cast, no cost)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch_cases import CASES, SDPA_CASES, Case, run_and_compare, run_single_output

import dnntune as dt
from dnntune.providers._torch.compute_type import widened_operands
from dnntune.providers._torch.program import LowerContext, LoweringOptions

FLOAT, HALF, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
PW = dt.PointwiseMode
CPU = torch.device("cpu")


def _graph(name: str, io: dt.DataType, compute: dt.DataType | None = FLOAT) -> dt.Graph:
    return dt.Graph(name, io_data_type=io, compute_data_type=compute, intermediate_data_type=FLOAT)


def add(io: dt.DataType) -> dt.Graph:
    g = _graph("add", io)
    a, b = g.tensor("A", [64, 257]), g.tensor("B", [64, 257])
    g.pointwise(a, b, mode=PW.ADD).set_output(True).set_data_type(FLOAT)
    return g


def add_mul_relu(io: dt.DataType) -> dt.Graph:
    """Three pointwise ops through float32 intermediates; only the last writes an output."""
    g = _graph("add_mul_relu", io)
    a, b, c = g.tensor("A", [64, 257]), g.tensor("B", [64, 257]), g.tensor("C", [1, 257])
    y = g.pointwise(g.pointwise(a, b, mode=PW.ADD), c, mode=PW.MUL)
    g.pointwise(y, mode=PW.RELU_FWD).set_output(True).set_data_type(FLOAT)
    return g


def exp_times_scalar(io: dt.DataType) -> dt.Graph:
    g = _graph("exp_times_scalar", io)
    a = g.tensor("A", [64, 257])
    y = g.pointwise(g.pointwise(a, mode=PW.EXP), g.scalar(0.3), mode=PW.MUL)
    y.set_output(True).set_data_type(FLOAT)
    return g


def avg_pool(io: dt.DataType) -> dt.Graph:
    g = _graph("avg_pool", io)
    x = g.tensor("X", [2, 8, 16, 16])
    y = g.resample(
        x, mode=dt.ResampleMode.AVGPOOL_INCLUDE_PADDING, window=[3, 3], stride=[1, 1], padding=1
    )
    y.set_output(True).set_data_type(FLOAT)
    return g


def avg_pool_asymmetric(io: dt.DataType) -> dt.Graph:
    """Padding excluded through a rescaling multiply (TORCH_COMPILE_ENGINE failed this one)."""
    g = _graph("avg_pool_asymmetric", io)
    x = g.tensor("X", [2, 8, 16, 16])
    y = g.resample(
        x,
        mode=dt.ResampleMode.AVGPOOL_EXCLUDE_PADDING,
        window=[3, 3],
        stride=[2, 2],
        pre_padding=[1, 0],
        post_padding=[0, 1],
    )
    y.set_output(True).set_data_type(FLOAT)
    return g


def global_avg_pool(io: dt.DataType) -> dt.Graph:
    g = _graph("global_avg_pool", io)
    x = g.tensor("X", [2, 8, 16, 16])
    y = g.resample(x, mode=dt.ResampleMode.AVGPOOL_INCLUDE_PADDING, window=[16, 16], stride=1)
    y.set_output(True).set_data_type(FLOAT)
    return g


def layernorm(io: dt.DataType) -> dt.Graph:
    g = _graph("layernorm", io)
    x, s, b = g.tensor("X", [8, 16, 256]), g.tensor("S", [1, 1, 256]), g.tensor("B", [1, 1, 256])
    (y,) = g.layernorm(x, s, b, 1e-5)
    y.set_output(True).set_data_type(FLOAT)
    return g


def rmsnorm(io: dt.DataType) -> dt.Graph:
    g = _graph("rmsnorm", io)
    x, s = g.tensor("X", [8, 16, 256]), g.tensor("S", [1, 1, 256])
    (y,) = g.rmsnorm(x, s, 1e-5)
    y.set_output(True).set_data_type(FLOAT)
    return g


def batchnorm_inference(io: dt.DataType) -> dt.Graph:
    g = _graph("batchnorm_inference", io)
    x = g.tensor("X", [4, 8, 8, 8])
    m, v, s, b = (g.tensor(n, [1, 8, 1, 1]) for n in "MVSB")
    g.batchnorm_inference(x, m, v, s, b).set_output(True).set_data_type(FLOAT)
    return g


def matmul(io: dt.DataType) -> dt.Graph:
    g = _graph("matmul", io)
    a, b = g.tensor("A", [64, 512]), g.tensor("B", [512, 48])
    g.matmul(a, b).set_output(True).set_data_type(FLOAT)
    return g


def conv_bias_relu(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_bias_relu", io)
    x, w = g.tensor("X", [2, 32, 12, 12]), g.tensor("W", [16, 32, 3, 3])
    y = g.pointwise(g.conv_fprop(x, w, padding=1), g.tensor("B", [1, 16, 1, 1]), mode=PW.ADD)
    g.pointwise(y, mode=PW.RELU_FWD).set_output(True).set_data_type(FLOAT)
    return g


WIDER_OUTPUT = [
    Case(f.__name__, f)
    for f in (
        add,
        add_mul_relu,
        exp_times_scalar,
        avg_pool,
        avg_pool_asymmetric,
        global_avg_pool,
        layernorm,
        rmsnorm,
        batchnorm_inference,
        matmul,
        conv_bias_relu,
    )
]


@pytest.mark.parametrize("io", [HALF, BF16], ids=lambda d: d.json_name)
@pytest.mark.parametrize("case", WIDER_OUTPUT, ids=str)
def test_half_data_into_a_float_output_matches_the_reference(
    case: Case, io: dt.DataType, cpu_handle: dt.Handle
) -> None:
    """Computed in fp16/bf16 and widened, these were 2e-4 to 1.3e-2 off the float32 answer
    (float tolerance: rtol 1e-4; conv/matmul 1e-3): TORCH_ENGINE failed verification."""
    run_and_compare(case.build(io), cpu_handle, "TORCH_ENGINE")


@pytest.mark.slow
@pytest.mark.parametrize("builder", [avg_pool_asymmetric, add_mul_relu], ids=lambda f: f.__name__)
def test_compile_engine_computes_them_in_float_too(
    builder: Callable[[dt.DataType], dt.Graph], cpu_handle: dt.Handle
) -> None:
    run_and_compare(builder(HALF), cpu_handle, "TORCH_COMPILE_ENGINE")


def _widened(graph: dt.Graph, options: LoweringOptions | None = None) -> dict[str, list[str]]:
    """{node name: names of the operands it reads wider}."""
    graph.validate()
    ctx = LowerContext(graph, CPU, options or LoweringOptions())
    widened = widened_operands(ctx.graph, ctx.slot_dtype)
    names = {id(t): t.name or "" for t in graph.tensors}
    return {
        n.name: sorted(names[i] for i in widened[id(n)]) for n in graph.nodes if id(n) in widened
    }


def test_only_the_nodes_whose_result_is_kept_wide_are_widened() -> None:
    # the add's float32 result flows into the float32 output; the mul and the relu read the
    # float32 intermediate, so ATen's promotion already computes them in float32
    assert _widened(add_mul_relu(HALF)) == {"pointwise_0": ["A", "B"]}


@pytest.mark.parametrize("io", [HALF, BF16, FLOAT], ids=lambda d: d.json_name)
@pytest.mark.parametrize("case", CASES + SDPA_CASES, ids=str)
def test_graphs_whose_outputs_are_as_narrow_as_their_inputs_are_lowered_as_before(
    case: Case, io: dt.DataType
) -> None:
    """fp16 in, fp16 out through float32 intermediates (conv -> bias -> relu): rounding the
    intermediates early is within the output's tolerance, so no node pays a cast."""
    assert _widened(case.build(io)) == {}


def test_a_half_intermediate_is_kept_half() -> None:
    """A declared fp16 intermediate holds fp16, as cuDNN stores it (its tolerance says so)."""
    g = dt.Graph("half_virtual", io_data_type=HALF, compute_data_type=FLOAT)
    g.intermediate_data_type = HALF
    a, b = g.tensor("A", [4, 4]), g.tensor("B", [4, 4])
    y = g.pointwise(g.pointwise(a, b, mode=PW.ADD), mode=PW.RELU_FWD)
    y.set_output(True).set_data_type(FLOAT)
    assert _widened(g) == {"pointwise_1": ["pointwise_0::OUT_0"]}


def test_a_half_compute_type_computes_in_half() -> None:
    """cuDNN computes in the node's (else the graph's) compute type: HALF widens nothing; an
    unset one is float, as CUDNN_ENGINE lowers it."""
    half = dt.Graph("add_half_compute", io_data_type=HALF, compute_data_type=HALF)
    a, b = half.tensor("A", [4, 4]), half.tensor("B", [4, 4])
    half.pointwise(a, b, mode=PW.ADD).set_output(True).set_data_type(FLOAT)
    assert _widened(half) == {}
    unset = dt.Graph("add_unset_compute", io_data_type=HALF)
    a, b = unset.tensor("A", [4, 4]), unset.tensor("B", [4, 4])
    unset.pointwise(a, b, mode=PW.ADD).set_output(True).set_data_type(FLOAT)
    assert _widened(unset) == {"pointwise_0": ["A", "B"]}


def test_a_norm_with_half_y_and_float_statistics_keeps_its_half_kernel() -> None:
    """Widened only for its narrowest result: the statistics come out of ATen in float32."""
    g = _graph("layernorm_training", HALF)
    x, s, b = g.tensor("X", [8, 256]), g.tensor("S", [1, 256]), g.tensor("B", [1, 256])
    y, mean, inv = g.layernorm(x, s, b, 1e-5, forward_phase=dt.NormFwdPhase.TRAINING)
    y.set_output(True)
    mean.set_output(True).set_data_type(FLOAT)
    inv.set_output(True).set_data_type(FLOAT)
    assert _widened(g) == {}


def test_the_io_intermediate_knob_still_rounds_intermediates() -> None:
    """``torch.intermediate_type=io`` holds intermediates in fp16; the last node, which writes
    the float32 output, reads its fp16 operand as float32."""
    got = _widened(add_mul_relu(HALF), LoweringOptions(io_intermediates=True))
    assert got == {"pointwise_2": ["pointwise_1::OUT_0"]}


# ---- half data kept in bfloat16, bfloat16 data kept in half -----------------------------------
ENGINES = ["TORCH_ENGINE", pytest.param("TORCH_COMPILE_ENGINE", marks=pytest.mark.slow)]


def _mul_across(data: dt.DataType, out: dt.DataType) -> dt.Graph:
    g = _graph(f"mul_{data.json_name}_to_{out.json_name}", out)
    a, b = g.tensor("A", [1, 3], data_type=data), g.tensor("B", [1, 3], data_type=data)
    g.pointwise(a, b, mode=PW.MUL).set_output(True).set_data_type(out)
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_half_data_into_a_bfloat16_output_is_not_computed_in_half(
    engine: str, cpu_handle: dt.Handle
) -> None:
    """Half and bfloat16 are the same size, so the width test read a bfloat16 output as no
    wider than half data: ATen multiplied in half, 300 * 400 = inf (half's largest is 65504),
    where the reference and cuDNN's float compute give 120000 (119808 in bfloat16)."""
    values = torch.tensor([[300.0, 2.0, -0.5]], dtype=torch.half)
    factors = torch.tensor([[400.0, 3.0, 0.25]], dtype=torch.half)
    got = run_single_output(
        _mul_across(HALF, BF16), cpu_handle, engine, {"A": values, "B": factors}
    )
    assert got.tolist() == [[119808.0, 6.0, -0.125]]


# Inductor warns while it compiles a kernel that reads bfloat16 and writes half (its answer is
# right); the suite turns warnings into errors
@pytest.mark.filterwarnings("ignore:bf16 and fp16 are mixed:UserWarning")
@pytest.mark.parametrize("engine", ENGINES)
def test_bfloat16_data_into_a_half_output_is_not_rounded_to_bfloat16(
    engine: str, cpu_handle: dt.Handle
) -> None:
    """10.0625 * 10.0625 = 101.25390625: computed in bfloat16 it was 101.0 (0.25 off, outside
    half's tolerance of 0.2); half holds 101.25."""
    values = torch.tensor([[10.0625, 1.5, -3.0]], dtype=torch.bfloat16)
    got = run_single_output(_mul_across(BF16, HALF), cpu_handle, engine, {"A": values, "B": values})
    assert got.tolist() == [[101.25, 2.25, 9.0]]


def test_half_and_bfloat16_read_each_other_in_float() -> None:
    assert _widened(_mul_across(HALF, BF16)) == {"pointwise_0": ["A", "B"]}
    assert _widened(_mul_across(BF16, HALF)) == {"pointwise_0": ["A", "B"]}
    assert _widened(_mul_across(HALF, HALF)) == {}


@pytest.mark.parametrize("engine", ENGINES)
def test_half_matmul_into_a_bfloat16_output(engine: str, cpu_handle: dt.Handle) -> None:
    """The same for a matmul: a dot of half data past 65504 was inf in a bfloat16 output."""
    g = _graph("matmul_half_to_bf16", BF16)
    a = g.tensor("A", [2, 4], data_type=HALF)
    b = g.tensor("B", [4, 3], data_type=HALF)
    g.matmul(a, b).set_output(True).set_data_type(BF16)
    a_v = torch.full((2, 4), 200.0, dtype=torch.half)
    b_v = torch.full((4, 3), 100.0, dtype=torch.half)
    got = run_single_output(g, cpu_handle, engine, {"A": a_v, "B": b_v})
    assert got.float().eq(79872.0).all(), got  # 80000 in bfloat16


@pytest.mark.parametrize("compute", [HALF, BF16], ids=lambda d: d.json_name)
def test_a_16_bit_compute_type_into_a_float_output_passes_verification(
    compute: dt.DataType, cpu_handle: dt.Handle
) -> None:
    """TORCH_ENGINE computes in the declared half/bfloat16 compute type (above), and the
    reference's tolerance for the float32 output was float32's: 2e-4 off, failed."""
    g = dt.Graph("sqrt_16_bit_compute", io_data_type=compute, compute_data_type=FLOAT)
    x = g.tensor("X", [5, 7])
    y = g.pointwise(g.pointwise(x, mode=PW.SQRT, compute_data_type=compute), mode=PW.SQRT)
    y.set_output(True).set_data_type(FLOAT)
    values = torch.linspace(0.5, 2.0, 35, dtype=compute.to_torch()).reshape(5, 7)
    got = run_single_output(g, cpu_handle, "TORCH_ENGINE", {"X": values})
    assert not torch.isnan(got).any()
