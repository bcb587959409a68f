"""TORCH_COMPILE_ENGINE: a representative subset against the reference, knobs, failures.

Compiling costs seconds per graph on the CPU, so the CPU subset is small; the compile tests
reuse the same few graphs, whose compiled code Inductor then finds in its cache.
"""

from __future__ import annotations

import pytest
import torch
from torch_cases import (
    CASES,
    SDPA_CASES,
    Case,
    batchnorm_backward,
    batchnorm_case,
    batchnorm_inference,
    conv_bias_relu,
    layernorm_case,
    matmul_gelu,
    pool_case,
    reduction_case,
    rmsnorm_case,
    run_and_compare,
)

import dnntune as dt
from dnntune import reference
from dnntune.providers import torch_compile

ENGINE = "TORCH_COMPILE_ENGINE"
FLOAT, HALF, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16

CPU_SUBSET = [
    Case("conv_bias_relu", conv_bias_relu),
    Case("matmul_gelu", matmul_gelu),
    layernorm_case(True),
    SDPA_CASES[3],  # grouped-query, causal
]


def _engine() -> dt.Engine:
    return dt.get_registry().get(ENGINE)


@pytest.mark.slow
@pytest.mark.parametrize("case", CPU_SUBSET, ids=str)
def test_subset_matches_reference_cpu(case: Case, cpu_handle: dt.Handle) -> None:
    g = case.build(FLOAT)
    run_and_compare(g, cpu_handle, ENGINE)
    plan = g.active_plan
    assert plan is not None and plan.metadata["torch_compile_mode"] == "default"
    # a second execute with other values reuses the compiled code
    pack = reference.make_inputs(g, "cpu", seed=7)
    g.execute(cpu_handle, pack)
    expected = reference.run(g, pack)
    for t in g.output_tensors():
        cmp = reference.compare(pack[t.uid], expected[t.uid], reference.tolerance_for(g, t))  # type: ignore[index]
        assert cmp.ok, cmp.message


def test_broadcast_input_compiles(cpu_handle: dt.Handle) -> None:
    """An input with stride 0 over a dimension of 16 (an expanded bias) builds and matches:
    the compile's trial arguments once filled the view in place and raised (H200 sweep case
    c00831, seen on the CPU too)."""
    g = dt.Graph(name="bcast", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[16, 8])
    b = g.tensor(name="B", dims=[16, 8], strides=[0, 1])
    g.pointwise(x, b, mode=dt.PointwiseMode.ADD).set_output(True)
    g.validate()
    run_and_compare(g, cpu_handle, ENGINE)


_NAMES = {c.name: c for c in CASES}

#: the op kinds CPU_SUBSET leaves out, one graph each: reduction, rmsnorm, the three batchnorms
#: and a pooling (resample); the low-precision cases round through half and bfloat16 storage
CPU_OTHER_KINDS = [
    (reduction_case(dt.ReductionMode.ADD), FLOAT),
    (rmsnorm_case(True, True), FLOAT),
    (batchnorm_case(True), FLOAT),
    (Case("batchnorm_inference", batchnorm_inference), HALF),
    (Case("batchnorm_backward", batchnorm_backward), FLOAT),
    (pool_case(dt.ResampleMode.AVGPOOL_EXCLUDE_PADDING, True), BF16),
    (layernorm_case(True), HALF),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "io"), CPU_OTHER_KINDS, ids=lambda v: str(v))
def test_other_op_kinds_match_reference_cpu(
    case: Case, io: dt.DataType, cpu_handle: dt.Handle
) -> None:
    """The CPU tests compiled convolutions, matmuls, pointwise chains, layernorm and attention
    only, all in float32: a lowering that Inductor compiles wrongly for another op kind, or
    for 16-bit storage, was caught on a GPU run alone."""
    run_and_compare(case.build(io), cpu_handle, ENGINE)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conv_dgrad_strided_grouped", "conv_wgrad_grouped_asymmetric"])
def test_gradient_graphs_compile_on_the_cpu(name: str, cpu_handle: dt.Handle) -> None:
    # the gradient lowering once used functools.cached_property, whose RLock (Python 3.11)
    # Dynamo cannot trace: every gradient graph failed its trial run there
    run_and_compare(_NAMES[name].build(FLOAT), cpu_handle, ENGINE)


GPU_HALF = [
    *(
        _NAMES[n]
        for n in (
            "conv_bias_relu",
            "conv_fprop_grouped_strided",
            "conv_dgrad_strided_grouped",
            "conv_wgrad_grouped_asymmetric",
            "matmul_broadcast",
            "matmul_gelu",
            "batchnorm_training_running",
            "rmsnorm_training_bias",
            "resample_avgpool_exclude_padding_asym_2d",
        )
    ),
    layernorm_case(True),
    *SDPA_CASES,
]
GPU_OTHER = [(c, io) for c in CPU_SUBSET[:2] for io in (FLOAT, BF16)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "io"), [*((c, HALF) for c in GPU_HALF), *GPU_OTHER], ids=lambda v: str(v)
)
def test_matches_reference_cuda(case: Case, io: dt.DataType, cuda_handle: dt.Handle) -> None:
    run_and_compare(case.build(io), cuda_handle, ENGINE)


#: the op kinds GPU_HALF leaves out on CUDA (reductions, batch-norm inference and backward),
#: in every io type: Inductor's CUDA code for them was compared on no GPU run
GPU_OTHER_KINDS = [
    reduction_case(dt.ReductionMode.ADD),
    reduction_case(dt.ReductionMode.MAX),
    reduction_case(dt.ReductionMode.NORM2),
    Case("batchnorm_inference", batchnorm_inference),
    Case("batchnorm_backward", batchnorm_backward),
]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("io", [HALF, BF16, FLOAT], ids=lambda d: d.json_name)
@pytest.mark.parametrize("case", GPU_OTHER_KINDS, ids=str)
def test_other_op_kinds_match_reference_cuda(
    case: Case, io: dt.DataType, cuda_handle: dt.Handle
) -> None:
    """Each output against the reference within ``reference.tolerance_for`` (the per-dtype
    defaults: the output's type, grown for long reductions)."""
    run_and_compare(case.build(io), cuda_handle, ENGINE)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_modes_cuda(mode: str, cuda_handle: dt.Handle) -> None:
    g = conv_bias_relu(HALF)
    pack = run_and_compare(g, cuda_handle, ENGINE, {"torch_compile.mode": mode})
    for seed in (1, 2):  # CUDA-graph replays must follow new values
        fresh = reference.make_inputs(g, "cuda", seed=seed)
        for uid, value in fresh.items():
            pack[uid].copy_(value)
        g.execute(cuda_handle, pack)
        expected = reference.run(g, pack)
        (y,) = g.output_tensors()
        assert reference.compare(
            pack[y.uid],
            expected[y.uid],  # type: ignore[index]
            reference.tolerance_for(g, y),
        ).ok


@pytest.mark.gpu
@pytest.mark.slow
def test_benchmarking_compiles_with_max_autotune_cuda(cuda_handle: dt.Handle) -> None:
    g = matmul_gelu(HALF)
    run_and_compare(g, cuda_handle, ENGINE, {"global.benchmarking": 1})
    plan = g.active_plan
    assert plan is not None
    assert plan.metadata["torch_compile_mode"] == "max-autotune-no-cudagraphs"


def test_engine_identity_and_knobs() -> None:
    (engine,) = torch_compile.engines()
    assert engine.name == "TORCH_COMPILE_ENGINE"
    assert {k.knob_id for k in engine.knobs(None)} == {"torch_compile.mode", "global.benchmarking"}
    assert engine.supports_exhaustive(None)
    assert _engine().id == engine.id


def test_benchmarking_means_max_autotune() -> None:
    mode = torch_compile.torch_compile_mode
    assert mode("default", False) == "default"
    assert mode("default", True) == "max-autotune-no-cudagraphs"
    assert mode("max-autotune-no-cudagraphs", True) == "max-autotune-no-cudagraphs"
    assert mode("reduce-overhead", True) == "max-autotune"


def test_mode_knob_validation(cpu_handle: dt.Handle) -> None:
    g = conv_bias_relu(FLOAT).build_operation_graph(cpu_handle)
    with pytest.raises(dt.InvalidValueError, match=r"torch_compile.mode: value 'max-autotune'"):
        g.create_execution_plan_ext(ENGINE, {"torch_compile.mode": "max-autotune"})


def test_no_cpp_compiler_means_not_applicable(
    cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_compile, "_cpp_compiler", lambda: None)
    g = conv_bias_relu(FLOAT).build_operation_graph(cpu_handle)
    reason = dt.get_registry().why_not(_engine(), g, cpu_handle)
    assert reason is not None and "needs a C++ compiler" in reason
    assert ENGINE not in [e.name for e in dt.get_registry().applicable(g, cpu_handle)]


def test_compiler_failure_is_not_supported_at_build(
    cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_compile(fn: object, **kwargs: object) -> object:
        def run(*args: object) -> None:
            raise RuntimeError("backend='inductor' raised:\nCppCompileError: no such header")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    g = conv_bias_relu(FLOAT)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(ENGINE)
    with pytest.raises(dt.NotSupportedError, match="CppCompileError: no such header"):
        g.build_plans()


def test_each_plan_compiles_its_own_code_object(
    cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def recording_compile(fn: object, **kwargs: object) -> object:
        seen.append(fn.__code__)  # type: ignore[attr-defined]
        assert kwargs["fullgraph"] is True and kwargs["dynamic"] is False
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    for _ in range(2):
        g = conv_bias_relu(FLOAT)
        run_and_compare(g, cpu_handle, ENGINE)
    assert len(seen) == 2 and seen[0] is not seen[1]


def test_a_cast_in_a_fused_chain_is_kept(
    cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuDNN frontend's cast (an identity node's output set to bfloat16) followed by a
    pointwise op: Inductor's fused kernel kept the float32 value and dropped the cast, where
    TORCH_ENGINE and cuDNN round (a 2e-3 error on values near 1, beyond float32's tolerance).
    Compiled with Inductor's eager-rounding option where the graph casts, and only there."""
    g = dt.Graph(name="cast", io_data_type=FLOAT, intermediate_data_type=FLOAT)
    x = g.tensor(name="X", dims=[64, 32])
    cast = g.pointwise(x, mode=dt.PointwiseMode.IDENTITY).set_data_type(BF16)
    g.pointwise(cast, 3.0, mode=dt.PointwiseMode.MUL).set_output(True)
    g.validate()
    xt = 1.0 + torch.rand(64, 32) * 1e-2  # bfloat16 keeps 8 bits: ~0.2 % steps here
    y = g.output_tensors()[0]
    out = torch.empty(64, 32)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(ENGINE)
    g.build_plans()
    g.execute(cpu_handle, {x: xt, y: out})
    torch.testing.assert_close(out, xt.bfloat16().float() * 3.0, rtol=1e-6, atol=0)
    options: list[object] = []
    real_compile = torch.compile

    def recording_compile(fn: object, **kwargs: object) -> object:
        options.append(kwargs.get("options"))
        return real_compile(fn, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(torch, "compile", recording_compile)
    conv_bias_relu(FLOAT).build(cpu_handle, [dt.HeuristicMode.A]).create_execution_plan_ext(
        ENGINE
    ).build_plans()
    assert options == [None]  # no cast: Inductor's own defaults


@pytest.mark.slow
@pytest.mark.parametrize("act", [None, dt.PointwiseMode.RELU_FWD], ids=["add", "add-relu"])
def test_channels_last_conv_with_a_shortcut_compiles(
    act: dt.PointwiseMode | None, cpu_handle: dt.Handle
) -> None:
    """An NHWC ResNet block's tail (conv + bias + shortcut [+ ReLU]) builds and matches PyTorch.
    The fused lowering added the shortcut with ``torch.add(y, r, out=y)``; Dynamo refuses an
    ``out=`` tensor that is not contiguous (a channels-last convolution's result), so every
    such graph failed its trial run ("Attempted to call op with non-contiguous `out=`
    tensor") and the engine was lost to it (new-user audit)."""
    g = dt.Graph("conv_res_nhwc", io_data_type=FLOAT, compute_data_type=FLOAT)
    x = g.tensor("X", [2, 4, 6, 6], strides=[144, 1, 24, 4])
    w = g.tensor("W", [8, 4, 3, 3], strides=[36, 1, 12, 4])
    bias = g.tensor("BIAS", [1, 8, 1, 1])
    shortcut = g.tensor("R", [2, 8, 3, 3], strides=[72, 1, 24, 8])
    y = g.conv_fprop(x, w, padding=1, stride=2)
    y = g.pointwise(
        g.pointwise(y, bias, mode=dt.PointwiseMode.ADD), shortcut, mode=dt.PointwiseMode.ADD
    )
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(ENGINE)
    g.build_plans()
    gen = torch.Generator().manual_seed(3)
    nhwc = torch.channels_last
    xt = torch.randn(2, 4, 6, 6, generator=gen).contiguous(memory_format=nhwc)
    wt = torch.randn(8, 4, 3, 3, generator=gen).contiguous(memory_format=nhwc)
    bt = torch.randn(1, 8, 1, 1, generator=gen)
    rt = torch.randn(2, 8, 3, 3, generator=gen).contiguous(memory_format=nhwc)
    out = torch.empty_strided(y.dims, y.strides)
    g.execute(cpu_handle, {x: xt, w: wt, bias: bt, shortcut: rt, y: out})
    expected = torch.nn.functional.conv2d(xt, wt, bt.flatten(), stride=2, padding=1) + rt
    if act is not None:
        expected = expected.relu()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_call_floor_is_measured_on_the_cpu_wall_clock_only(cpu_handle: dt.Handle) -> None:
    """The floor the search compares candidates with (``autotune.call_floor``): a positive
    number of ms on the CPU with its wall-clock timer, none where the timer is another clock
    (a test's fake timer) or on CUDA (not measured there)."""
    from types import SimpleNamespace

    engine = torch_compile.TorchCompileEngine()
    assert engine.has_call_floor(cpu_handle)
    floor = engine.call_floor_ms(cpu_handle)
    assert floor is not None and 0.0 < floor < 50.0
    fake = SimpleNamespace(device=torch.device("cpu"), timer=object())
    assert engine.call_floor_ms(fake) is None  # type: ignore[arg-type]
    cuda = SimpleNamespace(device=torch.device("cuda"), timer=cpu_handle.timer)
    assert engine.call_floor_ms(cuda) is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_call_floor_is_below_a_compiled_plans_call(cpu_handle: dt.Handle) -> None:
    """The floor is a lower bound in fact: a compiled plan of a small graph (Inductor's
    kernel and wrapper behind the same Dynamo guards) takes longer a call, fastest to fastest."""
    import time

    g = matmul_gelu(FLOAT)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(ENGINE)
    g.build_plans()
    pack = reference.make_inputs(g, "cpu", seed=7)
    for _ in range(20):
        g.execute(cpu_handle, pack)
    fastest = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            g.execute(cpu_handle, pack)
        fastest = min(fastest, (time.perf_counter() - start) / 50 * 1e3)
    floor = torch_compile.TorchCompileEngine().call_floor_ms(cpu_handle)
    assert floor is not None and floor < fastest
