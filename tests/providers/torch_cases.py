"""Small graphs covering every operation of the IR, for the torch engines' tests.

Each case builds a fresh :class:`dnntune.Graph` in a given io data type; ``run_and_compare``
builds one plan of an engine through the Graph facade, executes it and checks every output
against ``dnntune.reference`` with the reference's per-output tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import dnntune as dt
from dnntune import reference
from dnntune.graph.tensor import channels_last_strides

DT = dt.DataType
PW = dt.PointwiseMode

Builder = Callable[[dt.DataType], dt.Graph]


@dataclass(frozen=True)
class Case:
    name: str
    build: Builder

    def __str__(self) -> str:
        return self.name


def _graph(name: str, io: dt.DataType) -> dt.Graph:
    return dt.Graph(
        name=name, io_data_type=io, compute_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT
    )


# ---- convolution ----------------------------------------------------------------------------
def conv_bias_relu(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_bias_relu", io)
    x = g.tensor("X", [2, 4, 6, 6])
    w = g.tensor("W", [8, 4, 3, 3])
    b = g.tensor("B", [1, 8, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=PW.ADD)
    g.pointwise(y, mode=PW.RELU_FWD).set_output(True).set_name("Y")
    return g


def conv_fprop_grouped_strided(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_fprop_grouped", io)
    x = g.tensor("X", [2, 6, 9, 8])
    w = g.tensor("W", [4, 3, 3, 3])  # groups = 2
    g.conv_fprop(x, w, padding=[1, 2], stride=[2, 1], dilation=[1, 2]).set_output(True)
    return g


def conv_fprop_asymmetric_convolution(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_fprop_asym", io)
    x = g.tensor("X", [1, 3, 7, 7], strides=channels_last_strides([1, 3, 7, 7]))
    w = g.tensor("W", [5, 3, 3, 2])
    g.conv_fprop(
        x,
        w,
        pre_padding=[1, 0],
        post_padding=[0, 2],
        stride=[2, 2],
        conv_mode=dt.ConvMode.CONVOLUTION,
    ).set_output(True)
    return g


def conv_fprop_3d(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_fprop_3d", io)
    x = g.tensor("X", [1, 4, 5, 6, 5])
    w = g.tensor("W", [4, 2, 3, 3, 3])  # groups = 2
    g.conv_fprop(x, w, pre_padding=[1, 1, 0], post_padding=[1, 1, 1]).set_output(True)
    return g


def conv_dgrad_strided_grouped(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_dgrad", io)
    dy = g.tensor("DY", [2, 4, 4, 4])
    w = g.tensor("W", [4, 2, 3, 3])  # groups = 2 (dx has 4 channels)
    g.conv_dgrad(dy, w, padding=1, stride=2, dx_dims=[2, 4, 8, 7]).set_output(True)
    return g


def conv_dgrad_asymmetric_convolution(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_dgrad_asym", io)
    dy = g.tensor("DY", [1, 5, 4, 4])
    w = g.tensor("W", [5, 3, 3, 3])
    g.conv_dgrad(
        dy,
        w,
        pre_padding=[1, 0],
        post_padding=[0, 1],
        stride=2,
        dx_dims=[1, 3, 8, 8],
        conv_mode=dt.ConvMode.CONVOLUTION,
    ).set_output(True)
    return g


def conv_dgrad_3d(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_dgrad_3d", io)
    dy = g.tensor("DY", [1, 4, 3, 4, 3])
    w = g.tensor("W", [4, 3, 3, 3, 3])
    g.conv_dgrad(dy, w, padding=1, stride=[2, 1, 2], dx_dims=[1, 3, 5, 4, 6]).set_output(True)
    return g


def conv_wgrad_grouped_asymmetric(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_wgrad", io)
    x = g.tensor("X", [2, 4, 7, 6])
    dy = g.tensor("DY", [2, 6, 3, 3])
    g.conv_wgrad(
        dy,
        x,
        pre_padding=[1, 0],
        post_padding=[0, 1],
        stride=2,
        dw_dims=[6, 2, 3, 3],
        conv_mode=dt.ConvMode.CONVOLUTION,
    ).set_output(True)
    return g


def conv_wgrad_3d(io: dt.DataType) -> dt.Graph:
    g = _graph("conv_wgrad_3d", io)
    x = g.tensor("X", [1, 2, 4, 5, 4])
    dy = g.tensor("DY", [1, 3, 4, 5, 4])
    g.conv_wgrad(dy, x, padding=1, dw_dims=[3, 2, 3, 3, 3]).set_output(True)
    return g


# ---- matmul ---------------------------------------------------------------------------------
def matmul_broadcast(io: dt.DataType) -> dt.Graph:
    g = _graph("matmul_broadcast", io)
    a = g.tensor("A", [2, 1, 5, 8])
    b = g.tensor("B", [3, 8, 6])
    g.matmul(a, b).set_output(True)
    return g


def matmul_gelu(io: dt.DataType) -> dt.Graph:
    g = _graph("matmul_bias_gelu", io)
    a = g.tensor("A", [1, 16, 32])
    b = g.tensor("B", [1, 32, 24])
    bias = g.tensor("BIAS", [1, 1, 24])
    c = g.matmul(a, b)
    c = g.pointwise(c, bias, mode=PW.ADD)
    g.pointwise(c, mode=PW.GELU_FWD).set_output(True)
    return g


def matmul_out_variant(io: dt.DataType) -> dt.Graph:
    """A matmul whose output the caller owns, in the io type: written with ``out=``."""
    g = dt.Graph(name="matmul_out", io_data_type=io, intermediate_data_type=io)
    a = g.tensor("A", [4, 6])
    b = g.tensor("B", [6, 3])
    g.matmul(a, b).set_output(True)
    return g


# ---- pointwise ------------------------------------------------------------------------------
_PARAMS: dict[PW, dict[str, float]] = {
    PW.SWISH_FWD: {"swish_beta": 1.5},
    PW.ELU_FWD: {"elu_alpha": 0.7},
    PW.SOFTPLUS_FWD: {"softplus_beta": 2.0},
}


def pointwise_case(mode: PW, variant: str = "") -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph(f"pw_{mode.json_name}{variant}", io)
        x = g.tensor("X", [2, 3, 4, 5])
        params = dict(_PARAMS.get(mode, {}))
        if mode.arity == 1:
            y = g.pointwise(x, mode=mode, **params)
        elif mode.arity == 2 and variant == "_scalar":
            y = g.pointwise(x, 0.75, mode=mode)
        elif mode.arity == 2:
            y = g.pointwise(x, g.tensor("B", [1, 3, 1, 5]), mode=mode)
        else:
            y = g.pointwise(x, g.tensor("B", [2, 3, 4, 5]), g.tensor("C", [1, 3, 4, 5]), mode=mode)
        y.set_output(True)
        return g

    return Case(f"pointwise_{mode.json_name}{variant}", build)


def relu_clipped(io: dt.DataType) -> dt.Graph:
    g = _graph("relu_clipped", io)
    x = g.tensor("X", [2, 3, 8])
    g.pointwise(
        x, mode=PW.RELU_FWD, relu_lower_clip=-0.25, relu_upper_clip=0.5, relu_lower_clip_slope=0.1
    ).set_output(True)
    return g


def relu_leaky(io: dt.DataType) -> dt.Graph:
    g = _graph("relu_leaky", io)
    x = g.tensor("X", [2, 3, 8])
    g.pointwise(x, mode=PW.RELU_FWD, relu_lower_clip_slope=0.2).set_output(True)
    return g


def relu_clamp(io: dt.DataType) -> dt.Graph:
    g = _graph("relu_clamp", io)
    x = g.tensor("X", [2, 3, 8])
    g.pointwise(x, mode=PW.RELU_FWD, relu_lower_clip=-0.1, relu_upper_clip=0.6).set_output(True)
    return g


def compare_to_virtual(io: dt.DataType) -> dt.Graph:
    """A comparison feeding a select: booleans flow through an intermediate."""
    g = _graph("cmp_select", io)
    x = g.tensor("X", [3, 8])
    b = g.tensor("B", [3, 8])
    mask = g.pointwise(x, b, mode=PW.CMP_GT)
    g.pointwise(x, b, mask, mode=PW.BINARY_SELECT).set_output(True)
    return g


# ---- reduction and pooling ------------------------------------------------------------------
def reduction_case(mode: dt.ReductionMode, axes: tuple[int, ...] = (1, 3)) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph(f"reduce_{mode.json_name}", io)
        x = g.tensor("X", [2, 4, 3, 5])
        g.reduction(x, mode=mode, axes=list(axes)).set_output(True)
        return g

    suffix = "_none" if not axes else ""
    return Case(f"reduction_{mode.json_name}{suffix}", build)


def reduction_nothing(mode: dt.ReductionMode) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph(f"reduce_none_{mode.json_name}", io)
        x = g.tensor("X", [2, 1, 3])
        g.reduction(x, mode=mode, y_dims=[2, 1, 3]).set_output(True)
        return g

    return Case(f"reduction_{mode.json_name}_no_axis", build)


def pool_case(mode: dt.ResampleMode, asymmetric: bool, rank: int = 4) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph(f"pool_{mode.json_name}", io)
        n = rank - 2
        x = g.tensor("X", [2, 3, *([7, 6, 5][:n])])
        if asymmetric:
            y = g.resample(
                x,
                mode=mode,
                window=3,
                stride=2,
                pre_padding=[1, 0, 1][:n],
                post_padding=[0, 1, 1][:n],
            )
        else:
            y = g.resample(x, mode=mode, window=3, stride=2, padding=1)
        y.set_output(True)
        return g

    tag = "asym" if asymmetric else "sym"
    return Case(f"resample_{mode.json_name}_{tag}_{rank - 2}d", build)


# ---- normalisation --------------------------------------------------------------------------
def layernorm_case(training: bool, full_scale: bool = True, runtime_eps: bool = False) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph("layernorm", io)
        x = g.tensor("X", [4, 6, 8])
        shape = [1, 6, 8] if full_scale else [1, 1, 8]
        s = g.tensor("S", shape, data_type=DT.FLOAT)
        b = g.tensor("B", shape, data_type=DT.FLOAT)
        eps: dt.TensorAttributes | float = 1e-5
        if runtime_eps:
            eps = g.tensor("EPS", [1], data_type=DT.FLOAT)
        phase = dt.NormFwdPhase.TRAINING if training else dt.NormFwdPhase.INFERENCE
        outs = g.layernorm(x, s, b, eps, forward_phase=phase, normalized_dim_count=2)
        for t in outs:
            t.set_output(True)
        return g

    name = "layernorm_" + ("training" if training else "inference")
    name += "" if full_scale else "_broadcast_scale"
    name += "_runtime_eps" if runtime_eps else ""
    return Case(name, build)


def rmsnorm_case(training: bool, bias: bool) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph("rmsnorm", io)
        x = g.tensor("X", [4, 16])
        s = g.tensor("S", [1, 16])
        b = g.tensor("B", [1, 16]) if bias else None
        phase = dt.NormFwdPhase.TRAINING if training else dt.NormFwdPhase.INFERENCE
        for t in g.rmsnorm(x, s, 1e-5, b, forward_phase=phase):
            t.set_output(True)
        return g

    return Case(
        f"rmsnorm_{'training' if training else 'inference'}{'_bias' if bias else ''}", build
    )


def batchnorm_case(running: bool) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph("batchnorm", io)
        x = g.tensor("X", [4, 3, 5, 5])
        per = [1, 3, 1, 1]
        s, b = g.tensor("S", per, data_type=DT.FLOAT), g.tensor("B", per, data_type=DT.FLOAT)
        kwargs = {}
        if running:
            kwargs = {
                "prev_running_mean": g.tensor("RM", per, data_type=DT.FLOAT),
                "prev_running_variance": g.tensor("RV", per, data_type=DT.FLOAT),
                "momentum": 0.1,
            }
        for t in g.batchnorm(x, s, b, 1e-5, **kwargs):  # type: ignore[arg-type]
            t.set_output(True)
        return g

    return Case(f"batchnorm_training{'_running' if running else ''}", build)


def batchnorm_inference(io: dt.DataType) -> dt.Graph:
    g = _graph("bn_inference", io)
    x = g.tensor("X", [2, 4, 3, 3])
    per = [1, 4, 1, 1]
    stats = [g.tensor(n, per, data_type=DT.FLOAT) for n in ("M", "IV", "S", "B")]
    g.batchnorm_inference(x, *stats).set_output(True)
    return g


def batchnorm_backward(io: dt.DataType) -> dt.Graph:
    g = _graph("bn_backward", io)
    x, dy = g.tensor("X", [4, 3, 4, 4]), g.tensor("DY", [4, 3, 4, 4])
    per = [1, 3, 1, 1]
    m, iv, s = (g.tensor(n, per, data_type=DT.FLOAT) for n in ("M", "IV", "S"))
    for t in g.batchnorm_backward(dy, x, m, iv, s):
        t.set_output(True)
    return g


# ---- attention ------------------------------------------------------------------------------
def sdpa_case(
    name: str,
    *,
    heads: tuple[int, int] = (4, 4),
    seq: tuple[int, int] = (8, 8),
    mask: str = "",
    causal: bool = False,
    bottom_right: bool = False,
    stats: bool = False,
    scale: float | None = None,
) -> Case:
    def build(io: dt.DataType) -> dt.Graph:
        g = _graph(f"sdpa_{name}", io)
        (h, hk), (sq, skv) = heads, seq
        q = g.tensor("Q", [2, h, sq, 16])
        k = g.tensor("K", [2, hk, skv, 16])
        v = g.tensor("V", [2, hk, skv, 16])
        m = None
        if mask == "bool":
            m = g.tensor("M", [2, 1, sq, skv], data_type=DT.BOOLEAN)
        elif mask == "additive":
            m = g.tensor("M", [1, h, sq, skv])
        outs = g.sdpa(
            q,
            k,
            v,
            attn_mask=m,
            causal_mask=causal,
            causal_mask_bottom_right=bottom_right,
            attn_scale=scale,
            generate_stats=stats,
        )
        for t in outs:
            t.set_output(True)
        return g

    return Case(f"sdpa_{name}", build)


SDPA_CASES = [
    sdpa_case("plain"),
    sdpa_case("causal", causal=True, scale=0.3),
    sdpa_case("bottom_right", seq=(4, 9), bottom_right=True),
    sdpa_case("gqa_causal", heads=(4, 2), causal=True),
    sdpa_case("bool_mask_causal", mask="bool", causal=True),
    sdpa_case("additive_mask", mask="additive", seq=(8, 6)),
    sdpa_case("stats", heads=(4, 2), mask="additive", causal=True, stats=True),
]

CASES: list[Case] = [
    Case("conv_bias_relu", conv_bias_relu),
    Case("conv_fprop_grouped_strided", conv_fprop_grouped_strided),
    Case("conv_fprop_asymmetric_convolution", conv_fprop_asymmetric_convolution),
    Case("conv_fprop_3d", conv_fprop_3d),
    Case("conv_dgrad_strided_grouped", conv_dgrad_strided_grouped),
    Case("conv_dgrad_asymmetric_convolution", conv_dgrad_asymmetric_convolution),
    Case("conv_dgrad_3d", conv_dgrad_3d),
    Case("conv_wgrad_grouped_asymmetric", conv_wgrad_grouped_asymmetric),
    Case("conv_wgrad_3d", conv_wgrad_3d),
    Case("matmul_broadcast", matmul_broadcast),
    Case("matmul_gelu", matmul_gelu),
    Case("matmul_out_variant", matmul_out_variant),
    *(pointwise_case(m) for m in PW),
    *(pointwise_case(m, "_scalar") for m in PW if m.arity == 2),
    Case("relu_clipped", relu_clipped),
    Case("relu_leaky", relu_leaky),
    Case("relu_clamp", relu_clamp),
    Case("compare_to_virtual", compare_to_virtual),
    *(reduction_case(m) for m in dt.ReductionMode),
    *(
        reduction_nothing(m)
        for m in (dt.ReductionMode.ADD, dt.ReductionMode.NORM2, dt.ReductionMode.AMAX)
    ),
    *(pool_case(m, asym) for m in dt.ResampleMode for asym in (False, True)),
    pool_case(dt.ResampleMode.AVGPOOL_EXCLUDE_PADDING, True, rank=5),
    pool_case(dt.ResampleMode.MAXPOOL, False, rank=5),
    layernorm_case(False),
    layernorm_case(True),
    layernorm_case(False, full_scale=False),
    layernorm_case(True, runtime_eps=True),
    rmsnorm_case(False, False),
    rmsnorm_case(False, True),
    rmsnorm_case(True, True),
    batchnorm_case(False),
    batchnorm_case(True),
    Case("batchnorm_inference", batchnorm_inference),
    Case("batchnorm_backward", batchnorm_backward),
    *SDPA_CASES,
]


def run_and_compare(
    graph: dt.Graph,
    handle: dt.Handle,
    engine: str,
    knobs: dict[str, int | float | str] | None = None,
    seed: int = 0,
) -> dict[int, torch.Tensor]:
    """Build one plan of ``engine`` for ``graph``, execute it, assert it matches the reference."""
    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext(engine, knobs or {})
    graph.check_support()
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    pack = reference.make_inputs(graph, handle.device, seed=seed)
    graph.execute(handle, pack)
    expect_all(graph, pack)
    return pack


def run_single_output(
    graph: dt.Graph, handle: dt.Handle, engine: str, inputs: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Build one plan of ``engine`` for ``graph``, run it on ``inputs`` (by tensor name) into
    an output that holds no answer (NaN; 99 for an integer or boolean output, so an unwritten
    element fails), assert it matches the reference, and return that one output."""
    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext(engine, {})
    graph.check_support()
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    pack = reference.make_outputs(graph, handle.device)
    for t in graph.input_tensors():
        assert t.uid is not None
        pack[t.uid] = inputs[t.name]
    (y,) = graph.output_tensors()
    assert y.uid is not None
    pack[y.uid].fill_(float("nan") if pack[y.uid].is_floating_point() else 99)
    expected = reference.run(graph, pack)
    graph.execute(handle, pack)
    result = reference.check_outputs(graph, pack, expected)
    assert result.ok, result
    return pack[y.uid]


def expect_all(graph: dt.Graph, pack: dict[int, torch.Tensor]) -> None:
    """Every output in ``pack`` matches the reference within its tolerance."""
    expected = reference.run(graph, pack)
    for t in graph.output_tensors():
        assert t.uid is not None
        result = reference.compare(pack[t.uid], expected[t.uid], reference.tolerance_for(graph, t))
        assert result.ok, f"{graph.name}: {t.name}: {result.message}"


def fnv1a_64(text: str) -> int:
    """64-bit FNV-1a as a signed int64, computed here independently of dnntune."""
    value = 14695981039346656037
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * 1099511628211) % 2**64
    return value - 2**64 if value >= 2**63 else value


__all__ = ["CASES", "SDPA_CASES", "Case", "expect_all", "fnv1a_64", "run_and_compare"]
