"""TRITON_ENGINE logic that runs anywhere: the tuning-policy table and its precedence, the perf
db, solver constraints and pruning, pattern matching, generated source and the engine's knobs,
validation, workspace sizing and applicability (no GPU, no triton needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from triton_cases import (
    BF,
    F,
    H,
    conv_graph,
    matmul_graph,
    norm_graph,
    pointwise_graph,
    reduction_graph,
)

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.triton import TritonEngine
from dnntune.providers.triton import policy as tp
from dnntune.providers.triton.kernels import matmul as matmul_kernel
from dnntune.providers.triton.kernels import pointwise as pointwise_kernel
from dnntune.providers.triton.kernels.codegen import emit_ops, literal
from dnntune.providers.triton.patterns import (
    ExprOp,
    MatmulMatch,
    NormMatch,
    PointwiseMatch,
    ReductionMatch,
    coalesce,
    match_graph,
)
from dnntune.providers.triton.perf_db import PerfDb, PerfKey, PerfRecord, default_db
from dnntune.providers.triton.solvers import (
    MAX_CANDIDATES,
    DeviceLimits,
    MatmulSolver,
    NormSolver,
    PointwiseSolver,
    solver_for,
)

H200 = DeviceLimits(smem_per_block=232448, sm_count=132)

# ---- the tuning policy ----------------------------------------------------------------------
S, R, W, D = "search", "record", "write", "delete"
READ = {R}  # use the record, nothing else
NOTHING: set[str] = set()  # the default config
SEARCH_WRITE = {S, W}

#: (policy, record present, benchmarking) -> what the build does
POLICY_TABLE = {
    (0, True, 0): READ,
    (0, False, 0): NOTHING,
    (0, True, 1): READ,
    (0, False, 1): SEARCH_WRITE,
    (1, True, 0): READ,
    (1, False, 0): NOTHING,
    (1, True, 1): READ,
    (1, False, 1): NOTHING,
    (2, True, 0): READ,
    (2, False, 0): NOTHING,
    (2, True, 1): SEARCH_WRITE,
    (2, False, 1): SEARCH_WRITE,
    (3, True, 0): READ,
    (3, False, 0): SEARCH_WRITE,
    (3, True, 1): READ,
    (3, False, 1): SEARCH_WRITE,
    (4, True, 0): SEARCH_WRITE,
    (4, False, 0): SEARCH_WRITE,
    (4, True, 1): SEARCH_WRITE,
    (4, False, 1): SEARCH_WRITE,
    (5, True, 0): {D},
    (5, False, 0): {D},
    (5, True, 1): {D},
    (5, False, 1): {D},
}


def _actions(decision: tp.Decision) -> set[str]:
    flags = {
        S: decision.search,
        R: decision.use_record,
        W: decision.write_record,
        D: decision.delete_records,
    }
    return {name for name, on in flags.items() if on}


def test_policy_table_is_complete() -> None:
    assert len(POLICY_TABLE) == 6 * 2 * 2


@pytest.mark.parametrize(("policy", "record", "benchmarking"), sorted(POLICY_TABLE))
def test_policy_decision_table(policy: int, record: bool, benchmarking: int) -> None:
    decision = tp.decide(policy, record, benchmarking, None)
    assert _actions(decision) == POLICY_TABLE[(policy, record, benchmarking)]


@pytest.mark.parametrize(
    ("policy", "benchmarking", "force", "record", "searches"),
    [
        # the environment variable overrides global.benchmarking, both ways
        (0, 0, True, False, True),
        (0, 1, False, False, False),
        (2, 0, True, True, True),
        (2, 1, False, True, False),
        # an explicit policy overrides the environment variable
        (1, 1, True, False, False),
        (5, 0, True, False, False),
        (4, 0, False, True, True),
        (3, 0, False, False, True),
    ],
)
def test_policy_precedence(
    policy: int, benchmarking: int, force: bool, record: bool, searches: bool
) -> None:
    assert tp.decide(policy, record, benchmarking, force).search is searches


def test_policy_resolution_names() -> None:
    assert tp.resolve(0, 1, None) is tp.TuningPolicy.SEARCH
    assert tp.resolve(0, 0, None) is tp.TuningPolicy.NONE
    assert tp.resolve(0, 0, True) is tp.TuningPolicy.SEARCH
    assert tp.resolve(4, 0, False) is tp.TuningPolicy.SEARCH_DB_UPDATE
    assert tp.may_search(1, 1, True) is False
    assert tp.may_search(0, 1, None) is True


@pytest.mark.parametrize(
    ("env", "knob_settings", "searches"),
    [
        ("1", {}, True),
        ("1", {"triton.tuning_policy": 1}, False),
        ("0", {"global.benchmarking": 1}, False),
        (None, {"global.benchmarking": 1}, True),
        ("on", {"triton.tuning_policy": 2}, True),
        ("off", {"triton.tuning_policy": 2, "global.benchmarking": 1}, False),
    ],
)
def test_engine_policy_reads_force_benchmarking(
    monkeypatch: pytest.MonkeyPatch, env: str | None, knob_settings: dict[str, int], searches: bool
) -> None:
    if env is not None:
        monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", env)
    engine = TritonEngine()
    g = norm_graph("rms", [64], 512)
    settings = [KnobSetting(k, v) for k, v in knob_settings.items()]
    assert engine.policy_decision(settings, g, record_present=False).search is searches


def test_tuning_policy_knob_on_every_kernel() -> None:
    engine = TritonEngine()
    graphs = [
        matmul_graph(64, 64, 64),
        norm_graph("ln", [8], 256),
        reduction_graph(8, 100, dt.ReductionMode.ADD),
        pointwise_graph([4, 8]),
    ]
    for g in graphs:
        knobs = {k.knob_id: k for k in engine.knobs(g)}
        assert knobs["triton.tuning_policy"].default_value == 0
        assert "global.benchmarking" in knobs
        assert engine.supports_exhaustive(g)


@pytest.mark.parametrize("value", [-1, 6])
def test_tuning_policy_out_of_range_is_refused(value: int) -> None:
    engine = TritonEngine()
    with pytest.raises(InvalidValueError, match=r"triton\.tuning_policy"):
        engine.validate_knobs(
            [KnobSetting("triton.tuning_policy", value)], norm_graph("ln", [4], 64)
        )


# ---- the perf db ----------------------------------------------------------------------------
def _key(**changes: object) -> PerfKey:
    fields: dict[str, object] = {
        "kernel": "norm",
        "problem": {"rows": 16384, "n": 4096, "op": "rmsnorm"},
        "device": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "versions": {"triton": "3.6.0", "dnntune": "0.1.0"},
        "pins": {},
    }
    fields.update(changes)
    return PerfKey(**fields)  # type: ignore[arg-type]


def test_perf_db_round_trip_last_line_wins(tmp_path: Path) -> None:
    db = PerfDb(tmp_path)
    key = _key()
    assert db.lookup(key) is None
    db.store(key, PerfRecord({"block_m": 1, "block_n": 4096, "num_warps": 8}, 0.05, 30))
    db.store(key, PerfRecord({"block_m": 2, "block_n": 4096, "num_warps": 16}, 0.04, 30))
    record = db.lookup(key)
    assert record is not None
    assert record.config == {"block_m": 2, "block_n": 4096, "num_warps": 16}
    assert record.time_ms == pytest.approx(0.04)
    lines = (tmp_path / "norm.jsonl").read_text().splitlines()
    assert len(lines) == 2
    entry = json.loads(lines[-1])
    assert entry["problem"]["n"] == 4096
    assert entry["versions"]["triton"] == "3.6.0"
    assert entry["device"]["name"] == "NVIDIA H200"


def test_perf_db_keys_cover_device_versions_and_pins(tmp_path: Path) -> None:
    db = PerfDb(tmp_path)
    db.store(_key(), PerfRecord({"num_warps": 8}, 1.0))
    assert db.lookup(_key(device={"name": "NVIDIA H100"})) is None
    assert db.lookup(_key(versions={"triton": "3.7.0", "dnntune": "0.1.0"})) is None
    assert db.lookup(_key(pins={"num_warps": 4})) is None
    assert db.lookup(_key(problem={"rows": 1, "n": 4096, "op": "rmsnorm"})) is None
    assert db.lookup(_key()) is not None


def test_perf_db_clean_deletes_only_this_problem(tmp_path: Path) -> None:
    db = PerfDb(tmp_path)
    db.store(_key(), PerfRecord({"num_warps": 8}, 1.0))
    db.store(_key(pins={"num_warps": 4}), PerfRecord({"num_warps": 4}, 1.0))
    db.store(
        _key(versions={"triton": "3.5.0", "dnntune": "0.0.9"}), PerfRecord({"num_warps": 2}, 1.0)
    )
    other = _key(problem={"rows": 8, "n": 8, "op": "rmsnorm"})
    db.store(other, PerfRecord({"num_warps": 1}, 1.0))
    assert db.delete(_key()) == 3
    assert db.lookup(_key()) is None
    assert db.lookup(other) is not None
    assert db.delete(_key()) == 0


def test_perf_db_skips_bad_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = PerfDb(tmp_path)
    db.store(_key(), PerfRecord({"num_warps": 8}, 1.0))
    with open(tmp_path / "norm.jsonl", "a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"key": _key().key, "config": {"num_warps": "eight"}}) + "\n")
    assert db.lookup(_key()) is None  # the last line for the key is unusable: no record
    assert "not JSON" in caplog.text


def test_default_db_follows_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    db = default_db()
    assert db is not None and db.root == tmp_path / "triton-perf-db"
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    assert default_db() is None


# ---- solvers --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("m", "n", "k", "dtype"),
    [(1, 4096, 4096, BF), (16, 6144, 4096, H), (2048, 28672, 4096, BF), (512, 512, 512, F)],
)
def test_matmul_candidates_are_bounded_and_fit(m: int, n: int, k: int, dtype: dt.DataType) -> None:
    match = match_graph(matmul_graph(m, n, k, dtype))
    solver = solver_for(match)
    candidates = solver.candidates(match, H200, {})
    assert 2 <= len(candidates) <= MAX_CANDIDATES
    assert candidates[0] == solver.default(match, H200)
    for config in candidates:
        assert solver.check(config, match, H200) is None
    assert len({tuple(sorted(c.items())) for c in candidates}) == len(candidates)


def test_matmul_shared_memory_and_register_constraints() -> None:
    match = match_graph(matmul_graph(2048, 2048, 2048, BF))
    solver = MatmulSolver()
    big = {
        "block_m": 256,
        "block_n": 256,
        "block_k": 128,
        "num_warps": 8,
        "num_stages": 4,
        "group_m": 8,
        "split_k": 1,
    }
    violation = solver.check(big, match, H200)
    assert violation is not None and "shared memory" in violation.reason
    assert "num_stages" in violation.knobs
    spill = dict(big, block_k=32, num_stages=2, num_warps=4)
    violation = solver.check(spill, match, H200)
    assert violation is not None and "per thread" in violation.reason
    assert solver.check(dict(spill, num_warps=16), match, H200) is None
    # a smaller device (48 KiB per block) prunes configs an H200 keeps
    small = DeviceLimits(smem_per_block=48 * 1024, sm_count=80)
    kept = solver.candidates(match, small, {})
    assert kept and len(kept) < len(solver.candidates(match, H200, {}))
    for config in kept:
        smem = config["num_stages"] * (config["block_m"] + config["block_n"]) * config["block_k"]
        assert smem * 2 <= 48 * 1024


def test_decode_default_uses_split_k_and_workspace_limit_prunes_it() -> None:
    match = match_graph(matmul_graph(1, 4096, 4096, BF, ("bias",)))
    solver = MatmulSolver()
    default = solver.default(match, H200)
    assert default["split_k"] > 1
    assert solver.workspace_bytes(default, match) == default["split_k"] * 4096 * 4
    no_ws = solver.candidates(match, H200, {}, workspace_limit=0)
    assert no_ws and all(c["split_k"] == 1 for c in no_ws)
    too_many = dict(default, split_k=32, block_k=256)
    violation = solver.check(too_many, match, H200)
    assert violation is not None and violation.knobs[0] == "split_k"


def test_pins_restrict_the_search() -> None:
    match = match_graph(matmul_graph(256, 256, 256, H))
    solver = MatmulSolver()
    pinned = solver.candidates(match, H200, {"block_k": 32, "num_warps": 4})
    assert pinned and all(c["block_k"] == 32 and c["num_warps"] == 4 for c in pinned)


def test_norm_constraints_and_space() -> None:
    solver = NormSolver()
    wide = match_graph(norm_graph("rms", [4096], 8192))
    default = solver.default(wide, H200)
    assert default["block_n"] == 8192 and solver.check(default, wide, H200) is None
    candidates = solver.candidates(wide, H200, {})
    assert 2 <= len(candidates) <= MAX_CANDIDATES
    assert {c["num_warps"] for c in candidates} >= {4, 8, 16}
    assert all(c["block_m"] * c["block_n"] <= 64 * 32 * c["num_warps"] for c in candidates)
    violation = solver.check({"block_m": 4, "block_n": 8192, "num_warps": 1}, wide, H200)
    assert violation is not None and "num_warps" in violation.knobs
    huge = match_graph(norm_graph("ln", [4], 100_000))
    assert solver.default(huge, H200)["block_n"] < 100_000  # walked in chunks


def test_pointwise_solver() -> None:
    match = match_graph(pointwise_graph([1000, 33]))
    solver = PointwiseSolver()
    assert solver.check(solver.default(match, H200), match, H200) is None
    assert solver.check({"block_n": 16384, "num_warps": 1}, match, H200) is not None


# ---- patterns -------------------------------------------------------------------------------
def test_matmul_bias_gelu_matches() -> None:
    match = match_graph(matmul_graph(32, 96, 64, H, ("bias", "gelu", "res")))
    assert isinstance(match, MatmulMatch)
    assert (match.batch, match.m, match.n, match.k) == (1, 32, 96, 64)
    ops = [op.mode for op in match.epilogue.ops]
    assert ops == [dt.PointwiseMode.ADD, dt.PointwiseMode.GELU_FWD, dt.PointwiseMode.ADD]
    bias, res = match.epilogue.inputs
    assert bias.strides == (0, 0, 1)  # a row vector broadcast over M
    assert res.strides == (0, 96, 1)
    assert [name for name, _ in match.epilogue.outputs] == ["v2"]


def test_batched_and_transposed_matmul_strides() -> None:
    match = match_graph(matmul_graph(8, 24, 16, BF, ("relu",), batch=3, b_transposed=True))
    assert isinstance(match, MatmulMatch)
    assert match.batch == 3
    assert match.a_strides == (8 * 16, 16, 1)
    assert match.b_strides == (16 * 24, 1, 16)


def test_conv_is_not_a_triton_graph() -> None:
    with pytest.raises(NotSupportedError, match="no Triton kernel for conv_fprop"):
        match_graph(conv_graph())


def test_unsupported_dtype_names_the_tensor() -> None:
    g = dt.Graph(io_data_type=dt.DataType.DOUBLE, compute_data_type=F)
    y = g.matmul(g.tensor("A", [4, 4]), g.tensor("B", [4, 4]))
    y.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="a_tensor_uid: data type double"):
        match_graph(g)


def test_matmul_prologue_does_not_fuse() -> None:
    g = dt.Graph(io_data_type=H, compute_data_type=F, intermediate_data_type=F)
    a = g.pointwise(g.tensor("A", [16, 16]), mode=dt.PointwiseMode.RELU_FWD)
    y = g.matmul(a, g.tensor("B", [16, 16]))
    y.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="prologue"):
        match_graph(g)


def test_norm_matches_and_needs_contiguous_rows() -> None:
    match = match_graph(norm_graph("ln", [2, 3], 50, training=True))
    assert isinstance(match, NormMatch)
    assert (match.rows, match.n) == (6, 50)
    assert match.mean is not None and match.rstd is not None
    assert match.epsilon == pytest.approx(1e-5)
    g = dt.Graph(io_data_type=BF, compute_data_type=F)
    x = g.tensor("X", [64, 32], strides=[1, 64])
    y = g.rmsnorm(x, g.tensor("W", [1, 32]), 1e-6)[0]
    y.set_output(True)
    g.validate()
    with pytest.raises(NotSupportedError, match="contiguous"):
        match_graph(g)


def test_reduction_matches_last_dim_only() -> None:
    match = match_graph(reduction_graph(7, 100, dt.ReductionMode.AVG))
    assert isinstance(match, ReductionMatch) and (match.rows, match.n) == (7, 100)
    with pytest.raises(NotSupportedError, match="last dim"):
        match_graph(reduction_graph(7, 100, dt.ReductionMode.ADD, axis=0))
    with pytest.raises(NotSupportedError, match="mul is not supported"):
        match_graph(reduction_graph(7, 100, dt.ReductionMode.MUL))


def test_pointwise_chain_matches_and_coalesces() -> None:
    match = match_graph(pointwise_graph([6, 7, 9]))
    assert isinstance(match, PointwiseMatch)
    assert match.expr.space == (42, 9)  # the two leading dims walk contiguously everywhere
    assert len(match.expr.outputs) == 2
    assert coalesce([2, 3, 4], [[12, 4, 1], [0, 0, 1]]) == ([6, 4], [[4, 1], [0, 1]])
    assert coalesce([1, 5], [[5, 1]]) == ([5], [[1]])


# ---- generated source -----------------------------------------------------------------------
def test_generated_sources_parse() -> None:
    for g in (
        matmul_graph(1, 100, 300, BF, ("bias", "silu", "scale", "res")),
        matmul_graph(8, 24, 16, F, ("relu",), batch=3, b_transposed=True),
    ):
        match = match_graph(g)
        assert isinstance(match, MatmulMatch)
        text = matmul_kernel.source(match)
        ast.parse(text)
        assert "def mm_kernel" in text and "def reduce_kernel" in text
    fp32 = match_graph(matmul_graph(8, 8, 8, F, ()))
    assert isinstance(fp32, MatmulMatch)
    assert 'input_precision="ieee"' in matmul_kernel.source(fp32)
    pw = match_graph(pointwise_graph([6, 7, 9]))
    assert isinstance(pw, PointwiseMatch)
    ast.parse(pointwise_kernel.source(pw))


@pytest.mark.parametrize("mode", list(dt.PointwiseMode))
def test_every_pointwise_mode_has_a_lowering(mode: dt.PointwiseMode) -> None:
    args = ("in0", "in1", "in2")[: mode.arity]
    lines = emit_ops([ExprOp(mode, "v0", args)])
    ast.parse("\n".join(line.strip() for line in lines))


def test_literals() -> None:
    assert literal(float("inf")) == "1e999"
    assert literal(-2.5) == "(-2.5)"
    relu = ExprOp(dt.PointwiseMode.RELU_FWD, "v0", ("in0",), (("relu_upper_clip", 6.0),))
    assert "tl.minimum" in emit_ops([relu])[0]


# ---- the engine -----------------------------------------------------------------------------
def test_registry_lists_the_engine_not_applicable_on_cpu(cpu_handle: dt.Handle) -> None:
    engine = get_registry().get("TRITON_ENGINE")
    assert isinstance(engine, TritonEngine)
    g = norm_graph("rms", [16], 256)
    reason = get_registry().why_not(engine, g, cpu_handle)
    assert reason is not None and "cuda" in reason.lower()
    with pytest.raises(NotSupportedError, match="needs CUDA"):
        engine.check_support(g, cpu_handle)


def test_missing_triton_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a)
    )
    with pytest.raises(NotSupportedError, match=r"install dnntune\[triton\]"):
        TritonEngine().check_available()


def test_knobs_follow_the_matched_kernel() -> None:
    engine = TritonEngine()
    norm = {k.knob_id for k in engine.knobs(norm_graph("ln", [8], 256))}
    assert {"triton.block_m", "triton.block_n", "triton.num_warps"} <= norm
    assert "triton.block_k" not in norm and "triton.split_k" not in norm
    mm = {k.knob_id for k in engine.knobs(matmul_graph(64, 64, 64))}
    assert {"triton.block_k", "triton.num_stages", "triton.group_m", "triton.split_k"} <= mm
    everything = {k.knob_id for k in engine.knobs()}
    assert mm <= everything and norm <= everything


def test_validate_rejects_configs_that_cannot_fit() -> None:
    engine = TritonEngine()
    g = matmul_graph(2048, 2048, 2048, BF)
    bad = [
        KnobSetting("triton.block_m", 256),
        KnobSetting("triton.block_n", 256),
        KnobSetting("triton.block_k", 256),
        KnobSetting("triton.num_stages", 4),
    ]
    with pytest.raises(InvalidValueError, match=r"triton\.num_stages.*shared memory"):
        engine.validate_knobs(bad, g)
    engine.validate_knobs(
        [KnobSetting("triton.block_k", 64), KnobSetting("triton.num_stages", 3)], g
    )
    with pytest.raises(InvalidValueError, match=r"triton\.block_k"):
        engine.validate_knobs([KnobSetting("triton.block_k", 48)], g)  # not a valid value
    norm = norm_graph("rms", [64], 8192)
    with pytest.raises(InvalidValueError, match=r"triton\.num_warps"):
        engine.validate_knobs(
            [KnobSetting("triton.num_warps", 1), KnobSetting("triton.block_n", 8192)], norm
        )


def test_validate_workspace_limit_against_pinned_split_k() -> None:
    engine = TritonEngine()
    g = matmul_graph(1, 4096, 4096, BF)
    with pytest.raises(InvalidValueError, match=r"triton\.split_k=4 needs a workspace"):
        engine.validate_knobs(
            [KnobSetting("triton.split_k", 4), KnobSetting("global.workspace_size_limit", 1024)], g
        )


def test_workspace_estimate_covers_split_k_searches() -> None:
    engine = TritonEngine()
    g = matmul_graph(1, 4096, 4096, BF)
    search = engine.estimate_workspace_size(g, [KnobSetting("global.benchmarking", 1)])
    assert search >= 2 * 4096 * 4
    assert engine.estimate_workspace_size(g, [KnobSetting("triton.split_k", 1)]) == 0
    clean = engine.estimate_workspace_size(g, [KnobSetting("triton.tuning_policy", 5)])
    match = match_graph(g)
    assert clean == MatmulSolver().workspace_bytes(MatmulSolver().default(match, H200), match)
    limited = engine.estimate_workspace_size(
        g, [KnobSetting("global.benchmarking", 1), KnobSetting("global.workspace_size_limit", 0)]
    )
    assert limited == 0
    assert engine.estimate_workspace_size(norm_graph("ln", [4], 64), []) == 0


def test_an_empty_launch_hook_chain_is_no_hook() -> None:
    """Triton 3.6 keeps its launch hooks in a HookChain that is never None: an empty chain must
    not turn the direct launch off (issue 22, H200: 20 us per layernorm launch when it did)."""
    from types import SimpleNamespace

    from dnntune.providers.triton.kernels.launch import _hooked

    assert not _hooked(None)
    assert not _hooked(SimpleNamespace(calls=[]))
    assert _hooked(SimpleNamespace(calls=[print]))
    assert _hooked(print)  # an older Triton's plain hook
