"""TORCH_ENGINE peephole: matmul + row bias as one addmm / baddbmm, checked on the reference."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import reference, testing
from dnntune.graph import OpKind
from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LoweringOptions

F32, F16, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16


def _graph(
    dtype: dt.DataType,
    a_dims: list[int],
    b_dims: list[int],
    bias_dims: list[int],
    act: dt.PointwiseMode | None = None,
    bias_first: bool = False,
) -> dt.Graph:
    g = dt.Graph("mm_bias", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", a_dims), g.tensor("B", b_dims))
    bias = g.tensor("BIAS", bias_dims)
    y = (
        g.pointwise(bias, c, mode=dt.PointwiseMode.ADD)
        if bias_first
        else g.pointwise(c, bias, mode=dt.PointwiseMode.ADD)
    )
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    return g


def _check(g: dt.Graph, handle: dt.Handle) -> None:
    testing.check_plan(g, handle, "TORCH_ENGINE", seed=5)


def _kinds(g: dt.Graph, **options: bool) -> list[OpKind]:
    return list(lower(g, torch.device("cpu"), LoweringOptions(**options)).kinds)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    ("a", "b", "bias"),
    [([32, 64], [64, 48], [1, 48]), ([3, 16, 24], [3, 24, 40], [1, 1, 40])],
    ids=["2d", "batched"],
)
def test_matmul_bias_is_one_step_and_matches_the_reference(
    dtype: dt.DataType, a: list[int], b: list[int], bias: list[int], cpu_handle: dt.Handle
) -> None:
    g = _graph(dtype, a, b, bias)
    assert _kinds(g) == [OpKind.MATMUL]
    assert _kinds(g, fuse=False) == [OpKind.MATMUL, OpKind.POINTWISE]
    _check(g, cpu_handle)


def test_bias_first_and_a_following_activation(cpu_handle: dt.Handle) -> None:
    g = _graph(F16, [8, 32], [32, 16], [1, 16], act=dt.PointwiseMode.GELU_FWD, bias_first=True)
    assert _kinds(g) == [OpKind.MATMUL, OpKind.POINTWISE]  # the add is absorbed, gelu stays
    _check(g, cpu_handle)


@pytest.mark.parametrize(
    ("a", "b", "bias"),
    [
        ([32, 64], [64, 48], [32, 1]),  # a column bias: not a row broadcast
        ([32, 64], [64, 48], [32, 48]),  # a full tensor
        ([3, 16, 24], [1, 24, 40], [1, 1, 40]),  # broadcast batch: baddbmm cannot
    ],
    ids=["column", "full", "broadcast-batch"],
)
def test_other_adds_stay_unfused(
    a: list[int], b: list[int], bias: list[int], cpu_handle: dt.Handle
) -> None:
    g = _graph(F32, a, b, bias)
    assert _kinds(g) == [OpKind.MATMUL, OpKind.POINTWISE]
    _check(g, cpu_handle)


def test_a_matmul_result_used_twice_stays_unfused(cpu_handle: dt.Handle) -> None:
    g = dt.Graph("twice", io_data_type=F32, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", [8, 16]), g.tensor("B", [16, 4]))
    y = g.pointwise(c, g.tensor("BIAS", [1, 4]), mode=dt.PointwiseMode.ADD)
    z = g.pointwise(y, c, mode=dt.PointwiseMode.MUL)
    z.set_output(True)
    g.validate()
    assert _kinds(g) == [OpKind.MATMUL, OpKind.POINTWISE, OpKind.POINTWISE]
    _check(g, cpu_handle)


def test_a_row_bias_reaches_addmm_as_a_vector(
    cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 1-D bias is what selects cuBLASLt's bias epilogue; a [1, N] one costs a pass more
    seen: list[tuple[int, ...]] = []
    addmm = torch.addmm

    def spy(bias: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(tuple(bias.shape))
        return addmm(bias, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "addmm", spy)
    _check(_graph(F16, [32, 64], [64, 48], [1, 48]), cpu_handle)
    assert seen and all(shape == (48,) for shape in seen)


@pytest.mark.parametrize(
    ("act", "aten"),
    [
        (dt.PointwiseMode.GELU_FWD, "gelu"),
        (dt.PointwiseMode.GELU_APPROX_TANH_FWD, "gelu"),
        (dt.PointwiseMode.SWISH_FWD, "silu"),
    ],
    ids=["gelu", "gelu_tanh", "silu"],
)
def test_an_activation_writes_the_graph_output_in_place(
    act: dt.PointwiseMode, aten: str, cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # F.gelu / F.silu have no out=; their ATen ops do, which saves a copy of the output
    outs: list[bool] = []
    real = getattr(torch._C._nn, aten)

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        outs.append("out" in kwargs)
        return real(*args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(torch._C._nn, aten, spy)
    g = _graph(F16, [16, 32], [32, 24], [1, 24], act=act)
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", {"torch.intermediate_type": "io"})
    outs.clear()  # the reference and the lowering's type inference call the op too
    pack = reference.make_inputs(g, cpu_handle.device, seed=2)
    g.execute(cpu_handle, pack)
    assert outs == [True]


def _step_names(g: dt.Graph, device: str, **options: bool) -> list[str]:
    program = lower(g, torch.device(device), LoweringOptions(**options))
    return [getattr(step, "__name__", "") for step in program.steps]


@pytest.mark.parametrize(
    "act",
    [dt.PointwiseMode.GELU_APPROX_TANH_FWD, dt.PointwiseMode.RELU_FWD],
    ids=["gelu_tanh", "relu"],
)
@pytest.mark.parametrize("returned", [False, True], ids=["out", "returned"])
def test_a_relu_or_tanh_gelu_runs_in_cublaslts_epilogue_on_cuda(
    act: dt.PointwiseMode, returned: bool
) -> None:
    """On CUDA, ``torch._addmm_activation`` (the ReLU or the tanh GELU in cuBLASLt's epilogue:
    one pass over the output instead of two); lowered here, run in the GPU test below."""
    g = _graph(BF16, [32, 64], [64, 48], [1, 48], act=act)
    epilogue = "matmul_bias_epilogue" if returned else "matmul_bias_epilogue_out"
    assert _step_names(g, "cuda", return_outputs=returned) == [epilogue]
    # the CPU's _addmm_activation computes the erf GELU: there the two calls stay
    assert _step_names(g, "cpu", return_outputs=returned) != [epilogue]


@pytest.mark.parametrize(
    ("act", "a", "b", "bias"),
    [
        (dt.PointwiseMode.GELU_FWD, [32, 64], [64, 48], [1, 48]),  # erf: not cuBLASLt's GELU
        (dt.PointwiseMode.SWISH_FWD, [32, 64], [64, 48], [1, 48]),
        (dt.PointwiseMode.GELU_APPROX_TANH_FWD, [3, 16, 24], [3, 24, 40], [1, 1, 40]),  # bmm
    ],
    ids=["erf-gelu", "silu", "batched"],
)
def test_other_activations_keep_their_own_call_on_cuda(
    act: dt.PointwiseMode, a: list[int], b: list[int], bias: list[int]
) -> None:
    names = _step_names(_graph(BF16, a, b, bias, act=act), "cuda")
    assert not any("epilogue" in n for n in names)


def test_a_clipped_relu_keeps_its_own_call_on_cuda() -> None:
    g = dt.Graph("relu6", io_data_type=BF16, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", [8, 16]), g.tensor("B", [16, 4]))
    y = g.pointwise(c, g.tensor("BIAS", [1, 4]), mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, relu_upper_clip=6.0)
    y.set_output(True)
    g.validate()
    assert not any("epilogue" in n for n in _step_names(g, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    "act",
    [dt.PointwiseMode.GELU_APPROX_TANH_FWD, dt.PointwiseMode.RELU_FWD],
    ids=["gelu_tanh", "relu"],
)
def test_cublaslt_epilogue_matches_the_reference_on_cuda(
    act: dt.PointwiseMode,
    dtype: dt.DataType,
    cuda_handle: dt.Handle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dnntune.providers._torch import fused

    calls: list[bool] = []
    real = fused._ADDMM_ACTIVATION

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(bool(kwargs["use_gelu"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(fused, "_ADDMM_ACTIVATION", spy)
    g = _graph(dtype, [256, 384], [384, 512], [1, 512], act=act)
    testing.check_plan(g, cuda_handle, "TORCH_ENGINE", seed=7)
    assert calls and set(calls) == {act is dt.PointwiseMode.GELU_APPROX_TANH_FWD}
