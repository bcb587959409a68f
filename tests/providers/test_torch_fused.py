"""TORCH_ENGINE peephole: matmul + row bias as one addmm / baddbmm, checked on the reference."""

from __future__ import annotations

from typing import Any

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


def _residual_graph(
    dtype: dt.DataType,
    act: dt.PointwiseMode | None = None,
    residual_type: dt.DataType | None = None,
    residual_dims: list[int] | None = None,
) -> dt.Graph:
    g = dt.Graph("mm_res", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", [24, 32]), g.tensor("B", [32, 16]))
    y = g.pointwise(c, g.tensor("BIAS", [1, 16]), mode=dt.PointwiseMode.ADD)
    r = g.tensor("R", residual_dims or [24, 16], data_type=residual_type)
    y = g.pointwise(r, y, mode=dt.PointwiseMode.ADD)
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    return g


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The ATen ops a program runs, and the dtypes of the tensors they make."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.made: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func.overloadpacket.__name__))
        if isinstance(out, torch.Tensor):
            self.made.add(out.dtype)
        return out


def _ops_of(program: Any, dtype: dt.DataType, shapes: list[list[int]], returned: bool) -> _Ops:
    """The ATen ops ``program`` runs on random inputs of ``shapes`` (the second, B, given as
    the transpose of its [N, K] weight, as a Linear's), the output passed in unless
    ``returned``."""
    torch_dtype = dtype.to_torch()
    args = [torch.randn(*shape).to(torch_dtype) for shape in shapes]
    args[1] = args[1].t()
    if not returned:
        args.append(torch.empty(shapes[0][0], shapes[1][0], dtype=torch_dtype))
    ops = _Ops()
    with ops:
        program.run(args)
    return ops


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("act", [None, dt.PointwiseMode.RELU_FWD], ids=["add", "add-relu"])
@pytest.mark.parametrize("returned", [False, True], ids=["out", "returned"])
def test_a_residual_add_is_absorbed_in_the_io_type(
    dtype: dt.DataType, act: dt.PointwiseMode | None, returned: bool, cpu_handle: dt.Handle
) -> None:
    """matmul + bias + residual (+ activation): one step, the add done by ``torch.add`` of the
    GEMM's result and the residual (float32 inside, rounded once), no float32 copy of either
    (before: the result cast up, added, cast down; three passes where eager makes one)."""
    g = _residual_graph(dtype, act)
    program = lower(g, torch.device("cpu"), LoweringOptions(return_outputs=returned))
    assert len(program.steps) == 1
    want = [OpKind.MATMUL, OpKind.POINTWISE] + ([OpKind.POINTWISE] if act else [])
    assert list(program.kinds) == want
    _check(g, cpu_handle)
    ops = _ops_of(program, dtype, [[24, 32], [16, 32], [1, 16], [24, 16]], returned)
    assert "_to_copy" not in ops.ops and ops.made == {dtype.to_torch()}


def _operand_graph(
    dtype: dt.DataType, mode: dt.PointwiseMode, operand_first: bool = False
) -> dt.Graph:
    """matmul (no bias) then an add of a residual or a multiply by a tensor of its shape."""
    g = dt.Graph("mm_op", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", [24, 32]), g.tensor("B", [32, 16]))
    r = g.tensor("R", [24, 16])
    y = g.pointwise(r, c, mode=mode) if operand_first else g.pointwise(c, r, mode=mode)
    y.set_output(True)
    g.validate()
    return g


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    "mode", [dt.PointwiseMode.ADD, dt.PointwiseMode.MUL], ids=["residual", "multiply"]
)
@pytest.mark.parametrize("returned", [False, True], ids=["out", "returned"])
def test_a_matmul_without_bias_absorbs_a_residual_or_a_multiply(
    dtype: dt.DataType, mode: dt.PointwiseMode, returned: bool, cpu_handle: dt.Handle
) -> None:
    """LLaMA's ``down_proj`` + residual and a gated MLP's ``up_proj`` x gate: the product,
    then the add or multiply in the io type, two ATen calls as eager's (before: the product
    cast up to float32, combined, cast down)."""
    g = _operand_graph(dtype, mode, operand_first=mode is dt.PointwiseMode.MUL)
    program = lower(g, torch.device("cpu"), LoweringOptions(return_outputs=returned))
    assert len(program.steps) == 1
    assert list(program.kinds) == [OpKind.MATMUL, OpKind.POINTWISE]
    _check(g, cpu_handle)
    ops = _ops_of(program, dtype, [[24, 32], [16, 32], [24, 16]], returned)
    assert "_to_copy" not in ops.ops and ops.made == {dtype.to_torch()}
    name = "mul" if mode is dt.PointwiseMode.MUL else "add"
    # into the caller's buffer (``out=``) or in place into the product (``add_``)
    assert name in ops.ops or f"{name}_" in ops.ops


def test_a_multiply_by_a_row_or_another_type_is_not_absorbed(cpu_handle: dt.Handle) -> None:
    for dims, dtype in (([1, 16], None), ([24, 16], F32)):
        g = dt.Graph("mm_row", io_data_type=BF16, compute_data_type=F32, intermediate_data_type=F32)
        c = g.matmul(g.tensor("A", [24, 32]), g.tensor("B", [32, 16]))
        y = g.pointwise(c, g.tensor("M", dims, data_type=dtype), mode=dt.PointwiseMode.MUL)
        y.set_output(True)
        g.validate()
        assert len(lower(g, torch.device("cpu"), LoweringOptions()).steps) > 1
        _check(g, cpu_handle)


@pytest.mark.parametrize(
    ("residual_type", "residual_dims"),
    [(F32, None), (None, [1, 16])],
    ids=["float32-residual", "row"],
)
def test_a_residual_of_another_type_or_shape_is_not_absorbed(
    residual_type: dt.DataType | None, residual_dims: list[int] | None, cpu_handle: dt.Handle
) -> None:
    g = _residual_graph(BF16, residual_type=residual_type, residual_dims=residual_dims)
    names = _step_names(g, "cpu")
    assert not any("residual" in n for n in names)
    _check(g, cpu_handle)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("act", [None, dt.PointwiseMode.RELU_FWD], ids=["add", "add-relu"])
def test_a_residual_add_is_absorbed_on_cuda(
    dtype: dt.DataType, act: dt.PointwiseMode | None, cuda_handle: dt.Handle
) -> None:
    g = _residual_graph(dtype, act)
    assert len(lower(g, torch.device("cuda"), LoweringOptions()).steps) == 1
    testing.check_plan(g, cuda_handle, "TORCH_ENGINE", seed=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "mode", [dt.PointwiseMode.ADD, dt.PointwiseMode.MUL], ids=["residual", "multiply"]
)
def test_a_matmul_without_bias_absorbs_its_operand_on_cuda(
    dtype: dt.DataType, mode: dt.PointwiseMode, cuda_handle: dt.Handle
) -> None:
    g = _operand_graph(dtype, mode)
    assert len(lower(g, torch.device("cuda"), LoweringOptions()).steps) == 1
    testing.check_plan(g, cuda_handle, "TORCH_ENGINE", seed=9)
