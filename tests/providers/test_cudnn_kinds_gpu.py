"""CUDNN_ENGINE on a GPU, the op kinds test_cudnn_gpu.py compared in one dtype or not at all:
reductions, batch-norm inference and pointwise chains in fp16, bf16 and fp32, layernorm in bf16
and fp32, rmsnorm in fp16 and fp32, each against ``dnntune.reference`` with the explicit
per-dtype tolerances of test_cudnn_gpu.py.

A graph may be declined, but only by ``CudnnEngine.check_support`` (dnntune's own rules, then
cuDNN's heuristics and support query): once it accepts a graph, the plan must build, run and
match (:func:`run_unless_declined`). Where cuDNN is known to run a form, the test requires the
run. Skipped without CUDA or without nvidia-cudnn-frontend."""

from __future__ import annotations

import pytest

# _needs_frontend: test_cudnn_gpu's autouse fixture (no cuDNN frontend: skipped), used here too
from test_cudnn_gpu import (  # noqa: F401
    BF,
    DOT_TOL,
    ELEM_TOL,
    F,
    H,
    _needs_frontend,
    build,
    check,
    execute,
    report,
    strides,
)

import dnntune as dt
from dnntune.errors import NotSupportedError
from dnntune.graph.tensor import contiguous_strides
from dnntune.reference import Tolerance

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

DTYPES = pytest.mark.parametrize("dtype", [H, BF, F], ids=["fp16", "bf16", "fp32"])
#: a reduction into a float32 output, computed in float32 (the graph's compute type): only the
#: order of the additions differs from the reference's float64, whatever the input's type
#: (the inputs are read exactly); 256 terms of order one stay far inside 1e-4
REDUCTION_TOL = Tolerance(1e-4, 1e-4)
REDUCTION_MODES = ["ADD", "MAX", "MIN", "AVG", "AMAX", "NORM1", "NORM2"]


def run_unless_declined(g: dt.Graph, handle: dt.Handle, tol: Tolerance) -> str:
    """ "declined" where ``CudnnEngine.check_support`` refuses ``g`` (with CUDNN_ENGINE's or
    cuDNN's reason); otherwise "ran", after the plan built, ran and matched the reference: a
    graph the support check accepts and the build or the answer then fails is a test failure,
    not a decline (runs_or_declines_cleanly in test_cudnn_gpu.py lets a build failure pass)."""
    from dnntune.providers.cudnn import CudnnEngine

    try:
        CudnnEngine().check_support(g, handle)
    except NotSupportedError as exc:
        assert "CUDNN_ENGINE" in str(exc) or "cuDNN" in str(exc), str(exc)
        report({"graph": g.name, "declined": str(exc)[:300]})
        return "declined"
    plan = build(g, handle)
    check(g, execute(g, handle), tol)
    report({"graph": g.name, "plan": plan.metadata["cudnn_plan_name"]})
    return "ran"


def _graph(name: str, dtype: dt.DataType) -> dt.Graph:
    return dt.Graph(name=name, io_data_type=dtype, compute_data_type=F, intermediate_data_type=F)


# ---- reductions -----------------------------------------------------------------------------
def conv_channel_sum(dtype: dt.DataType) -> dt.Graph:
    """An NHWC 3x3 conv whose output is summed over its channels into a float32
    ``[n, 1, h, w]``: cuDNN frontend's own conv + reduction test (test_conv_reduction.py,
    fp16), smaller."""
    g = _graph(f"conv_channel_sum_{dtype.json_name}", dtype)
    dims_x, dims_w = [2, 16, 16, 16], [32, 16, 3, 3]
    x = g.tensor(name="X", dims=dims_x, strides=strides(dims_x, "nhwc"))
    w = g.tensor(name="W", dims=dims_w, strides=strides(dims_w, "nhwc"))
    y = g.conv_fprop(x, w, padding=1)
    s = g.reduction(y, mode=dt.ReductionMode.ADD, axes=[1])
    # packed row-major, as CUDNN_ENGINE requires of a reduction's tensors (the output would
    # otherwise take the input's channels-last strides, [256, 1, 16, 1], and be declined)
    s.set_output(True).set_data_type(F).set_name("S").set_strides(contiguous_strides(s.dims))
    g.validate()
    return g


def test_conv_then_channel_sum_runs(cuda_handle: dt.Handle) -> None:
    """The reduction cuDNN documents fusing: it must be accepted, run and match."""
    assert run_unless_declined(conv_channel_sum(H), cuda_handle, DOT_TOL[H]) == "ran"


def test_conv_then_channel_sum_bf16(cuda_handle: dt.Handle) -> None:
    run_unless_declined(conv_channel_sum(BF), cuda_handle, DOT_TOL[BF])


@DTYPES
def test_reductions_of_rows(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    """Every mode over the last dim of a packed row-major ``[64, 256]`` (the layout
    CUDNN_ENGINE keeps reductions to) into float32; cuDNN may decline a mode up front."""
    outcomes = {}
    for mode in REDUCTION_MODES:
        g = _graph(f"reduce_{mode.lower()}_{dtype.json_name}", dtype)
        x = g.tensor(name="X", dims=[64, 256])
        y = g.reduction(x, mode=dt.ReductionMode[mode], axes=[1])
        y.set_output(True).set_data_type(F).set_name("Y")
        g.validate()
        outcomes[mode] = run_unless_declined(g, cuda_handle, REDUCTION_TOL)
    report({"graph": f"reductions_{dtype.json_name}", "outcomes": outcomes})


# ---- batch-norm inference and pointwise chains ------------------------------------------------
@DTYPES
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_batchnorm_inference(cuda_handle: dt.Handle, dtype: dt.DataType, layout: str) -> None:
    g = _graph(f"bn_inf_{layout}_{dtype.json_name}", dtype)
    dims = [4, 32, 8, 8]
    x = g.tensor(name="X", dims=dims, strides=strides(dims, layout))
    stats = [g.tensor(name=n, dims=[1, 32, 1, 1], data_type=F) for n in ("M", "IV", "S", "B")]
    y = g.batchnorm_inference(x, *stats)
    y.set_output(True)
    g.validate()
    run_unless_declined(g, cuda_handle, ELEM_TOL[dtype])


@DTYPES
def test_pointwise_chain_nhwc(cuda_handle: dt.Handle, dtype: dt.DataType) -> None:
    """A per-channel bias add then ReLU on an NHWC tensor (test_cudnn_gpu.py's chain, in
    every dtype)."""
    g = _graph(f"pw_nhwc_{dtype.json_name}", dtype)
    x = g.tensor(name="X", dims=[8, 64, 16, 16], strides=strides([8, 64, 16, 16], "nhwc"))
    b = g.tensor(name="B", dims=[1, 64, 1, 1])
    y = g.pointwise(x, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.validate()
    run_unless_declined(g, cuda_handle, ELEM_TOL[dtype])


def test_pointwise_2d_swiglu_bf16_runs(cuda_handle: dt.Handle) -> None:
    """test_cudnn_gpu.py's 2-D SwiGLU (required to run in fp16 and fp32 there) in bf16."""
    g = _graph("swiglu_2d_bf16", BF)
    gate = g.tensor(name="GATE", dims=[16, 4096])
    up = g.tensor(name="UP", dims=[16, 4096])
    y = g.pointwise(gate, mode=dt.PointwiseMode.SWISH_FWD, swish_beta=1.0)
    y = g.pointwise(y, up, mode=dt.PointwiseMode.MUL)
    y.set_output(True)
    g.validate()
    assert run_unless_declined(g, cuda_handle, ELEM_TOL[BF]) == "ran"


# ---- norms in the dtypes test_cudnn_gpu.py leaves out --------------------------------------
@pytest.mark.parametrize("dtype", [BF, F], ids=["bf16", "fp32"])
@pytest.mark.parametrize("phase", [dt.NormFwdPhase.INFERENCE, dt.NormFwdPhase.TRAINING])
def test_layernorm_bf16_fp32(
    cuda_handle: dt.Handle, dtype: dt.DataType, phase: dt.NormFwdPhase
) -> None:
    g = _graph(f"layernorm_{dtype.json_name}", dtype)
    x = g.tensor(name="X", dims=[8, 32, 256])
    s = g.tensor(name="S", dims=[1, 1, 256], data_type=F)
    b = g.tensor(name="B", dims=[1, 1, 256], data_type=F)
    for t in g.layernorm(x, s, b, epsilon=1e-5, forward_phase=phase):
        t.set_output(True)
    g.validate()
    assert run_unless_declined(g, cuda_handle, ELEM_TOL[dtype]) == "ran"


@pytest.mark.parametrize("dtype", [H, F], ids=["fp16", "fp32"])
@pytest.mark.parametrize("phase", [dt.NormFwdPhase.INFERENCE, dt.NormFwdPhase.TRAINING])
def test_rmsnorm_fp16_fp32(
    cuda_handle: dt.Handle, dtype: dt.DataType, phase: dt.NormFwdPhase
) -> None:
    g = _graph(f"rmsnorm_{dtype.json_name}", dtype)
    x = g.tensor(name="X", dims=[512, 1024])
    s = g.tensor(name="S", dims=[1, 1024], data_type=F)
    for t in g.rmsnorm(x, s, epsilon=1e-6, forward_phase=phase):
        t.set_output(True)
    g.validate()
    assert run_unless_declined(g, cuda_handle, ELEM_TOL[dtype]) == "ran"
