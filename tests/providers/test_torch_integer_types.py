"""The torch engines on integer tensors: integer operands of floating-valued pointwise modes, and
16-bit floating data into integer outputs; each checked against ``dnntune.reference`` (with its
tolerances) and against the values written out with plain torch ops in float64."""

from __future__ import annotations

import math

import pytest
import torch
from torch_cases import run_single_output

import dnntune as dt

FLOAT, HALF, BF16, INT32 = (
    dt.DataType.FLOAT,
    dt.DataType.HALF,
    dt.DataType.BFLOAT16,
    dt.DataType.INT32,
)
PW = dt.PointwiseMode
ENGINES = ["TORCH_ENGINE", pytest.param("TORCH_COMPILE_ENGINE", marks=pytest.mark.slow)]


def _graph(name: str, io: dt.DataType) -> dt.Graph:
    return dt.Graph(name=name, io_data_type=io, compute_data_type=FLOAT)


# ---- integer operands of floating-valued modes ------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_pow_of_int32_tensors_into_a_float_output(engine: str, cpu_handle: dt.Handle) -> None:
    """ATen's integer pow gave 2 ** -1 = 0 (the reference and cuDNN's float compute: 0.5)."""
    g = _graph("pow_int", INT32)
    a, b = g.tensor("A", [1, 4], data_type=INT32), g.tensor("B", [1, 4], data_type=INT32)
    g.pointwise(a, b, mode=PW.POW).set_output(True).set_data_type(FLOAT)
    base = torch.tensor([[2, 3, 4, -2]], dtype=torch.int32)
    exponent = torch.tensor([[-1, 2, -2, 3]], dtype=torch.int32)
    y = run_single_output(g, cpu_handle, engine, {"A": base, "B": exponent})
    torch.testing.assert_close(y, torch.tensor([[0.5, 9.0, 0.0625, -8.0]]), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("mode", "fn"),
    [
        (PW.GELU_FWD, lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        (PW.GELU_APPROX_TANH_FWD, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
        (PW.SWISH_FWD, lambda x: x * torch.sigmoid(x)),
        (PW.ELU_FWD, lambda x: torch.where(x > 0, x, torch.expm1(x))),
        (PW.SOFTPLUS_FWD, lambda x: torch.log1p(torch.exp(x))),
        (PW.SIGMOID_FWD, torch.sigmoid),
    ],
    ids=lambda v: getattr(v, "name", ""),
)
@pytest.mark.parametrize("engine", ENGINES)
def test_activation_of_an_int32_tensor_into_a_float_output(
    engine: str, mode: dt.PointwiseMode, fn: object, cpu_handle: dt.Handle
) -> None:
    """TORCH_ENGINE raised on ints (GELU, SiLU, ELU, softplus have no integer kernel) and
    Inductor's GELU/SiLU of an int32 tensor were off by whole units (got 4, expected 5)."""
    g = _graph(f"act_int_{mode.name}", INT32)
    x = g.tensor("X", [2, 5], data_type=INT32)
    g.pointwise(x, mode=mode).set_output(True).set_data_type(FLOAT)
    values = torch.arange(-5, 5, dtype=torch.int32).reshape(2, 5)
    y = run_single_output(g, cpu_handle, engine, {"X": values})
    assert callable(fn)
    torch.testing.assert_close(y.double(), fn(values.double()), rtol=1e-5, atol=1e-6)


# ---- 16-bit data into integer outputs ---------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_bf16_difference_into_int32_is_not_rounded_to_bf16_first(
    engine: str, cpu_handle: dt.Handle
) -> None:
    """2.96875 - (-0.02734375) = 2.99609375 (trunc 2) was computed in bfloat16, rounded to 3.0
    and written as 3; cuDNN's float32 compute type and the reference give 2."""
    g = _graph("bf16_sub_to_int", BF16)
    a, b = g.tensor("A", [1, 2], data_type=BF16), g.tensor("B", [1, 2], data_type=BF16)
    g.pointwise(a, b, mode=PW.SUB).set_output(True).set_data_type(INT32)
    a_v = torch.tensor([[2.96875, 1.5]], dtype=torch.bfloat16)
    b_v = torch.tensor([[-0.02734375, 0.25]], dtype=torch.bfloat16)
    y = run_single_output(g, cpu_handle, engine, {"A": a_v, "B": b_v})
    assert y.tolist() == (a_v.double() - b_v.double()).trunc().int().tolist() == [[2, 1]]


@pytest.mark.parametrize("engine", ENGINES)
def test_bf16_norm1_into_int32_is_summed_in_float(engine: str, cpu_handle: dt.Handle) -> None:
    """|0.5| + |0.75| + |-0.74609375| = 1.99609375 rounded to bfloat16 is 2.0: written as 2,
    where the reference (and a float32 sum) give 1."""
    g = _graph("bf16_norm1_to_int", BF16)
    x = g.tensor("X", [1, 3], data_type=BF16)
    g.reduction(x, mode=dt.ReductionMode.NORM1, axes=[1]).set_output(True).set_data_type(INT32)
    values = torch.tensor([[0.5, 0.75, -0.74609375]], dtype=torch.bfloat16)
    y = run_single_output(g, cpu_handle, engine, {"X": values})
    assert y.tolist() == [[1]]


# ---- integer arithmetic whose result leaves the operands' type --------------------------------
UINT8, INT8, BOOL = dt.DataType.UINT8, dt.DataType.INT8, dt.DataType.BOOLEAN


def _int_tensor(dtype: dt.DataType, values: list[int]) -> torch.Tensor:
    return torch.tensor([values], dtype=dtype.to_torch())


@pytest.mark.parametrize(
    ("mode", "operand_type", "operands", "out_type", "expected"),
    [
        (PW.SUB, UINT8, ([3, 5, 0], [5, 3, 1]), INT32, [-2, 2, -1]),
        (PW.SUB, UINT8, ([3, 5, 0], [5, 3, 1]), FLOAT, [-2, 2, -1]),
        (PW.NEG, UINT8, ([0, 1, 5, 200],), FLOAT, [0, -1, -5, -200]),
        (PW.NEG, UINT8, ([1, 5],), BF16, [-1, -5]),
        (PW.ADD, INT8, ([100, -100, 3], [100, -100, 4]), FLOAT, [200, -200, 7]),
        (PW.MUL, INT8, ([100, -100, 3], [3, 2, 4]), INT32, [300, -200, 12]),
        (PW.ABS, INT8, ([-128, -3],), INT32, [128, 3]),
        (PW.ADD, BOOL, ([1, 0, 1], [1, 1, 0]), FLOAT, [2, 1, 1]),
        (PW.SUB, BOOL, ([1, 0, 1], [1, 1, 0]), FLOAT, [0, -1, 1]),
        (PW.NEG, BOOL, ([1, 0],), INT32, [-1, 0]),
    ],
    ids=lambda v: getattr(v, "name", None),
)
@pytest.mark.parametrize("engine", ENGINES)
def test_integer_arithmetic_into_a_wider_output_does_not_wrap(
    engine: str,
    mode: dt.PointwiseMode,
    operand_type: dt.DataType,
    operands: tuple[list[int], ...],
    out_type: dt.DataType,
    expected: list[int],
    cpu_handle: dt.Handle,
) -> None:
    """ADD, SUB, MUL, NEG and ABS of narrow integer operands were computed in the operands' own
    type and wrapped before being widened: uint8 3 - 5 into int32 was 254, -uint8 1 into a
    float 255, int8 100 + 100 into a float -56, |int8 -128| into int32 -128; bool True + True (a
    logical or) was 1, and bool SUB and NEG raised. The reference and cuDNN's float compute
    type give the exact value, which these outputs hold."""
    g = _graph(f"{mode.name}_{operand_type.name}_to_{out_type.name}", FLOAT)
    names = ["A", "B"][: len(operands)]
    tensors = [g.tensor(n, [1, len(expected)], data_type=operand_type) for n in names]
    y = g.pointwise(*tensors, mode=mode)
    y.set_output(True).set_data_type(out_type)
    inputs = {n: _int_tensor(operand_type, v) for n, v in zip(names, operands, strict=True)}
    got = run_single_output(g, cpu_handle, engine, inputs)
    assert got.double().tolist() == [[float(v) for v in expected]]


@pytest.mark.parametrize("out_type", [FLOAT, INT32, BOOL], ids=lambda d: d.name)
@pytest.mark.parametrize("mode", [PW.CEIL, PW.FLOOR], ids=lambda m: m.name)
@pytest.mark.parametrize("engine", ENGINES)
def test_ceil_and_floor_of_a_boolean_tensor(
    engine: str, mode: dt.PointwiseMode, out_type: dt.DataType, cpu_handle: dt.Handle
) -> None:
    """ATen has no boolean ceil or floor: the plan built, then raised at every execute
    ("ceil_vml_cpu" not implemented for 'Bool'); the reference's answer is the operand."""
    g = _graph(f"{mode.name}_bool_to_{out_type.name}", FLOAT)
    x = g.tensor("X", [1, 3], data_type=BOOL)
    g.pointwise(x, mode=mode).set_output(True).set_data_type(out_type)
    y = run_single_output(g, cpu_handle, engine, {"X": torch.tensor([[True, False, True]])})
    assert y.double().tolist() == [[1.0, 0.0, 1.0]]


@pytest.mark.parametrize("engine", ENGINES)
def test_product_of_integers_into_a_floating_output_does_not_wrap(
    engine: str, cpu_handle: dt.Handle
) -> None:
    """ATen's product of integer values is int64: 16 ** 20 = 2 ** 80 wrapped to 0, where the
    reference and a float32 output hold 1.2e24. Taken in float32, 16 ** 40 overflows before
    the zero that follows it (inf * 0: NaN where the answer is 0)."""
    g = _graph("prod_uint8_to_float", FLOAT)
    x = g.tensor("X", [3, 41], data_type=UINT8)
    g.reduction(x, mode=dt.ReductionMode.MUL, axes=[1]).set_output(True).set_data_type(FLOAT)
    values = torch.ones(3, 41, dtype=torch.uint8)
    values[0, :20] = 16
    values[1, :4] = 10
    values[2, :40] = 16
    values[2, 40] = 0
    y = run_single_output(g, cpu_handle, engine, {"X": values})
    assert y.tolist() == [[2.0**80], [10000.0], [0.0]]
