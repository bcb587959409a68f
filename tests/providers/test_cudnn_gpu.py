"""CUDNN_ENGINE on a GPU: every lowered op and fusion against ``dnntune.reference`` with explicit
tolerances, cuDNN's plan list through ``cudnn.engine_config``, the search and its find db,
streams, and clean declines. Skipped without CUDA or without nvidia-cudnn-frontend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.cudnn.support import has_fp32_dot
from dnntune.reference import Tolerance, compare, make_inputs, run, tolerance_for

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]

H, BF, F = dt.DataType.HALF, dt.DataType.BFLOAT16, dt.DataType.FLOAT
#: dot products (conv, matmul, attention): fp32 gets 1e-2, the tolerance of TF32 tensor cores
#: (cudnn.allow_tf32=1); plans built with the default (TF32 deselected) are held to the
#: library's float32 tolerance instead (check_fp32_dot)
DOT_TOL = {H: Tolerance(5e-3, 5e-3), BF: Tolerance(3e-2, 3e-2), F: Tolerance(1e-2, 1e-2)}
TF32_NOTES = ["TENSOR_CORE", "DOWN_CONVERT_INPUTS"]
#: element-wise and normalisation outputs
ELEM_TOL = {H: Tolerance(4e-3, 4e-3), BF: Tolerance(2e-2, 2e-2), F: Tolerance(1e-4, 1e-4)}
STAT_TOL = Tolerance(2e-3, 2e-3)


@pytest.fixture(autouse=True)
def _needs_frontend() -> None:
    from dnntune.providers.cudnn import CudnnEngine

    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))


class CountingTimer:
    """The handle's real timer, counting how often something is timed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.calls = 0

    def synchronize(self) -> None:
        self.inner.synchronize()

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        self.calls += 1
        return float(self.inner.time_ms(fn, repeats))


def build(g: dt.Graph, handle: dt.Handle, knobs: Mapping[str, Any] | None = None) -> dt.Plan:
    g.build_operation_graph(handle)
    g.create_execution_plan_ext("CUDNN_ENGINE", dict(knobs or {}))
    g.check_support()
    g.build_plans()
    plan = g.active_plan
    assert plan is not None
    return plan


def execute(g: dt.Graph, handle: dt.Handle, seed: int = 0) -> dict[int, Any]:
    pack = make_inputs(g, "cuda", seed=seed)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute(handle, pack, ws)
    torch.cuda.synchronize()
    return pack


_STAT_FIELDS = (
    "mean_tensor_uid",
    "inv_variance_tensor_uid",
    "inv_rms_tensor_uid",
    "stats_tensor_uid",
)


def check(g: dt.Graph, pack: Mapping[int, Any], tol: Tolerance) -> None:
    """Every output of ``g`` in ``pack`` matches the reference (statistics: STAT_TOL)."""
    expected = run(g, pack)
    stats = {id(t) for n in g.nodes for f, t in n.outputs.items() if f in _STAT_FIELDS}
    for t in g.output_tensors():
        assert t.uid is not None
        result = compare(pack[t.uid], expected[t.uid], STAT_TOL if id(t) in stats else tol)
        assert result.ok, f"{g.name}: output {t.name}: {result.message}"


def build_run_check(
    g: dt.Graph, handle: dt.Handle, tol: Tolerance, knobs: Mapping[str, Any] | None = None
) -> dt.Plan:
    plan = build(g, handle, knobs)
    check(g, execute(g, handle), tol)
    return plan


def check_exact(g: dt.Graph, pack: Mapping[int, Any]) -> None:
    """Every output matches the reference within the library's default tolerance (float32:
    rtol 1e-3, atol 1e-4 for dot products; what TF32 rounding fails)."""
    expected = run(g, pack)
    for t in g.output_tensors():
        assert t.uid is not None
        result = compare(pack[t.uid], expected[t.uid], tolerance_for(g, t))
        assert result.ok, f"{g.name}: output {t.name}: {result.message}"


def check_fp32_dot(make: Callable[[], dt.Graph], handle: dt.Handle) -> str:
    """A float32 convolution or matmul graph: by default (cudnn.allow_tf32=0) its plan computes
    in float32 and matches at the float32 tolerance, or cuDNN has no such plan and the build
    says to set the knob; with cudnn.allow_tf32=1 it runs (TF32 allowed) at DOT_TOL."""
    g = make()
    try:
        plan = build(g, handle)
    except NotSupportedError as exc:
        assert "cudnn.allow_tf32" in str(exc), str(exc)
        outcome = "declined without TF32"
    else:
        assert plan.metadata["cudnn_excluded_numeric_notes"] == TF32_NOTES
        assert plan.metadata["cudnn_allow_tf32"] is False
        check_exact(g, execute(g, handle))
        outcome = "exact float32"
    tf32 = build_run_check(make(), handle, DOT_TOL[F], {"cudnn.allow_tf32": 1})
    assert tf32.metadata["cudnn_excluded_numeric_notes"] == []
    assert tf32.metadata["cudnn_allow_tf32"] is True
    report({"graph": g.name, "fp32": outcome, "tf32_plan": tf32.metadata["cudnn_plan_name"]})
    return outcome


def report(outcome: Mapping[str, Any]) -> None:
    """Append ``outcome`` to the file named by ``CUDNN_TEST_REPORT`` (the support matrix)."""
    path = os.environ.get("CUDNN_TEST_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(outcome)) + "\n")


def runs_or_declines_cleanly(g: dt.Graph, handle: dt.Handle, tol: Tolerance) -> str:
    """Either the graph matches the reference, or CUDNN_ENGINE says why it cannot run it."""
    try:
        plan = build(g, handle)
    except NotSupportedError as exc:
        assert "CUDNN_ENGINE" in str(exc) or "cuDNN" in str(exc)
        report({"graph": g.name, "declined": str(exc)[:300]})
        return "declined"
    check(g, execute(g, handle), tol)
    report({"graph": g.name, "plan": plan.metadata["cudnn_plan_name"]})
    return "ran"


# ---- graphs ---------------------------------------------------------------------------------
def strides(dims: list[int], layout: str) -> list[int]:
    _, c, h, w = dims
    return [c * h * w, 1, w * c, c] if layout == "nhwc" else [c * h * w, h * w, w, 1]


def conv_bias_relu(
    dtype: dt.DataType,
    layout: str,
    n: int = 4,
    c: int = 32,
    hw: int = 14,
    k: int = 64,
    r: int = 3,
    stride: int = 1,
    pad: int = 1,
) -> dt.Graph:
    g = dt.Graph(
        name=f"conv_bias_relu_{layout}",
        io_data_type=dtype,
        compute_data_type=F,
        intermediate_data_type=F,
    )
    x = g.tensor(name="X", dims=[n, c, hw, hw], strides=strides([n, c, hw, hw], layout))
    w = g.tensor(name="W", dims=[k, c, r, r], strides=strides([k, c, r, r], layout))
    b = g.tensor(name="B", dims=[1, k, 1, 1])
    y = g.conv_fprop(x, w, padding=pad, stride=stride)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


# ---- ops and fusions against the reference --------------------------------------------------
@pytest.mark.parametrize("dtype", [H, BF], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_conv_bias_relu(cuda_handle: dt.Handle, dtype: dt.DataType, layout: str) -> None:
    g = conv_bias_relu(dtype, layout)
    plan = build_run_check(g, cuda_handle, DOT_TOL[dtype])
    assert plan.metadata["selection"] in ("heuristic", "find_db")
    assert isinstance(plan.metadata["cudnn_plan_name"], str)
    assert plan.metadata["cudnn_excluded_numeric_notes"] == []  # fp16/bf16: tensor cores stay


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_conv_bias_relu_fp32(cuda_handle: dt.Handle, layout: str) -> None:
    check_fp32_dot(lambda: conv_bias_relu(F, layout), cuda_handle)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_fp32_conv_heuristic_plan_is_float32_exact(cuda_handle: dt.Handle, layout: str) -> None:
    """Issue 6: the heuristic plan of an fp32 conv ran on TF32 tensor cores and failed the
    float32 tolerance. With cudnn.allow_tf32=0 (the default) it must match at float32."""

    def conv() -> dt.Graph:
        g = dt.Graph(name=f"conv_fp32_{layout}", io_data_type=F, compute_data_type=F)
        dims_x, dims_w = [8, 64, 28, 28], [64, 64, 3, 3]
        x = g.tensor(name="X", dims=dims_x, strides=strides(dims_x, layout))
        w = g.tensor(name="W", dims=dims_w, strides=strides(dims_w, layout))
        y = g.conv_fprop(x, w, padding=1)
        y.set_output(True).set_name("Y")
        g.validate()
        return g

    assert check_fp32_dot(conv, cuda_handle) == "exact float32"


def test_conv_residual_add_then_relu(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(
        name="conv_residual", io_data_type=H, compute_data_type=F, intermediate_data_type=F
    )
    dims = [4, 32, 14, 14]
    x = g.tensor(name="X", dims=dims, strides=strides(dims, "nhwc"))
    w = g.tensor(name="W", dims=[32, 32, 3, 3], strides=strides([32, 32, 3, 3], "nhwc"))
    z = g.tensor(name="Z", dims=dims, strides=strides(dims, "nhwc"))
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, 0.5, mode=dt.PointwiseMode.MUL)
    y = g.pointwise(y, z, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[H])


@pytest.mark.parametrize(
    "act",
    [
        dt.PointwiseMode.SIGMOID_FWD,
        dt.PointwiseMode.TANH_FWD,
        dt.PointwiseMode.SWISH_FWD,
        dt.PointwiseMode.GELU_FWD,
    ],
)
def test_conv_activation_epilogues(cuda_handle: dt.Handle, act: dt.PointwiseMode) -> None:
    g = dt.Graph(
        name=f"conv_{act.json_name}", io_data_type=H, compute_data_type=F, intermediate_data_type=F
    )
    dims = [2, 16, 8, 8]
    x = g.tensor(name="X", dims=dims, strides=strides(dims, "nhwc"))
    w = g.tensor(name="W", dims=[32, 16, 3, 3], strides=strides([32, 16, 3, 3], "nhwc"))
    b = g.tensor(name="B", dims=[1, 32, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[H])


def test_conv_strided_1x1(cuda_handle: dt.Handle) -> None:
    g = conv_bias_relu(H, "nhwc", c=64, hw=28, k=128, r=1, stride=2, pad=0)
    build_run_check(g, cuda_handle, DOT_TOL[H])


@pytest.mark.parametrize("dtype", [H, BF], ids=["fp16", "bf16"])
def test_conv_dgrad(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    g = dt.Graph(name="dgrad", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)
    dy = g.tensor(name="DY", dims=[4, 64, 14, 14], strides=strides([4, 64, 14, 14], "nhwc"))
    w = g.tensor(name="W", dims=[64, 32, 3, 3], strides=strides([64, 32, 3, 3], "nhwc"))
    out = g.conv_dgrad(dy, w, padding=1)
    out.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[dtype])


def _wgrad(dtype: dt.DataType) -> dt.Graph:
    g = dt.Graph(name="wgrad", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[4, 32, 14, 14], strides=strides([4, 32, 14, 14], "nhwc"))
    dy = g.tensor(name="DY", dims=[4, 64, 14, 14], strides=strides([4, 64, 14, 14], "nhwc"))
    out = g.conv_wgrad(dy, x, padding=1)
    out.set_output(True)
    g.validate()
    return g


def test_conv_wgrad(cuda_handle: dt.Handle) -> None:
    build_run_check(_wgrad(H), cuda_handle, DOT_TOL[H])


def test_conv_wgrad_fp32(cuda_handle: dt.Handle) -> None:
    check_fp32_dot(lambda: _wgrad(F), cuda_handle)


def test_matmul_fp32_without_tf32_runs_exact_or_names_the_knob(cuda_handle: dt.Handle) -> None:
    def mm() -> dt.Graph:
        g = dt.Graph(name="mm_fp32", io_data_type=F, compute_data_type=F)
        c = g.matmul(g.tensor(name="A", dims=[256, 512]), g.tensor(name="B", dims=[512, 192]))
        c.set_output(True)
        g.validate()
        return g

    check_fp32_dot(mm, cuda_handle)


@pytest.mark.parametrize("dtype", [H, BF], ids=["fp16", "bf16"])
def test_matmul_bias_gelu(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    g = dt.Graph(
        name="mm_bias_gelu", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F
    )
    a = g.tensor(name="A", dims=[256, 128])
    b = g.tensor(name="B", dims=[128, 192])
    bias = g.tensor(name="BIAS", dims=[1, 192])
    c = g.matmul(a, b)
    c = g.pointwise(c, bias, mode=dt.PointwiseMode.ADD)
    c = g.pointwise(c, mode=dt.PointwiseMode.GELU_FWD)
    c.set_output(True).set_name("C")
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[dtype])


def test_batched_matmul_scale(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(name="bmm_scale", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    a = g.tensor(name="A", dims=[4, 64, 96])
    b = g.tensor(name="B", dims=[4, 96, 80])
    c = g.matmul(a, b)
    c = g.pointwise(c, 0.25, mode=dt.PointwiseMode.MUL)
    c.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[H])


@pytest.mark.parametrize("dtype", [H, BF], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_sdpa_causal(cuda_handle: dt.Handle, dtype: dt.DataType, kv_heads: int) -> None:
    g = dt.Graph(name="sdpa", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)
    q = g.tensor(name="Q", dims=[2, 4, 128, 64])
    k = g.tensor(name="K", dims=[2, kv_heads, 128, 64])
    v = g.tensor(name="V", dims=[2, kv_heads, 128, 64])
    o, stats = g.sdpa(q, k, v, causal_mask=True, generate_stats=True)
    o.set_output(True).set_name("O")
    stats.set_output(True).set_name("STATS")
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[dtype])


@pytest.mark.parametrize(
    "dtype", [dt.DataType.FP8_E4M3, dt.DataType.FP8_E5M2], ids=["e4m3", "e5m2"]
)
def test_sdpa_fp8_runs_right_or_is_declined(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    """fp8 q/k/v: the support check lets them through, and the lowering uses ``pygraph.sdpa``
    (no descale inputs): the plan must match the reference within fp8 rounding, or be
    declined with a reason."""
    g = dt.Graph(name="sdpa_fp8", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)
    q = g.tensor(name="Q", dims=[1, 2, 128, 64])
    k = g.tensor(name="K", dims=[1, 2, 128, 64])
    v = g.tensor(name="V", dims=[1, 2, 128, 64])
    (o,) = g.sdpa(q, k, v, causal_mask=True)
    o.set_output(True).set_name("O")
    g.validate()
    runs_or_declines_cleanly(g, cuda_handle, Tolerance(0.25, 0.25))


def test_sdpa_scale_and_additive_mask(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(name="sdpa_mask", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    q = g.tensor(name="Q", dims=[1, 2, 64, 64])
    k = g.tensor(name="K", dims=[1, 2, 128, 64])
    v = g.tensor(name="V", dims=[1, 2, 128, 64])
    m = g.tensor(name="M", dims=[1, 1, 64, 128], data_type=H)
    (o,) = g.sdpa(q, k, v, attn_mask=m, attn_scale=0.1)
    o.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, DOT_TOL[H])


@pytest.mark.parametrize("phase", [dt.NormFwdPhase.INFERENCE, dt.NormFwdPhase.TRAINING])
def test_layernorm(cuda_handle: dt.Handle, phase: dt.NormFwdPhase) -> None:
    g = dt.Graph(name="layernorm", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[8, 32, 256])
    s = g.tensor(name="S", dims=[1, 1, 256], data_type=F)
    b = g.tensor(name="B", dims=[1, 1, 256], data_type=F)
    outs = g.layernorm(x, s, b, epsilon=1e-5, forward_phase=phase)
    for t in outs:
        t.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, ELEM_TOL[H])


def test_rmsnorm(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(name="rmsnorm", io_data_type=BF, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[512, 1024])
    s = g.tensor(name="S", dims=[1, 1024], data_type=F)
    (y,) = g.rmsnorm(x, s, epsilon=1e-6)
    y.set_output(True)
    g.validate()
    build_run_check(g, cuda_handle, ELEM_TOL[BF])


def test_batchnorm_inference_nhwc(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(name="bn_inf", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    dims = [4, 32, 8, 8]
    x = g.tensor(name="X", dims=dims, strides=strides(dims, "nhwc"))
    stats = [g.tensor(name=n, dims=[1, 32, 1, 1], data_type=F) for n in ("M", "IV", "S", "B")]
    y = g.batchnorm_inference(x, *stats)
    y.set_output(True)
    g.validate()
    runs_or_declines_cleanly(g, cuda_handle, ELEM_TOL[H])


def test_pointwise_chain_runs_or_declines_cleanly(cuda_handle: dt.Handle) -> None:
    g = dt.Graph(name="pw", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[8, 64, 16, 16], strides=strides([8, 64, 16, 16], "nhwc"))
    b = g.tensor(name="B", dims=[1, 64, 1, 1])
    y = g.pointwise(x, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.validate()
    runs_or_declines_cleanly(g, cuda_handle, ELEM_TOL[H])


@pytest.mark.parametrize("dtype", [H, F], ids=["fp16", "fp32"])
def test_pointwise_only_2d_swiglu(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    g = dt.Graph(
        name="swiglu_2d", io_data_type=dtype, compute_data_type=F, intermediate_data_type=F
    )
    gate = g.tensor(name="GATE", dims=[16, 4096])
    up = g.tensor(name="UP", dims=[16, 4096])
    y = g.pointwise(gate, mode=dt.PointwiseMode.SWISH_FWD, swish_beta=1.0)
    y = g.pointwise(y, up, mode=dt.PointwiseMode.MUL)
    y.set_output(True)
    g.validate()
    assert runs_or_declines_cleanly(g, cuda_handle, ELEM_TOL[dtype]) == "ran"


# ---- declines -------------------------------------------------------------------------------
def test_unsupported_graphs_decline_cleanly(cuda_handle: dt.Handle) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    engine = CudnnEngine()
    g = dt.Graph(name="pool", io_data_type=H)
    x = g.tensor(name="X", dims=[1, 8, 8, 8])
    y = g.resample(x, mode=dt.ResampleMode.MAXPOOL, window=2)
    y.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="resample_fwd"):
        engine.check_support(g, cuda_handle)

    # float32 attention: refused before cuDNN sees it (cuDNN 9.19 accepted it, then faulted)
    g = dt.Graph(name="sdpa_fp32", io_data_type=F, compute_data_type=F)
    q = g.tensor(name="Q", dims=[1, 2, 64, 64])
    (o,) = g.sdpa(q, q, q)
    o.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="fp16, bf16"):
        engine.check_support(g, cuda_handle)

    # beyond what cuDNN fuses: two convolutions in one graph run correctly or are declined
    g = dt.Graph(name="conv_conv", io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    dims = [2, 16, 8, 8]
    x = g.tensor(name="X", dims=dims, strides=strides(dims, "nhwc"))
    w1 = g.tensor(name="W1", dims=[16, 16, 3, 3], strides=strides([16, 16, 3, 3], "nhwc"))
    w2 = g.tensor(name="W2", dims=[16, 16, 3, 3], strides=strides([16, 16, 3, 3], "nhwc"))
    y = g.conv_fprop(g.conv_fprop(x, w1, padding=1), w2, padding=1)
    y.set_output(True)
    g.validate()
    runs_or_declines_cleanly(g, cuda_handle, DOT_TOL[H])


# ---- cuDNN's plan list ----------------------------------------------------------------------
def test_engine_config_enumerates_distinct_cudnn_plans(cuda_handle: dt.Handle) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    engine = CudnnEngine()
    g = conv_bias_relu(H, "nhwc")
    count = engine.plan_count(g, cuda_handle)
    assert count >= 2
    knob = {k.knob_id: k for k in engine.knobs(g)}["cudnn.engine_config"]
    assert knob.constraint.max_value == count - 1  # type: ignore[union-attr]
    with pytest.raises(InvalidValueError, match=r"cudnn\.engine_config"):
        engine.validate_knobs([dt.KnobSetting("cudnn.engine_config", count)], g)
    names, built = [], 0
    for i in range(count):
        try:
            plan = engine.compile(g, [dt.KnobSetting("cudnn.engine_config", i)], cuda_handle)
        except NotSupportedError:
            continue  # cuDNN lists a few configs that do not build on every GPU
        built += 1
        names.append(plan.metadata["cudnn_plan_name"])
        assert plan.metadata["selection"] == "engine_config"
        assert isinstance(plan.metadata["cudnn_engine_id"], int)
        assert plan.workspace_size == plan.metadata["workspace_bytes"]
    assert built >= 2 and len(set(names)) == len(names)
    # the first two plans that build also compute the right answer
    for i in range(2):
        g2 = conv_bias_relu(H, "nhwc")
        build_run_check(g2, cuda_handle, DOT_TOL[H], {"cudnn.engine_config": i})


def test_add_engine_sweep_over_engine_config(cuda_handle: dt.Handle) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    g = conv_bias_relu(H, "nhwc")
    g.build_operation_graph(cuda_handle)
    count = CudnnEngine().plan_count(g, cuda_handle)
    axis = dt.KnobSweepAxis("cudnn.engine_config", list(range(count)))
    g.add_engine_sweep([dt.EngineSweepSpec(dt.engine_id("CUDNN_ENGINE"), [axis])])
    assert len(g.plan_specs) == count


@pytest.mark.parametrize("mode", ["b", "fallback"])
def test_other_heuristic_modes(cuda_handle: dt.Handle, mode: str) -> None:
    plan = build_run_check(
        conv_bias_relu(H, "nhwc"), cuda_handle, DOT_TOL[H], {"cudnn.heur_mode": mode}
    )
    assert plan.metadata["cudnn_heur_modes"][0] == mode


def test_workspace_limit_deselects_plans(cuda_handle: dt.Handle) -> None:
    plan = build_run_check(
        conv_bias_relu(H, "nhwc"), cuda_handle, DOT_TOL[H], {"global.workspace_size_limit": 0}
    )
    assert plan.workspace_size == 0


# ---- search and find db ---------------------------------------------------------------------
def test_find_db_round_trip(cuda_handle: dt.Handle, tmp_path: Path) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    engine = CudnnEngine()
    timer = CountingTimer(cuda_handle.timer)
    cuda_handle.set_timer(timer)
    g = conv_bias_relu(H, "nhwc", n=8, c=64, hw=28, k=64)
    searched = engine.compile(g, [dt.KnobSetting("global.benchmarking", 1)], cuda_handle)
    assert timer.calls > 0
    assert searched.metadata["selection"] == "search"
    assert searched.metadata["find_db"] == "written"
    assert len(searched.metadata["search"]) >= 2
    timed = timer.calls

    reused = engine.compile(g, (), cuda_handle)
    assert timer.calls == timed, "a find-db hit must not time anything"
    assert reused.metadata["find_db"] == "hit" and reused.metadata["selection"] == "find_db"
    assert reused.metadata["cudnn_plan_name"] == searched.metadata["cudnn_plan_name"]

    # the answer of the searched plan is right
    plan = build(g, cuda_handle)
    assert plan.metadata["cudnn_plan_name"] == searched.metadata["cudnn_plan_name"]
    check(g, execute(g, cuda_handle), DOT_TOL[H])

    # a fresh process (same cache dir) finds the record too: MIOpen's find-db behaviour
    script = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from test_cudnn_gpu import conv_bias_relu, H
        import dnntune as dt
        from dnntune.providers.cudnn import CudnnEngine
        plan = CudnnEngine().compile(conv_bias_relu(H, "nhwc", n=8, c=64, hw=28, k=64), (),
                                     dt.create_handle("cuda"))
        print(json.dumps({k: plan.metadata[k] for k in ("find_db", "cudnn_plan_name")}))
        """
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert fresh == {"find_db": "hit", "cudnn_plan_name": searched.metadata["cudnn_plan_name"]}


def test_search_is_no_slower_than_the_heuristic_choice(cuda_handle: dt.Handle) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    g = conv_bias_relu(H, "nhwc", n=16, c=64, hw=56, k=64)
    searched = CudnnEngine().compile(g, [dt.KnobSetting("global.benchmarking", 1)], cuda_handle)
    final = [r for r in searched.metadata["search"] if r["round"] == 2 and r["median_ms"]]
    assert len(final) >= 2
    fastest = min(r["median_ms"] for r in final)
    assert searched.metadata["median_time_ms"] <= fastest * 1.02
    heuristic = CudnnEngine().compile(g, [dt.KnobSetting("cudnn.engine_config", 0)], cuda_handle)
    assert heuristic.metadata["cudnn_plan_name"] in {r["cudnn_plan_name"] for r in final}


def test_find_db_disabled_searches_without_writing(
    cuda_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.providers.cudnn import CudnnEngine

    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    g = conv_bias_relu(H, "nhwc")
    engine = CudnnEngine()
    searched = engine.compile(g, [dt.KnobSetting("global.benchmarking", 1)], cuda_handle)
    assert searched.metadata["find_db"] == "disabled"
    assert engine.compile(g, (), cuda_handle).metadata["find_db"] == "disabled"


# ---- streams and execute ----------------------------------------------------------------------
def test_execute_on_the_handle_stream(cuda_handle: dt.Handle) -> None:
    stream = torch.cuda.Stream()
    cuda_handle.set_stream(stream)
    g = conv_bias_relu(H, "nhwc")
    build(g, cuda_handle)
    pack = make_inputs(g, "cuda", seed=3)
    torch.cuda.synchronize()
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    for _ in range(3):
        g.execute(cuda_handle, pack, ws)
    stream.synchronize()
    check(g, pack, DOT_TOL[H])


def test_plan_metadata_identifies_the_cudnn_plan(cuda_handle: dt.Handle) -> None:
    plan = build(conv_bias_relu(H, "nhwc"), cuda_handle)
    meta = plan.metadata
    assert meta["cudnn_backend"] >= 90000
    assert meta["cudnn_frontend"].count(".") == 2
    assert meta["cudnn_plan_name"].startswith("eng")
    assert isinstance(meta["cudnn_knobs"], dict)
    assert meta["cudnn_plan_count"] >= meta["cudnn_distinct_plans"] >= 1
    assert meta["find_db"] in ("miss", "hit")
    assert plan.workspace_size >= 0


def test_missing_workspace_is_refused(cuda_handle: dt.Handle) -> None:
    g = conv_bias_relu(H, "nhwc")
    for i in range(8):
        plan = build(g, cuda_handle, {"cudnn.engine_config": i})
        if plan.workspace_size > 0:
            break
        g = conv_bias_relu(H, "nhwc")
    else:
        pytest.skip("no plan with a workspace among the first eight")
    pack = {uid: t for uid, t in make_inputs(g, "cuda").items()}
    with pytest.raises(InvalidValueError, match="workspace"):
        plan.execute(pack, None)


# ---- the example graphs ---------------------------------------------------------------------
EXAMPLES = sorted((REPO / "examples" / "graphs").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_graphs_run_or_decline_cleanly(cuda_handle: dt.Handle, path: Path) -> None:
    """Each example graph either matches the reference or is declined with a reason.

    Set ``CUDNN_TEST_REPORT`` to a file path to get one JSON line per graph (the support
    matrix).
    """
    from dnntune.providers.cudnn import CudnnEngine

    g = dt.Graph.load(path)
    g.validate()
    outcome: dict[str, Any] = {"graph": path.stem}
    try:
        CudnnEngine().check_support(g, cuda_handle)
    except NotSupportedError as exc:
        assert str(exc)
        assert "bias_relu" not in path.stem, f"{path.stem} must be supported: {exc}"
        outcome["declined"] = str(exc)[:300]
    else:
        assert g.io_data_type is not None
        if has_fp32_dot(g):  # float32 by default, TF32 only with cudnn.allow_tf32=1
            outcome["fp32"] = check_fp32_dot(lambda: dt.Graph.load(path), cuda_handle)
        else:
            plan = build_run_check(g, cuda_handle, DOT_TOL[g.io_data_type])
            outcome["plan"] = plan.metadata["cudnn_plan_name"]
    report(outcome)


def _guarded_pack(g: dt.Graph, guard: int = 1 << 16) -> tuple[dict[int, Any], list[Any]]:
    """The graph's pack with every buffer inside a larger one whose margins hold 0xAB."""
    base = make_inputs(g, "cuda", seed=3)
    pack, raws = {}, []
    for uid, t in base.items():
        nbytes = t.untyped_storage().nbytes()
        raw = torch.full((2 * guard + nbytes,), 0xAB, dtype=torch.uint8, device="cuda")
        body = torch.as_strided(raw[guard : guard + nbytes].view(t.dtype), t.shape, t.stride())
        body.copy_(t)
        pack[uid] = body
        raws.append((raw, guard))
    return pack, raws


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [F, H], ids=["fp32", "fp16"])
def test_no_norm_plan_writes_into_its_input(
    cuda_handle: dt.Handle, op: str, dtype: dt.DataType
) -> None:
    """Issue 20's root cause: cuDNN 9.19's engine 5 overwrote the first rows of x (128x768
    layernorm, 64x4096 rmsnorm), so it and every later plan run on that buffer gave wrong rows
    (bench --oracle's Triton row after the cuDNN sweep). Every engine config now either refuses
    or leaves its inputs and the bytes around every buffer untouched and matches the reference."""
    from dnntune.backend.knobs import KnobSetting

    rows, n = (128, 768) if op == "layernorm" else (64, 4096)
    g = dt.Graph(name=op, io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[rows, n])
    s = g.tensor(name="S", dims=[1, n])
    if op == "layernorm":
        b = g.tensor(name="B", dims=[1, n])
        (y,) = g.layernorm(x, s, b, epsilon=1e-5)
    else:
        (y,) = g.rmsnorm(x, s, epsilon=1e-6)
    y.set_output(True)
    g.validate()
    g.build_operation_graph(cuda_handle)
    ref_pack = make_inputs(g, "cuda", seed=3)
    expected = run(g, ref_pack)
    refused = ran = 0
    for index in range(64):
        try:
            g.create_execution_plan_ext("CUDNN_ENGINE", [KnobSetting("cudnn.engine_config", index)])
            g.check_support()
            g.build_plans()
        except (NotSupportedError, InvalidValueError) as exc:
            if "offers" in str(exc) and "plan(s)" in str(exc):
                break  # past the end of cuDNN's list
            refused += 1
            continue
        pack, raws = _guarded_pack(g)
        plan = g.active_plan
        assert plan is not None
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        for _ in range(3):
            g.execute(cuda_handle, pack, ws)
        torch.cuda.synchronize()
        name = plan.metadata["cudnn_plan_name"]
        assert torch.equal(pack[x.uid], ref_pack[x.uid]), f"{name} wrote into x"
        for raw, guard in raws:
            assert bool((raw[:guard] == 0xAB).all() and (raw[-guard:] == 0xAB).all()), name
        assert compare(pack[y.uid], expected[y.uid], ELEM_TOL[dtype]).ok, name
        ran += 1
    assert ran > 0
