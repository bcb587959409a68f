"""TRITON_ENGINE batch-norm logic that runs anywhere: which batch-norm graphs the NHWC kernel
takes (and why it declines the others), what the match hands the kernel, the generated source,
the config space and its constraints, and the engine's knobs for a batch-norm graph (no GPU, no
triton needed)."""

from __future__ import annotations

import math

import pytest
from batchnorm_cases import BF, ODD, SUITE, F, H, bn_graph, odd_id, suite_graph

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.triton import TritonEngine, batchnorm_configs
from dnntune.providers.triton.batchnorm_match import BatchnormMatch
from dnntune.providers.triton.kernels.batchnorm import source
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.solvers import BatchnormSolver, DeviceLimits, solver_for

H200 = DeviceLimits(smem_per_block=232448, sm_count=132)


def _bn(graph: dt.Graph) -> BatchnormMatch:
    match = match_graph(graph)
    assert isinstance(match, BatchnormMatch)
    return match


# ---- what the kernel takes ------------------------------------------------------------------
def test_suite_graphs_match() -> None:
    conv1, res3 = (_bn(suite_graph(name)) for name in SUITE)
    assert (conv1.pixels, conv1.channels) == (32 * 112 * 112, 64)
    assert (res3.pixels, res3.channels) == (32 * 28 * 28, 512)
    assert conv1.x.strides == (64, 1)  # (pixel, channel)
    assert conv1.x.dtype is H
    assert [o.strides for o in conv1.stats] == [(1,)] * 4
    assert all(o.dtype is F for o in conv1.stats)
    assert conv1.epilogue.ops == []
    ((value, y),) = conv1.epilogue.outputs
    assert value == "acc" and y.strides == (64, 1) and y.dtype is H
    assert conv1.kernel == "batchnorm"
    assert conv1.signature() != res3.signature()


@pytest.mark.parametrize("dims", ODD, ids=odd_id)
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
def test_odd_shapes_match(dims: list[int], dtype: dt.DataType) -> None:
    m = _bn(bn_graph(dims, dtype))
    assert m.channels == dims[1]
    assert m.pixels * m.channels == math.prod(dims)
    assert m.x.dtype is dtype
    assert m.x.strides[1] in (0, 1)


def test_one_channel_is_channels_last_in_any_layout() -> None:
    m = _bn(bn_graph([2, 1, 3, 5], layout="nchw"))
    assert m.x.strides == (1, 0)  # the pixels of a one-channel NCHW tensor are packed


def test_relu_fuses_as_an_epilogue() -> None:
    m = _bn(bn_graph([2, 24, 5, 3], H, ("relu",)))
    assert [op.mode for op in m.epilogue.ops] == [dt.PointwiseMode.RELU_FWD]
    assert m.epilogue.ops[0].args == ("acc",)
    ((value, out),) = m.epilogue.outputs  # the batch norm's y is virtual: not stored
    assert value == "v0" and out.strides == (24, 1)
    assert "tl.maximum(acc, 0.0)" in source(m)


def test_epilogue_inputs_collapse_to_pixel_and_channel_strides() -> None:
    m = _bn(bn_graph([2, 24, 5, 3], F, ("res", "relu", "chan", "scale"), keep_y=True))
    res, chan = m.epilogue.inputs
    assert res.strides == (24, 1)  # a full NHWC tensor
    assert chan.strides == (0, 1)  # one value per channel
    names = [name for name, _ in m.epilogue.outputs]
    assert names == ["acc", "v3"]  # y kept, and the last pointwise output
    text = source(m)
    compile(text, "<batchnorm>", "exec")  # the generated module is valid Python
    assert "in1 = in1[None, :]" in text  # the per-channel input broadcast over pixels


def test_per_pixel_and_one_element_inputs() -> None:
    m = _bn(bn_graph([2, 24, 5, 3], H, ("pix", "one")))
    pix, one = m.epilogue.inputs
    assert pix.strides == (1, 0) and one.strides == (0, 0)
    text = source(m)
    assert "in0 = in0[:, None]" in text and "in1 = tl.load(p_in1)" in text


def test_mixed_input_and_output_types_match() -> None:
    m = _bn(bn_graph([2, 16, 4, 4], H, y_dtype=F))
    assert m.x.dtype is H and m.epilogue.outputs[0][1].dtype is F
    m = _bn(bn_graph([2, 16, 4, 4], BF, stat_dtype=BF))
    assert all(o.dtype is BF for o in m.stats)


def test_source_folds_the_statistics_once_per_program() -> None:
    text = source(_bn(suite_graph(SUITE[0])))
    compile(text, "<batchnorm>", "exec")
    assert text.count("tl.load(p_mean") == 2  # masked and unmasked variants, loaded once
    assert "a = inv * scale" in text
    assert "acc = (x.to(tl.float32) - mean[None, :]) * a[None, :] + bias[None, :]" in text
    assert "if EVEN_P and EVEN_C:" in text


def _padded_images() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor("X", [2, 8, 3, 3], strides=[100, 1, 24, 8], data_type=H)
    stats = [g.tensor(n, [1, 8, 1, 1], data_type=F) for n in "MISB"]
    g.batchnorm_inference(x, *stats).set_output(True)
    g.validate()
    return g


def _training() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor("X", [2, 8, 3, 3], strides=[72, 1, 24, 8], data_type=H)
    s, b = (g.tensor(n, [1, 8, 1, 1], data_type=F) for n in "SB")
    for t in g.batchnorm(x, s, b, 1e-5):
        t.set_output(True)
    g.validate()
    return g


def _backward() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    dy, x = (g.tensor(n, [2, 8, 3, 3], strides=[72, 1, 24, 8], data_type=H) for n in ("DY", "X"))
    m, iv, s = (g.tensor(n, [1, 8, 1, 1], data_type=F) for n in ("M", "IV", "S"))
    for t in g.batchnorm_backward(dy, x, m, iv, s):
        t.set_output(True)
    g.validate()
    return g


def _prologue() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor("X", [2, 8, 3, 3], strides=[72, 1, 24, 8], data_type=H)
    x2 = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD)
    stats = [g.tensor(n, [1, 8, 1, 1], data_type=F) for n in "MISB"]
    g.batchnorm_inference(x2, *stats).set_output(True)
    g.validate()
    return g


def _two_batch_norms() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    y = g.tensor("X", [2, 8, 3, 3], strides=[72, 1, 24, 8], data_type=H)
    for i in range(2):
        stats = [g.tensor(f"{n}{i}", [1, 8, 1, 1], data_type=F) for n in "MISB"]
        y = g.batchnorm_inference(y, *stats)
    y.set_output(True)
    g.validate()
    return g


def _with_a_reduction() -> dt.Graph:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor("X", [2, 8, 3, 3], strides=[72, 1, 24, 8], data_type=H)
    stats = [g.tensor(n, [1, 8, 1, 1], data_type=F) for n in "MISB"]
    y = g.batchnorm_inference(x, *stats)
    g.reduction(y, mode=dt.ReductionMode.ADD, axes=[3]).set_output(True)
    g.validate()
    return g


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (
            lambda: bn_graph([2, 8, 3, 3], layout="nchw"),
            r"x_tensor_uid: .* not channels-last \(NHWC",
        ),
        (
            lambda: bn_graph([2, 8, 3, 3], y_layout="nchw"),
            r"not channels-last",
        ),
        (
            lambda: bn_graph([2, 8, 3, 3], H, ("relu",), y_layout="nchw"),
            r"not channels-last",
        ),
        (lambda: bn_graph([2, 8, 3, 3], dt.DataType.DOUBLE), r"data type double"),
        (
            lambda: bn_graph([2, 8, 3, 3], stat_dtype=dt.DataType.DOUBLE),
            r"mean_tensor_uid: data type double",
        ),
        (_padded_images, r"do not flatten to one pixel stride"),
        (_training, r"batchnorm_training: the Triton batch-norm kernel runs inference only"),
        (_backward, r"batchnorm_backward: the Triton batch-norm kernel runs inference only"),
        (_prologue, r"prologue"),
        (_two_batch_norms, r"it has 2 batch norms"),
        (_with_a_reduction, r"not a batchnorm_inference\[\+pointwise epilogue\]: it has"),
    ],
    ids=[
        "nchw-input",
        "nchw-output",
        "nchw-epilogue-output",
        "double",
        "double-stats",
        "padded-images",
        "training",
        "backward",
        "prologue",
        "two-batch-norms",
        "reduction",
    ],
)
def test_declines_what_it_does_not_run(graph: object, reason: str) -> None:
    with pytest.raises(NotSupportedError, match=reason):
        match_graph(graph())  # type: ignore[operator]


# ---- the config space -----------------------------------------------------------------------
@pytest.mark.parametrize("name", SUITE)
def test_suite_candidates_are_small_and_fit(name: str) -> None:
    match = _bn(suite_graph(name))
    solver = solver_for(match)
    assert isinstance(solver, BatchnormSolver)
    candidates = solver.candidates(match, H200, {})
    assert 6 <= len(candidates) <= 12
    assert candidates[0] == solver.default(match, H200)
    for config in candidates:
        assert solver.check(config, match, H200) is None
        assert config["block_n"] <= match.channels
    assert len({tuple(sorted(c.items())) for c in candidates}) == len(candidates)
    assert len({c["block_n"] for c in candidates}) == 2
    assert len({c["num_warps"] for c in candidates}) >= 2


def test_defaults_are_sized_by_bytes() -> None:
    solver = BatchnormSolver()
    conv1, res3 = (_bn(suite_graph(name)) for name in SUITE)
    # every channel of a pixel (64 fp16), 16 KiB of input per program, 64 bytes per thread
    assert solver.default(conv1, H200) == {"block_m": 128, "block_n": 64, "num_warps": 8}
    # 512 channels split in 256-byte blocks
    assert solver.default(res3, H200) == {"block_m": 64, "block_n": 128, "num_warps": 8}
    fp32 = _bn(suite_graph(SUITE[1], F))
    assert solver.default(fp32, H200) == {"block_m": 64, "block_n": 64, "num_warps": 8}


def test_prior_spreads_small_problems_over_the_sms() -> None:
    # 8 x 64 fp16: one program per pixel block would leave most SMs idle
    config = batchnorm_configs.bn_prior(64, 64, 2, 132)
    assert config["block_m"] == 1 and config["block_n"] == 64 and config["num_warps"] == 1
    assert batchnorm_configs.bn_prior(5, 1, 2, 132) == {"block_m": 32, "block_n": 1, "num_warps": 1}


@pytest.mark.parametrize("dims", ODD, ids=odd_id)
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
def test_odd_shapes_always_have_a_valid_default(dims: list[int], dtype: dt.DataType) -> None:
    match = _bn(bn_graph(dims, dtype))
    solver = BatchnormSolver()
    assert solver.check(solver.default(match, H200), match, H200) is None
    candidates = solver.candidates(match, H200, {})
    assert 1 <= len(candidates) <= 12


def test_constraints_name_the_knob_to_change() -> None:
    match = _bn(suite_graph(SUITE[1]))
    solver = BatchnormSolver()
    spill = solver.check({"block_m": 256, "block_n": 256, "num_warps": 1}, match, H200)
    assert spill is not None and "registers spill" in spill.reason
    assert "num_warps" in spill.knobs
    idle = solver.check({"block_m": 1, "block_n": 4, "num_warps": 8}, match, H200)
    assert idle is not None and idle.knobs == ("num_warps",)


def test_pins_restrict_the_search() -> None:
    match = _bn(suite_graph(SUITE[0]))
    pinned = BatchnormSolver().candidates(match, H200, {"block_n": 32, "num_warps": 8})
    assert pinned and all(c["block_n"] == 32 and c["num_warps"] == 8 for c in pinned)


# ---- the engine -----------------------------------------------------------------------------
def test_engine_knobs_for_a_batchnorm_graph() -> None:
    engine = TritonEngine()
    g = suite_graph(SUITE[0])
    knobs = {k.knob_id: k for k in engine.knobs(g)}
    assert {"triton.block_m", "triton.block_n", "triton.num_warps"} <= set(knobs)
    assert "triton.block_k" not in knobs and "triton.split_k" not in knobs
    assert knobs["triton.block_m"].constraint.check(1024) is None  # type: ignore[union-attr]
    assert engine.supports_exhaustive(g)
    assert engine.estimate_workspace_size(g, []) == 0


def test_engine_validates_pinned_batchnorm_configs() -> None:
    engine = TritonEngine()
    g = suite_graph(SUITE[1])
    engine.validate_knobs([KnobSetting("triton.block_n", 256)], g)
    with pytest.raises(InvalidValueError, match=r"triton\.num_warps.*spill"):
        engine.validate_knobs(
            [
                KnobSetting("triton.block_m", 256),
                KnobSetting("triton.block_n", 256),
                KnobSetting("triton.num_warps", 1),
            ],
            g,
        )


def test_batchnorm_needs_cuda(cpu_handle: dt.Handle) -> None:
    engine = dt.get_registry().get("TRITON_ENGINE")
    reason = dt.get_registry().why_not(engine, suite_graph(SUITE[0]), cpu_handle)
    assert reason is not None and "cuda" in reason.lower()
