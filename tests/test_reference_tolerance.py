"""Tolerances, compare(), make_inputs()/make_outputs() and the run() contract."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dnntune import reference as ref
from dnntune.errors import InvalidValueError
from dnntune.frontend import Graph
from dnntune.graph import (
    DataType,
    GraphBuilder,
    OpKind,
    PointwiseMode,
    ReductionMode,
    TensorAttributes,
    channels_last_strides,
)
from dnntune.reference import Tolerance, compare, default_tolerance


def uid(t: TensorAttributes) -> int:
    """The tensor's uid (assigned once the graph is validated)."""
    assert t.uid is not None
    return t.uid


def _graph(io: DataType = DataType.FLOAT) -> GraphBuilder:
    return GraphBuilder(
        name="g",
        io_data_type=io,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )


def _conv_graph(io: DataType = DataType.HALF) -> GraphBuilder:
    g = _graph(io)
    x = g.tensor("x", [2, 8, 5, 5], channels_last_strides([2, 8, 5, 5]))
    w = g.tensor("w", [4, 8, 3, 3], channels_last_strides([4, 8, 3, 3]))
    b = g.tensor("b", [1, 4, 1, 1])
    y = g.pointwise(g.conv_fprop(x, w, padding=1), b, mode=PointwiseMode.ADD)
    g.pointwise(y, mode=PointwiseMode.RELU_FWD).set_output(True)
    g.validate()
    return g


# ---- default tolerances -----------------------------------------------------------------------
def test_default_tolerances_order_by_precision_and_ints_are_exact() -> None:
    chain = [
        DataType.DOUBLE,
        DataType.FLOAT,
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.FP8_E4M3,
        DataType.FP8_E5M2,
    ]
    tols = [default_tolerance(d) for d in chain]
    assert all(a.rtol < b.rtol and a.atol <= b.atol for a, b in itertools.pairwise(tols))
    for d in (DataType.INT8, DataType.UINT8, DataType.INT32, DataType.INT64, DataType.BOOLEAN):
        assert default_tolerance(d, OpKind.MATMUL, reduction_length=10**6) == Tolerance(0.0, 0.0)


def test_float32_is_tight_but_accumulating_ops_get_1e_3_relative() -> None:
    assert default_tolerance(DataType.FLOAT) == Tolerance(1e-4, 1e-5)
    assert default_tolerance(DataType.FLOAT, OpKind.POINTWISE).rtol == 1e-4
    for kind in (OpKind.CONV_FPROP, OpKind.CONV_WGRAD, OpKind.MATMUL, OpKind.SDPA):
        assert default_tolerance(DataType.FLOAT, kind).rtol == 1e-3


def test_tf32_plans_get_halfs_tolerance_for_float32_dots_only() -> None:
    """A plan that set a Knob.tf32 knob (cudnn.allow_tf32=1) computes float32 dots with 10
    mantissa bits: the H200 sweep saw 3.4e-4 absolute error on a conv dgrad of K=14."""
    for kind in (OpKind.CONV_DGRAD, OpKind.MATMUL):
        tf32, half = (
            default_tolerance(DataType.FLOAT, kind, tf32=True),
            default_tolerance(DataType.HALF, kind),
        )
        assert (tf32.rtol, tf32.atol) == (half.rtol, half.atol)
    assert default_tolerance(DataType.FLOAT, OpKind.POINTWISE, tf32=True) == Tolerance(1e-4, 1e-5)
    assert default_tolerance(DataType.HALF, OpKind.MATMUL, tf32=True) == default_tolerance(
        DataType.HALF, OpKind.MATMUL
    )
    g = _conv_graph(DataType.FLOAT)
    out = g.output_tensors()[0]
    assert ref.tolerance_for(g, out, tf32=True) == Tolerance(5e-3, 5e-3)
    assert ref.tolerance_for(g, out) == Tolerance(1e-3, 1e-4)


def test_allows_tf32_reads_the_knob_contract() -> None:
    from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType, allows_tf32

    tf32 = Knob("e.tf32", "", KnobValueType.INT64, 0, IntConstraint(0, 1), tf32=True)
    other = Knob("e.block", "", KnobValueType.INT64, 1, IntConstraint(0, 4))
    assert not allows_tf32([tf32, other], {})
    assert not allows_tf32([tf32, other], {"e.block": 2, "e.tf32": 0})
    assert allows_tf32([tf32, other], {"e.tf32": 1})
    assert not allows_tf32([other], {"e.tf32": 1})


def test_long_reductions_loosen_atol_with_sqrt_k() -> None:
    base = default_tolerance(DataType.HALF, OpKind.MATMUL)
    assert default_tolerance(DataType.HALF, OpKind.MATMUL, reduction_length=1024) == base
    k4 = default_tolerance(DataType.HALF, OpKind.MATMUL, reduction_length=4096)
    assert k4.rtol == base.rtol
    assert k4.atol == pytest.approx(2 * base.atol)


def test_reduction_length_per_op() -> None:
    g = _graph()
    a, b = g.tensor("a", [3, 64, 300]), g.tensor("b", [300, 8])
    g.matmul(a, b).set_output(True)
    g.validate()
    assert ref.reduction_length(g.nodes[0]) == 300
    conv = _conv_graph()
    assert ref.reduction_length(conv.nodes[0]) == 8 * 9
    assert ref.reduction_length(conv.nodes[1]) == 1


def test_tolerance_for_a_graph_takes_the_loosest_node() -> None:
    g = _conv_graph()
    out = g.output_tensors()[0]
    assert ref.tolerance_for(g, out) == default_tolerance(DataType.HALF, OpKind.CONV_FPROP)
    gi = _graph(DataType.INT32)
    y = gi.pointwise(gi.tensor("x", [4]), mode=PointwiseMode.ABS).set_output(True)
    gi.validate()
    assert ref.tolerance_for(gi, y) == Tolerance(0.0, 0.0)


# ---- compare ----------------------------------------------------------------------------------
def test_compare_accepts_within_and_rejects_beyond_the_tolerance_edge() -> None:
    tol = Tolerance(rtol=1e-3, atol=1e-4)
    expected = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    edge = expected.abs() * 1e-3 + 1e-4
    inside = compare(expected + edge * 0.99, expected, tol)
    assert inside.ok and inside.mismatches == 0 and inside.total == 3
    assert inside.max_abs_error == pytest.approx(float(edge.max()) * 0.99)
    outside = compare(
        expected + edge * torch.tensor([0.5, 1.01, 0.5], dtype=torch.float64), expected, tol
    )
    assert not outside.ok and outside.mismatches == 1
    assert "index [1]" in outside.message and "rtol 0.001" in outside.message


def test_compare_nan_and_inf_rules() -> None:
    expected = torch.tensor([1.0, math.nan, math.inf, -math.inf, 2.0])
    same = expected.clone()
    assert compare(same, expected, Tolerance(0.0, 0.0)).ok
    nan_where_finite = expected.clone()
    nan_where_finite[0] = math.nan
    result = compare(nan_where_finite, expected, Tolerance(1.0, 1.0))
    assert not result.ok and result.mismatches == 1 and result.max_abs_error == math.inf
    assert "non-finite" in result.message
    flipped_inf = expected.clone()
    flipped_inf[2] = -math.inf
    assert compare(flipped_inf, expected, Tolerance(1.0, 1.0)).mismatches == 1
    finite_where_nan = expected.clone()
    finite_where_nan[1] = 0.0
    assert not compare(finite_where_nan, expected, Tolerance(1.0, 1.0)).ok


def test_compare_handles_dtypes_shapes_and_empty() -> None:
    expected = torch.linspace(-3, 3, 50, dtype=torch.float64).reshape(5, 10)
    half = expected.to(torch.float16)
    assert compare(half, expected, default_tolerance(DataType.HALF)).ok
    assert not compare(half, expected, Tolerance(1e-7, 1e-9)).ok
    assert compare(half, expected).ok  # default tolerance from the actual dtype
    bad_shape = compare(expected.flatten(), expected, Tolerance(1.0, 1.0))
    assert not bad_shape.ok and "shape" in bad_shape.message
    assert compare(torch.empty(0, 3), torch.empty(0, 3), Tolerance(0.0, 0.0)).ok
    ints = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert compare(ints, ints.to(torch.float64), Tolerance(0.0, 0.0)).ok


def test_compare_relative_error_ignores_tiny_expected_values() -> None:
    expected = torch.tensor([1e-9, 1.0], dtype=torch.float64)
    actual = torch.tensor([2e-9, 1.0001], dtype=torch.float64)
    result = compare(actual, expected, Tolerance(1e-3, 1e-6))
    assert result.ok and result.max_rel_error == pytest.approx(1e-4, rel=1e-6)


# ---- make_inputs / make_outputs ---------------------------------------------------------------
def test_make_inputs_layouts_strides_and_seed() -> None:
    g = _graph(DataType.HALF)
    p = g.tensor("p", [4, 5], [7, 1])  # padded rows
    bcast = g.tensor("bc", [4, 5], [0, 1])  # one row broadcast over four
    x = g.tensor("x", [4, 5], [1, 4])  # column-major
    s = g.pointwise(g.pointwise(p, bcast, mode=PointwiseMode.ADD), x, mode=PointwiseMode.MUL)
    s.set_strides([1, 4]).set_output(True)
    g.validate()
    pack = ref.make_inputs(g, seed=5)
    assert pack[uid(p)].stride() == (7, 1) and pack[uid(bcast)].stride() == (0, 1)
    assert pack[uid(x)].stride() == (1, 4) and pack[uid(x)].dtype == torch.float16
    assert pack[uid(bcast)].untyped_storage().nbytes() == 5 * 2
    out = pack[uid(s)]
    assert out.stride() == (1, 4) and out.dtype == torch.float16 and not out.any()
    again = ref.make_inputs(g, seed=5)
    other = ref.make_inputs(g, seed=6)
    for key in (uid(p), uid(bcast), uid(x)):
        assert torch.equal(pack[key], again[key])
        assert not torch.equal(pack[key], other[key])
    result = ref.run(g, pack)[uid(s)]
    expected = (pack[uid(p)].double() + pack[uid(bcast)].double()) * pack[uid(x)].double()
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def test_make_inputs_draw_on_cpu_is_the_cpu_pack() -> None:
    g = _graph(DataType.HALF)
    x = g.tensor("x", [6, 7])
    g.pointwise(x, mode=PointwiseMode.RELU_FWD).set_output(True)
    g.validate()
    a, b = ref.make_inputs(g, seed=3), ref.make_inputs(g, "cpu", seed=3, draw_on="cpu")
    assert torch.equal(a[uid(x)], b[uid(x)])


@pytest.mark.gpu
def test_make_inputs_draws_on_the_gpu_with_the_same_roles() -> None:
    """A CUDA pack is drawn on the GPU: the same seed gives the same values, the roles hold
    (1/sqrt(K) operands, positive divisors), and draw_on="cpu" gives the CPU pack's values."""
    g = _graph(DataType.HALF)
    a, b = g.tensor("a", [256, 1024]), g.tensor("b", [1024, 64])
    d = g.tensor("d", [256, 64])
    g.pointwise(g.matmul(a, b), d, mode=PointwiseMode.DIV).set_output(True)
    g.validate()
    one, two = ref.make_inputs(g, "cuda", seed=4), ref.make_inputs(g, "cuda", seed=4)
    other = ref.make_inputs(g, "cuda", seed=5)
    for t in (a, b, d):
        assert one[uid(t)].device.type == "cuda"
        assert torch.equal(one[uid(t)], two[uid(t)])
        assert not torch.equal(one[uid(t)], other[uid(t)])
    assert one[uid(b)].abs().max().item() <= 1 / 32 + 1e-3  # 1/sqrt(1024)
    assert one[uid(d)].min().item() >= 0.5
    portable = ref.make_inputs(g, "cuda", seed=4, draw_on="cpu")
    cpu = ref.make_inputs(g, "cpu", seed=4)
    assert all(torch.equal(portable[uid(t)].cpu(), cpu[uid(t)]) for t in (a, b, d))


def test_make_inputs_roles_scale_and_sign() -> None:
    g = _graph()
    a, b = g.tensor("a", [16, 256]), g.tensor("b", [256, 16])
    g.matmul(a, b).set_output(True)
    pack = ref.make_inputs(g, seed=1)
    assert pack[uid(a)].abs().max() <= 1.0
    assert pack[uid(b)].abs().max() <= 1.0 / math.sqrt(256) + 1e-7

    gb = _graph()
    x = gb.tensor("x", [2, 3, 4, 4])
    mean, inv, scale, bias = (gb.tensor(n, [1, 3, 1, 1]) for n in ("m", "iv", "s", "bb"))
    gb.batchnorm_inference(x, mean, inv, scale, bias).set_output(True)
    packb = ref.make_inputs(gb, seed=1)
    assert (packb[uid(inv)] >= 0.5).all() and (packb[uid(scale)] >= 0.5).all()

    gl = _graph()
    xl = gl.tensor("x", [4, 4])
    gl.pointwise(xl, mode=PointwiseMode.LOG).set_output(True)
    assert (ref.make_inputs(gl)[uid(xl)] > 0).all()

    # a batch norm's backward sums dy over N*H*W = 2*1*8195 values per channel: dy is scaled
    # by 1/sqrt(K), so DBIAS and DSCALE stay of order one (a Hypothesis draw at K = 8195 had
    # ATen's float32 DBIAS 1.5e-4 off a cancelled 0.29 with dy of order one)
    gbb = _graph()
    dy, xb = gbb.tensor("dy", [2, 3, 1, 8195]), gbb.tensor("x", [2, 3, 1, 8195])
    stats = [gbb.tensor(n, [1, 3, 1, 1]) for n in ("m", "iv", "s")]
    for t in gbb.batchnorm_backward(dy, xb, *stats):
        t.set_output(True)
    gbb.validate()
    packbb = ref.make_inputs(gbb, seed=1)
    assert packbb[uid(dy)].abs().max() <= 1.0 / math.sqrt(2 * 8195) + 1e-7
    assert packbb[uid(xb)].abs().max() > 0.5


@pytest.mark.parametrize("dtype", [DataType.INT32, DataType.UINT8])
def test_make_inputs_integer_divisors_are_never_zero(dtype: DataType) -> None:
    """An integer divisor drawn as 0 had the reference answer inf in an integer output: every
    engine failed verification, and autotune on an integer DIV graph found no winner."""
    g = Graph("div", io_data_type=dtype)
    x, y = g.tensor("x", [256], data_type=dtype), g.tensor("y", [256], data_type=dtype)
    g.pointwise(x, y, mode=PointwiseMode.DIV).set_output(True).set_data_type(dtype)
    g.validate()
    pack = ref.make_inputs(g, seed=1)
    assert (pack[uid(y)] > 0).all()
    assert (pack[uid(x)] == 0).any()  # other operands keep their range
    out = ref.run(g, pack)
    assert all(v.isfinite().all() for v in out.values())


def test_make_inputs_masks_and_overrides() -> None:
    g = _graph(DataType.HALF)
    q, k, v = (g.tensor(n, [1, 2, 6, 4]) for n in "qkv")
    keep = g.tensor("keep", [1, 1, 6, 6], data_type=DataType.BOOLEAN)
    o = g.sdpa(q, k, v, attn_mask=keep)[0].set_output(True)
    g.validate()
    pack = ref.make_inputs(g, seed=3, dtype_overrides={q: torch.float32, k.uid: DataType.FLOAT})
    assert pack[uid(keep)].dtype == torch.bool and pack[uid(keep)][..., 0].all()
    assert not pack[uid(keep)].all()
    assert pack[uid(q)].dtype == torch.float32 and pack[uid(k)].dtype == torch.float32
    assert pack[uid(v)].dtype == torch.float16
    outputs = ref.make_outputs(g)
    assert set(outputs) == {o.uid} and outputs[uid(o)].dtype == torch.float16

    gf = _graph()
    q2, k2, v2 = (gf.tensor(n, [1, 1, 4, 4]) for n in "qkv")
    additive = gf.tensor("bias", [1, 1, 4, 4])
    gf.sdpa(q2, k2, v2, attn_mask=additive)[0].set_output(True)
    gf.validate()
    bias = ref.make_inputs(gf)[uid(additive)]
    assert torch.isfinite(bias[..., 0]).all() and torch.isneginf(bias).any()


# ---- run() contract ---------------------------------------------------------------------------
def test_reference_dtype_rule() -> None:
    small = _conv_graph()
    assert ref.reference_dtype(small, "cpu") == torch.float64
    assert ref.reference_dtype(small, "cuda") == torch.float32
    assert ref.reference_dtype(small, "cpu", torch.float32) == torch.float32
    assert ref.reference_dtype(small, "cpu", DataType.FLOAT) == torch.float32
    with pytest.raises(InvalidValueError, match="float32 or float64"):
        ref.reference_dtype(small, "cpu", torch.float16)
    big = _graph()
    x = big.tensor("x", [1 << 11, 1 << 11])  # 2**22 elements: not "small"
    big.pointwise(x, mode=PointwiseMode.ABS).set_output(True)
    big.validate()
    assert ref.reference_dtype(big, "cpu") == torch.float32
    dbl = _graph(DataType.DOUBLE)
    dbl.pointwise(dbl.tensor("x", [4]), mode=PointwiseMode.ABS).set_output(True)
    assert ref.reference_dtype(dbl, "cuda") == torch.float64


def test_run_disables_tf32_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dnntune._reference_ops import OPS

    seen: list[tuple[bool, bool]] = []
    original = OPS[OpKind.CONV_FPROP]

    def spy(node, inputs):  # type: ignore[no-untyped-def]
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return original(node, inputs)

    monkeypatch.setitem(OPS, OpKind.CONV_FPROP, spy)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)  # torch's flag objects defeat monkeypatch
    try:
        matmul.allow_tf32, cudnn.allow_tf32 = True, True
        g = _conv_graph()
        ref.run(g, ref.make_inputs(g), precision=torch.float32)
        assert seen == [(False, False)]
        assert matmul.allow_tf32 and cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def test_run_accepts_tensor_keys_flat_buffers_and_ignores_output_buffers() -> None:
    g = _conv_graph(DataType.FLOAT)
    pack = ref.make_inputs(g)
    x, w, b = g.input_tensors()
    y = g.output_tensors()[0]
    expected = ref.run(g, pack)[uid(y)]
    flat_x = pack[uid(x)].as_strided((x.storage_size(),), (1,)).clone()
    sentinel = torch.full_like(pack[uid(y)], 7.0)
    before = pack[uid(w)].clone()
    out = ref.run(g, {x: flat_x, w: pack[uid(w)], b.uid: pack[uid(b)], y: sentinel})
    torch.testing.assert_close(out[uid(y)], expected, rtol=0, atol=0)
    assert (sentinel == 7.0).all() and torch.equal(pack[uid(w)], before)
    assert out[uid(y)].is_contiguous() and list(out[uid(y)].shape) == y.dims


def test_run_errors_name_the_tensor() -> None:
    g = _conv_graph(DataType.FLOAT)
    pack = ref.make_inputs(g)
    x = g.input_tensors()[0]
    missing = {k: v for k, v in pack.items() if k != x.uid}
    with pytest.raises(InvalidValueError, match=rf"missing input tensor uid\(s\) {x.uid} \(x\)"):
        ref.run(g, missing)
    wrong = dict(pack)
    wrong[uid(x)] = torch.zeros(3, 3)
    with pytest.raises(InvalidValueError, match="buffer has shape"):
        ref.run(g, wrong)
    with pytest.raises(InvalidValueError, match="keys must be"):
        ref.run(g, {"x": pack[uid(x)]})


def test_run_validates_and_compares_end_to_end() -> None:
    g = _graph(DataType.HALF)
    a, b = g.tensor("a", [8, 32]), g.tensor("b", [32, 8])
    c = g.matmul(a, b).set_output(True)
    pack = ref.make_inputs(g, seed=9)  # validates the graph on the way
    expected = ref.run(g, pack)[uid(c)]
    engine_like = (pack[uid(a)].float() @ pack[uid(b)].float()).half()
    assert compare(engine_like, expected, ref.tolerance_for(g, c)).ok
    assert not compare(engine_like * 1.05, expected, ref.tolerance_for(g, c)).ok


def test_run_never_aliases_the_callers_buffers() -> None:
    g = _graph(DataType.DOUBLE)
    x = g.tensor("x", [3, 4])
    y = g.pointwise(x, mode=PointwiseMode.IDENTITY).set_output(True)
    pack = ref.make_inputs(g)
    out = ref.run(g, pack)[uid(y)]
    assert torch.equal(out, pack[uid(x)])
    assert out.untyped_storage().data_ptr() != pack[uid(x)].untyped_storage().data_ptr()


def test_compare_zero_dim_tensors() -> None:
    assert compare(torch.tensor(1.0), torch.tensor(1.0), Tolerance(0.0, 0.0)).ok
    result = compare(torch.tensor(2.0), torch.tensor(1.0), Tolerance(0.0, 0.0))
    assert not result.ok and result.mismatches == 1 and "index []" in result.message


def test_every_tf32_knob_declares_it() -> None:
    """The engines' TF32 switches carry Knob.tf32, so sweeps check them at TF32's tolerance."""
    from dnntune.backend.registry import get_registry

    tf32_ids = {
        k.knob_id for e in get_registry().engines() for k in e.knobs() if "tf32" in k.knob_id
    }
    assert {"torch.allow_tf32"} <= tf32_ids
    for e in get_registry().engines():
        for k in e.knobs():
            if "tf32" in k.knob_id:
                assert k.tf32, f"{e.name}: {k.knob_id} must set Knob.tf32"


def test_a_16_bit_output_must_also_match_as_a_whole() -> None:
    """Element by element, a long reduction's atol grows past what a wrong scale needs to hide
    (bf16 matmul, K = 14336: a 10 % gain passed); the whole-output bound catches it, while
    honest bf16 rounding stays far inside."""
    torch.manual_seed(0)
    tol = default_tolerance(DataType.BFLOAT16, OpKind.MATMUL, reduction_length=14336)
    assert tol.atol > 0.1 and tol.rms_rtol == tol.rtol
    expected = torch.randn(64, 32, dtype=torch.float64) * 0.3
    rounded = expected.to(torch.bfloat16)
    assert ref.compare(rounded, expected, tol).ok
    gained = ref.compare((expected * 1.10).to(torch.bfloat16), expected, tol)
    assert not gained.ok and gained.mismatches == 0 and "as a whole is off" in gained.message
    assert ref.compare(torch.zeros(4), torch.zeros(4, dtype=torch.float64), tol).ok
    # float32 keeps the element-wise rule alone; an explicit tolerance sets no whole bound
    assert default_tolerance(DataType.FLOAT, OpKind.MATMUL).rms_rtol == float("inf")
    assert Tolerance(1e-2, 1e-2).loosest(tol).rms_rtol == tol.rms_rtol


def test_every_float_type_has_a_default_tolerance() -> None:
    for dtype in DataType:
        if dtype.is_floating:
            default_tolerance(dtype)  # fp8_e8m0 raised KeyError


def test_a_mismatch_report_names_the_worst_index_without_importing_sympy() -> None:
    """``torch.unravel_index`` imports sympy on first use (0.55 s, inside a candidate's
    verification deadline: a wrong candidate was reported as timed out)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from dnntune.reference import compare\n"
        "e = torch.zeros(2, 3, 4); a = e.clone(); a[1, 2, 3] = 5.0\n"
        "c = compare(a, e)\n"
        "assert not c.ok and 'worst at index [1, 2, 3]' in c.message, c.message\n"
        "print('sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


# ---- the judge's own edges (audit, session 17) -------------------------------------------------
def test_an_rtol_or_atol_given_keeps_the_whole_output_bound() -> None:
    """Overriding rtol or atol kept the element-wise rule only: a bf16 attention over a long
    key sequence (atol grown to 0.12) then accepted an output 32 % off as a whole."""
    from dnntune._reference_check import tolerance_within

    g = Graph(name="ln", io_data_type=DataType.BFLOAT16, compute_data_type=DataType.FLOAT)
    x = g.tensor(name="x", dims=[8, 64], data_type=DataType.BFLOAT16)
    y = g.pointwise(x, mode=PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.validate()
    default = ref.tolerance_for(g, y)
    assert math.isfinite(default.rms_rtol)
    assert tolerance_within(g, y, rtol=0.01).rms_rtol == 0.01
    assert tolerance_within(g, y, atol=1e-3).rms_rtol == default.rtol
    f32 = Graph(name="f", io_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT)
    z = f32.pointwise(f32.tensor(name="x", dims=[4]), mode=PointwiseMode.RELU_FWD)
    z.set_output(True)
    f32.validate()
    assert tolerance_within(f32, z, rtol=0.5).rms_rtol == math.inf  # float32 has none


@pytest.mark.parametrize(
    ("mode", "grows"),
    [
        (ReductionMode.ADD, True),
        (ReductionMode.AVG, False),
        (ReductionMode.MAX, False),
        (ReductionMode.AMAX, False),
    ],
)
def test_an_average_or_extremum_reduction_does_not_loosen_with_length(
    mode: ReductionMode, grows: bool
) -> None:
    """A mean of K terms has its sum's error divided by K (and is small where the sum is of
    order one): with the sum's grown atol an all-zero mean of 4M float32 terms passed."""
    k = 1 << 22
    g = Graph(name="r", io_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT)
    x = g.tensor(name="x", dims=[1, k])
    y = g.reduction(x, mode=mode, axes=[1])
    y.set_output(True)
    g.validate()
    tol = ref.tolerance_for(g, y)
    assert (tol.atol > default_tolerance(DataType.FLOAT).atol) is grows
    if mode is ReductionMode.AVG:
        pack = ref.make_inputs(g, "cpu")
        expected = ref.run(g, pack)[y.uid]
        assert compare(pack[x.uid].mean(1, keepdim=True), expected, tol).ok
        assert not compare(torch.zeros(1, 1), expected, tol).ok


def test_an_integer_output_holds_what_a_conversion_keeps() -> None:
    """7 / 2 into an INT32 output is 3 (toward zero), as the engines write it: the reference
    gave 3.5 and, integers being exact, failed every engine."""
    g = Graph(name="idiv", io_data_type=DataType.INT32, compute_data_type=DataType.FLOAT)
    a = g.tensor(name="a", dims=[4], data_type=DataType.INT32)
    b = g.tensor(name="b", dims=[4], data_type=DataType.INT32)
    y = g.pointwise(a, b, mode=PointwiseMode.DIV)
    y.set_output(True)
    y.set_data_type(DataType.INT32)
    g.validate()
    inputs = {
        a.uid: torch.tensor([7, -7, 5, 1], dtype=torch.int32),
        b.uid: torch.tensor([2, 2, 3, 1], dtype=torch.int32),
    }
    assert ref.run(g, inputs)[y.uid].tolist() == [3, -3, 1, 1]


def test_the_whole_output_bound_allows_for_the_noise_of_a_few_elements() -> None:
    """A 2-element fp16 output with honest rounding (0.45 % RMS of the error, every element
    inside its bound) failed the whole-output bound, made for thousands of elements (a
    conformance draw of a batch-norm on a [1, 2, 1, 1] input); a wrong scale still fails at
    any size, and a large output keeps the bound as it was."""
    tol = default_tolerance(DataType.HALF)
    expected = torch.tensor([0.0135, -0.0135], dtype=torch.float64)
    honest = expected * torch.tensor([1.0045, 0.9955], dtype=torch.float64)
    assert ref.compare(honest, expected, tol).ok
    gained = ref.compare(expected * 1.10, expected, tol)
    assert not gained.ok and "as a whole is off" in gained.message
    many = torch.randn(4096, dtype=torch.float64) * 0.3
    assert not ref.compare(many * 1.005, many, tol).ok  # 0.5 % over 4,096 elements


def test_the_whole_output_bound_has_an_absolute_floor_below_the_types_atol() -> None:
    """A bf16 batch norm of inputs close to their mean cancels to outputs of about 0.014,
    while its rounding stays that of its O(1) inputs (0.0014, far inside the element-wise
    atol of 0.02): a relative bound alone read that as 10 % off. The floor is a tenth of the
    type's atol before a long reduction grows it, so a wrong scale still fails."""
    tol = default_tolerance(DataType.BFLOAT16, OpKind.BATCHNORM_INFERENCE)
    assert tol.rms_atol == pytest.approx(0.1 * default_tolerance(DataType.BFLOAT16).atol)
    expected = torch.tensor([0.0135, -0.0145, 0.0140, -0.0130], dtype=torch.float64)
    honest = expected + torch.tensor([0.0014, -0.0014, 0.0014, 0.0014], dtype=torch.float64)
    assert ref.compare(honest, expected, tol).ok
    grown = default_tolerance(DataType.BFLOAT16, OpKind.MATMUL, reduction_length=1 << 20)
    # not grown with the reduction (a tenth of the matmul's own base atol)
    assert grown.rms_atol == default_tolerance(DataType.BFLOAT16, OpKind.MATMUL).rms_atol
    big = torch.randn(256, dtype=torch.float64) * 0.3
    assert not ref.compare(big * 1.10, big, grown).ok


@pytest.mark.parametrize("compute", [DataType.HALF, DataType.BFLOAT16])
def test_a_declared_16_bit_compute_type_gets_its_tolerance(compute: DataType) -> None:
    """A node computing in half or bfloat16 (as it declares, and as TORCH_ENGINE and cuDNN do)
    into a float32 output is rounded to that type: float32's tolerance failed every engine
    that honours the declaration (a half SQRT into float32, 2e-4 off)."""
    g = Graph(name="c", io_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT)
    x = g.tensor(name="x", dims=[4], data_type=compute)
    y = g.pointwise(x, mode=PointwiseMode.SQRT, compute_data_type=compute)
    y.set_output(True)
    y.set_data_type(DataType.FLOAT)
    g.validate()
    assert ref.tolerance_for(g, y) == default_tolerance(compute)


def test_a_float_or_double_compute_type_loosens_nothing() -> None:
    g = Graph(name="d", io_data_type=DataType.DOUBLE, compute_data_type=DataType.FLOAT)
    x = g.tensor(name="x", dims=[4], data_type=DataType.DOUBLE)
    y = g.pointwise(x, mode=PointwiseMode.SQRT, compute_data_type=DataType.FLOAT)
    y.set_output(True)
    g.validate()
    assert ref.tolerance_for(g, y) == default_tolerance(DataType.DOUBLE)


def test_data_scale_multiplies_a_dot_products_operands_and_reads_a_norms_affine() -> None:
    """``reference.data_scale``: 1 for well-scaled inputs; an attention's query, key and value
    RMS multiplied; a norm's input left out (it normalizes it away), its scale read; a value
    below 1 counted as 1."""
    g = _graph()
    q, k, v = (g.tensor(n, [1, 2, 6, 4]) for n in "qkv")
    g.sdpa(q, k, v)[0].set_output(True)
    g.validate()
    pack = ref.make_inputs(g, seed=0)
    assert ref.data_scale(g, pack) < 1.5
    for t, factor in ((q, 10.0), (k, 3.0), (v, 0.1)):
        pack[uid(t)] = torch.ones_like(pack[uid(t)]) * factor
    assert ref.data_scale(g, pack) == pytest.approx(30.0)
    n = _graph()
    x = n.tensor("x", [2, 3, 4])
    scale, bias = n.tensor("scale", [1, 3, 4]), n.tensor("bias", [1, 3, 4])
    n.layernorm(x, scale, bias, 1e-3)[0].set_output(True)
    n.validate()
    pack = {uid(x): torch.full((2, 3, 4), 500.0), uid(scale): torch.full((1, 3, 4), 2.0)}
    pack[uid(bias)] = torch.zeros(1, 3, 4)
    assert ref.data_scale(n, pack) == pytest.approx(2.0)


def test_a_match_says_how_many_elements_were_nan_or_inf_in_both() -> None:
    """ "max abs error 0" over an output of NaNs read as a clean match (new-user audit, session
    56): the message counts the elements compared by kind only."""
    expected = torch.tensor([math.nan, math.inf, 1.0, 2.0], dtype=torch.float64)
    c = compare(expected.clone(), expected)
    assert c.ok and "; 2 of them NaN or inf in both, compared by kind" in c.message
    plain = compare(torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert plain.ok and "NaN" not in plain.message
