"""TRITON_ENGINE pooling logic that runs anywhere: which pooling graphs the NHWC kernel takes
(and why it declines the others), what the match hands the kernel, the config space and its
constraints, and the engine's knobs for a pooling graph (no GPU, no triton needed)."""

from __future__ import annotations

import pytest
from pool_cases import BF, ODD, SUITE, F, H, M, odd_graph, odd_id, pool_graph, suite_graph

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.triton import TritonEngine, pool_configs
from dnntune.providers.triton.patterns import PoolMatch, match_graph
from dnntune.providers.triton.solvers import MAX_CANDIDATES, DeviceLimits, PoolSolver, solver_for

H200 = DeviceLimits(smem_per_block=232448, sm_count=132)


def _pool(graph: dt.Graph) -> PoolMatch:
    match = match_graph(graph)
    assert isinstance(match, PoolMatch)
    return match


# ---- what the kernel takes ------------------------------------------------------------------
def test_suite_graphs_match() -> None:
    inception, resnet_global, resnet_pool1 = (_pool(suite_graph(name)) for name in SUITE)
    assert inception.mode is M.AVGPOOL_INCLUDE_PADDING and not inception.is_global
    assert (inception.n, inception.c, inception.h, inception.w) == (32, 768, 17, 17)
    assert (inception.out_h, inception.out_w) == (17, 17)
    assert (inception.window, inception.stride, inception.padding) == ((3, 3), (1, 1), (1, 1))
    assert inception.x.strides == (221952, 13056, 768)  # (n, h, w); the C stride is 1
    assert resnet_global.is_global and (resnet_global.out_h, resnet_global.out_w) == (1, 1)
    assert resnet_global.y.strides == (2048, 2048, 2048)
    assert resnet_pool1.mode is M.MAXPOOL and not resnet_pool1.is_global
    assert resnet_pool1.pixels == 32 * 56 * 56
    assert resnet_pool1.y.dtype is H


def test_asymmetric_padding_keeps_the_pre_padding() -> None:
    m = _pool(pool_graph([1, 3, 9, 8], M.AVGPOOL_EXCLUDE_PADDING, [3, 2], [2, 1], [1, 0], [0, 1]))
    assert m.padding == (1, 0)  # the post-padding only shapes the output
    assert (m.out_h, m.out_w) == (4, 8)
    assert m.window == (3, 2) and m.stride == (2, 1)


def test_global_means_one_window_over_everything() -> None:
    assert _pool(pool_graph([2, 8, 5, 4], M.MAXPOOL, [5, 4])).is_global
    # the whole input but padded, or a second window through the post-padding: not global
    padded = pool_graph([2, 8, 6, 6], M.AVGPOOL_INCLUDE_PADDING, [6, 6], [1, 1], [3, 3], [3, 3])
    assert not _pool(padded).is_global
    two = pool_graph([2, 8, 6, 6], M.MAXPOOL, [6, 6], [2, 2], [0, 0], [2, 2])
    m = _pool(two)
    assert (m.out_h, m.out_w) == (2, 2) and not m.is_global


@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
def test_odd_shapes_match(index: int, dtype: dt.DataType) -> None:
    m = _pool(odd_graph(index, dtype))
    assert m.x.dtype is dtype and m.y.dtype is dtype


def test_mixed_input_and_output_types_match() -> None:
    m = _pool(pool_graph([2, 8, 6, 6], M.AVGPOOL_INCLUDE_PADDING, [2, 2], y_dtype=F))
    assert (m.x.dtype, m.y.dtype) == (H, F)


def test_one_channel_is_channels_last_in_any_layout() -> None:
    m = _pool(pool_graph([2, 1, 6, 6], M.MAXPOOL, [2, 2], layout="nchw"))
    assert m.x.strides == (36, 6, 1)


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (
            lambda: pool_graph([2, 8, 6, 6], M.MAXPOOL, [2, 2], layout="nchw"),
            r"x_tensor_uid: .* not channels-last \(NHWC",
        ),
        (
            lambda: pool_graph([2, 8, 6, 6], M.MAXPOOL, [2, 2], y_layout="nchw"),
            r"y_tensor_uid: .* not channels-last",
        ),
        (
            lambda: pool_graph([2, 8, 4, 6, 6], M.AVGPOOL_INCLUDE_PADDING, [2, 2, 2]),
            r"only 2-D pooling",
        ),
        (
            lambda: pool_graph([2, 8, 6, 6], M.MAXPOOL, [2, 2], dtype=dt.DataType.DOUBLE),
            r"data type double is not supported",
        ),
    ],
    ids=["nchw-input", "nchw-output", "3d", "double"],
)
def test_declines_what_it_does_not_run(graph: object, reason: str) -> None:
    with pytest.raises(NotSupportedError, match=reason):
        match_graph(graph())  # type: ignore[operator]


def test_declines_pooling_with_other_nodes() -> None:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor("X", [2, 8, 6, 6], strides=[288, 1, 48, 8])
    y = g.resample(x, mode=M.MAXPOOL, window=2)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="not a pooling: it has pointwise"):
        match_graph(g)


# ---- the config space -----------------------------------------------------------------------
@pytest.mark.parametrize("name", SUITE)
def test_suite_candidates_are_bounded_and_fit(name: str) -> None:
    match = _pool(suite_graph(name))
    solver = solver_for(match)
    assert isinstance(solver, PoolSolver)
    candidates = solver.candidates(match, H200, {})
    assert 8 <= len(candidates) <= MAX_CANDIDATES
    assert candidates[0] == solver.default(match, H200)
    for config in candidates:
        assert solver.check(config, match, H200) is None
        assert config["block_n"] <= max(4, match.c)  # never wider than the channels
    assert len({tuple(sorted(c.items())) for c in candidates}) == len(candidates)
    assert len({c["block_n"] for c in candidates}) >= 2
    assert len({c["num_warps"] for c in candidates}) >= 2


def test_defaults_vectorise_over_channels() -> None:
    solver = PoolSolver()
    inception, resnet_global, resnet_pool1 = (_pool(suite_graph(name)) for name in SUITE)
    assert solver.default(resnet_pool1, H200)["block_n"] == 64  # every channel of a pixel
    assert solver.default(inception, H200)["block_n"] == 128
    glob = solver.default(resnet_global, H200)
    # a global pool walks h*w = 49 pixels per step of at most 64
    assert glob["block_m"] <= 64 and 2048 % glob["block_n"] == 0


@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
def test_odd_shapes_always_have_a_valid_default(index: int) -> None:
    match = _pool(odd_graph(index))
    solver = PoolSolver()
    assert solver.check(solver.default(match, H200), match, H200) is None
    assert solver.candidates(match, H200, {})


def test_constraints_name_the_knob_to_change() -> None:
    match = _pool(suite_graph(SUITE[2]))
    solver = PoolSolver()
    spill = solver.check({"block_m": 128, "block_n": 256, "num_warps": 1}, match, H200)
    assert spill is not None and "registers spill" in spill.reason
    assert "num_warps" in spill.knobs
    idle = solver.check({"block_m": 1, "block_n": 4, "num_warps": 8}, match, H200)
    assert idle is not None and idle.knobs == ("num_warps",)


def test_pins_restrict_the_search() -> None:
    match = _pool(suite_graph(SUITE[0]))
    pinned = PoolSolver().candidates(match, H200, {"block_n": 64, "num_warps": 4})
    assert pinned and all(c["block_n"] == 64 and c["num_warps"] == 4 for c in pinned)


# ---- the engine -----------------------------------------------------------------------------
def test_engine_knobs_for_a_pooling_graph() -> None:
    engine = TritonEngine()
    g = suite_graph(SUITE[1])
    knobs = {k.knob_id: k for k in engine.knobs(g)}
    assert {"triton.block_m", "triton.block_n", "triton.num_warps"} <= set(knobs)
    assert "triton.block_k" not in knobs and "triton.split_k" not in knobs
    assert knobs["triton.tuning_policy"].default_value == 0
    assert engine.supports_exhaustive(g)
    assert engine.estimate_workspace_size(g, []) == 0
    everything = {k.knob_id: k for k in engine.knobs()}
    assert everything["triton.block_n"].constraint.check(4) is None  # type: ignore[union-attr]


def test_engine_validates_pinned_pooling_configs() -> None:
    engine = TritonEngine()
    g = suite_graph(SUITE[2])
    engine.validate_knobs([KnobSetting("triton.block_n", 32)], g)
    with pytest.raises(InvalidValueError, match=r"triton\.num_warps.*spill"):
        engine.validate_knobs(
            [
                KnobSetting("triton.block_m", 128),
                KnobSetting("triton.block_n", 256),
                KnobSetting("triton.num_warps", 1),
            ],
            g,
        )


def test_pooling_needs_cuda(cpu_handle: dt.Handle) -> None:
    engine = dt.get_registry().get("TRITON_ENGINE")
    reason = dt.get_registry().why_not(engine, suite_graph(SUITE[0]), cpu_handle)
    assert reason is not None and "cuda" in reason.lower()


def test_prior_gives_each_thread_one_vector_per_tap() -> None:
    # fp16: 8 values a thread (16 bytes); fp32: 4, capped at 8 warps
    assert pool_configs.pool_prior(64, 100352, 2, False) == {
        "block_m": 32,
        "block_n": 64,
        "num_warps": 8,
    }
    assert pool_configs.pool_prior(3, 10, 4, False) == {"block_m": 16, "block_n": 4, "num_warps": 1}
    assert pool_configs.channel_blocks(3) == [4]
    assert pool_configs.channel_blocks(768)[:3] == [256, 128, 64]


def test_global_prior_fills_each_threads_accumulators() -> None:
    # a global pool's step: as few warps as hold it at MAX_VALUES_PER_THREAD values a thread
    # (the H200's ResNet-50 global 7x7 pool: 2 warps 4.1 µs, 8 warps 8.4 µs)
    prior = pool_configs.pool_prior(2048, 49, 2, True)
    assert prior == {"block_m": 32, "block_n": 64, "num_warps": 2}
    per_thread = prior["block_m"] * prior["block_n"] / (32 * prior["num_warps"])
    assert per_thread == pool_configs.MAX_VALUES_PER_THREAD
    # a step smaller than a warp's accumulators still takes one warp
    assert pool_configs.pool_prior(8, 4, 4, True)["num_warps"] == 1
    # windowed pooling keeps one 16-byte vector per thread and tap
    assert pool_configs.pool_prior(64, 100352, 2, False)["num_warps"] == 8
    # the prior is in the space Triton's search covers, which tries fewer warps first
    space = pool_configs.pool_space(2048, 49, 2, True)
    assert prior in space and space[0]["num_warps"] == 2
