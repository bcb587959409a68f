"""CUDNN_ENGINE on any machine: registration, applicability reasons, knobs, static support,
the lowering (against a recording fake of ``cudnn``), the plan choice and the find db."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune._version import __version__
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.providers.cudnn import CudnnEngine, _runtime
from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord, parse_engine_tag
from dnntune.providers.cudnn.lowering import lower_graph, uid_signature
from dnntune.providers.cudnn.selection import PlanTiming, select_plan
from dnntune.providers.cudnn.support import (
    TF32_NUMERIC_NOTES,
    excluded_numeric_notes,
    has_fp32_dot,
    unsupported_reason,
)
from dnntune.testing.graphs import small_conv_graph


@pytest.fixture
def engine() -> CudnnEngine:
    return CudnnEngine()


@pytest.fixture
def no_frontend(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import cudnn`` fails (as on a machine without nvidia-cudnn-frontend)."""
    monkeypatch.setitem(sys.modules, "cudnn", None)
    _runtime.reset_for_tests()
    yield
    _runtime.reset_for_tests()


def _conv_bias_relu(layout: str = "nhwc") -> dt.Graph:
    g = dt.Graph(
        name="cbr",
        io_data_type=dt.DataType.HALF,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    dims_x, dims_w = [2, 8, 6, 6], [16, 8, 3, 3]
    if layout == "nhwc":
        x = g.tensor(name="X", dims=dims_x, strides=[288, 1, 48, 8])
        w = g.tensor(name="W", dims=dims_w, strides=[72, 1, 24, 8])
    else:
        x = g.tensor(name="X", dims=dims_x)
        w = g.tensor(name="W", dims=dims_w)
    b = g.tensor(name="B", dims=[1, 16, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


# ---- registration and applicability ---------------------------------------------------------
def test_engine_is_registered_as_cudnn_provider() -> None:
    e = dt.get_registry().get("CUDNN_ENGINE")
    assert isinstance(e, CudnnEngine)
    assert e.provider == "cudnn"
    assert e.devices == ("cuda",)
    assert e.id == dt.engine_id("CUDNN_ENGINE")


def test_cpu_handle_is_declined_with_needs_cuda(engine: CudnnEngine) -> None:
    g = small_conv_graph()
    handle = dt.create_handle("cpu")
    with pytest.raises(NotSupportedError, match="needs CUDA"):
        engine.check_support(g, handle)
    with pytest.raises(NotSupportedError, match="needs CUDA"):
        engine.compile(g, (), handle)


def test_missing_frontend_gives_install_hint(engine: CudnnEngine, no_frontend: None) -> None:
    with pytest.raises(NotSupportedError, match=r"install dnntune\[cudnn\]"):
        engine.check_available()
    # the reason stays the same on the second ask (the failed import is remembered)
    with pytest.raises(NotSupportedError, match="nvidia-cudnn-frontend"):
        engine.check_available()


def test_missing_frontend_reason_reaches_the_registry(no_frontend: None) -> None:
    class _CudaLike:
        is_cuda = True

        class device:
            type = "cuda"
            index = 0

    reason = dt.get_registry().why_not(CudnnEngine(), small_conv_graph(), _CudaLike())  # type: ignore[arg-type]
    assert reason is not None and "install dnntune[cudnn]" in reason


def test_importing_the_provider_does_not_import_cudnn() -> None:
    code = (
        "import sys, dnntune as dt\n"
        "import dnntune.providers.cudnn as p\n"
        "dt.get_registry().engines()\n"
        "p.CudnnEngine().knobs()\n"
        "assert 'cudnn' not in sys.modules, 'cudnn imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- knobs ----------------------------------------------------------------------------------
def test_knobs_and_defaults(engine: CudnnEngine) -> None:
    knobs = {k.knob_id: k for k in engine.knobs()}
    assert set(knobs) == {
        "cudnn.heur_mode",
        "cudnn.engine_config",
        "cudnn.allow_tf32",
        "global.workspace_size_limit",
        "global.benchmarking",
    }
    assert knobs["cudnn.heur_mode"].default_value == "a"
    assert knobs["cudnn.engine_config"].default_value == -1
    assert knobs["cudnn.allow_tf32"].default_value == 0
    assert knobs["global.benchmarking"].default_value == 0
    assert engine.supports_exhaustive()


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("cudnn.heur_mode", "c", "allowed values"),
        ("cudnn.heur_mode", 1, "expected a string"),
        ("cudnn.engine_config", -2, "allowed range"),
        ("cudnn.engine_config", "0", "expected a int"),
        ("cudnn.allow_tf32", 2, "allowed range"),
        ("cudnn.allow_tf32", -1, "allowed range"),
        ("cudnn.allow_tf32", "1", "expected a int"),
        ("global.benchmarking", 2, "allowed range"),
        ("global.workspace_size_limit", -1, "allowed range"),
        ("cudnn.tile", 1, "unknown knob"),
    ],
)
def test_bad_knob_values_are_refused(
    engine: CudnnEngine, knob: str, value: Any, message: str
) -> None:
    with pytest.raises(InvalidValueError, match=message):
        engine.validate_knobs([KnobSetting(knob, value)])


def test_good_knob_values_pass(engine: CudnnEngine) -> None:
    engine.validate_knobs(
        [
            KnobSetting("cudnn.heur_mode", "fallback"),
            KnobSetting("cudnn.engine_config", 7),
            KnobSetting("cudnn.allow_tf32", 1),
            KnobSetting("global.benchmarking", 1),
            KnobSetting("global.workspace_size_limit", 0),
        ]
    )


def test_knobs_for_a_graph_without_gpu_keep_an_open_bound(engine: CudnnEngine) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the bound is the graph's plan count on a GPU (tested in test_cudnn_gpu)")
    knob = {k.knob_id: k for k in engine.knobs(small_conv_graph())}["cudnn.engine_config"]
    knob.validate(KnobSetting("cudnn.engine_config", 40), engine.name)


def test_force_benchmarking_overrides_the_knob(
    engine: CudnnEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "1")
    assert engine._values(())["global.benchmarking"] is True
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "off")
    assert engine._values([KnobSetting("global.benchmarking", 1)])["global.benchmarking"] is False
    monkeypatch.delenv("DNNTUNE_FORCE_BENCHMARKING")
    assert engine._values([KnobSetting("global.benchmarking", 1)])["global.benchmarking"] is True


# ---- static support -------------------------------------------------------------------------
def test_conv_bias_relu_is_statically_supported() -> None:
    assert unsupported_reason(_conv_bias_relu()) is None


def _squeeze_excitation(side: int, act: dt.PointwiseMode | None, bias: bool = True) -> dt.Graph:
    """A squeeze-excitation block's 1x1 convolution over a ``side`` x ``side`` map."""
    g = dt.Graph(
        name="se",
        io_data_type=dt.DataType.BFLOAT16,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[2, 16, side, side])
    w = g.tensor(name="W", dims=[32, 16, 1, 1])
    y = g.conv_fprop(x, w)
    if bias:
        y = g.pointwise(y, g.tensor(name="B", dims=[1, 32, 1, 1]), mode=dt.PointwiseMode.ADD)
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def test_a_convolution_to_one_pixel_with_an_activation_is_declined() -> None:
    """Every cuDNN 9.19 plan returned NaN or zeros for the squeeze-excitation block's 1x1
    convolution over its pooled 1x1 map with an activation (H100, session 39); over a 2x2 map,
    or with a bias alone, cuDNN runs it."""
    for act in (
        dt.PointwiseMode.SIGMOID_FWD,
        dt.PointwiseMode.SWISH_FWD,
        dt.PointwiseMode.RELU_FWD,
    ):
        for bias in (True, False):
            reason = unsupported_reason(_squeeze_excitation(1, act, bias)) or ""
            assert "1x1 output" in reason and act.name in reason, reason
    assert unsupported_reason(_squeeze_excitation(2, dt.PointwiseMode.SIGMOID_FWD)) is None
    assert unsupported_reason(_squeeze_excitation(1, None)) is None
    assert unsupported_reason(_squeeze_excitation(1, None, bias=False)) is None


def test_unsupported_op_kind_is_named() -> None:
    g = dt.Graph(name="pool", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[1, 2, 4, 4])
    y = g.resample(x, mode=dt.ResampleMode.MAXPOOL, window=2)
    y.set_output(True)
    g.validate()
    reason = unsupported_reason(g)
    assert reason is not None and "resample_fwd" in reason


def test_reductions_of_other_layouts_are_declined() -> None:
    """cuDNN 9.19 wrote out of bounds on a column-major amax (H200 conformance sweep)."""

    def amax(strides: list[int]) -> dt.Graph:
        g = dt.Graph(name="amax", io_data_type=dt.DataType.FLOAT)
        x = g.tensor(name="X", dims=[64, 32], strides=strides)
        y = g.reduction(x, mode=dt.ReductionMode.AMAX, axes=[0])
        y.set_output(True)
        g.validate()
        return g

    assert unsupported_reason(amax([32, 1])) is None
    reason = unsupported_reason(amax([1, 64])) or ""
    assert "packed row-major" in reason and "[1, 64]" in reason


def test_softplus_beta_and_boolean_masks_are_declined() -> None:
    g = dt.Graph(name="sp", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[4, 4])
    y = g.pointwise(x, mode=dt.PointwiseMode.SOFTPLUS_FWD, softplus_beta=2.0)
    y.set_output(True)
    g.validate()
    assert "softplus_beta" in (unsupported_reason(g) or "")

    g = dt.Graph(name="att", io_data_type=dt.DataType.HALF, compute_data_type=dt.DataType.FLOAT)
    q = g.tensor(name="Q", dims=[1, 2, 8, 16])
    k = g.tensor(name="K", dims=[1, 2, 8, 16])
    v = g.tensor(name="V", dims=[1, 2, 8, 16])
    m = g.tensor(name="M", dims=[1, 1, 8, 8], data_type=dt.DataType.BOOLEAN)
    (o,) = g.sdpa(q, k, v, attn_mask=m)
    o.set_output(True)
    g.validate()
    assert "boolean" in (unsupported_reason(g) or "")

    g = dt.Graph(name="att32", io_data_type=dt.DataType.FLOAT)
    q = g.tensor(name="Q", dims=[1, 2, 8, 16])
    (o,) = g.sdpa(q, q, q)
    o.set_output(True)
    g.validate()
    assert "fp16, bf16" in (unsupported_reason(g) or "")


def test_norm_on_strided_input_is_declined() -> None:
    g = dt.Graph(name="ln", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[8, 16], strides=[1, 8])
    s = g.tensor(name="S", dims=[1, 16])
    b = g.tensor(name="B", dims=[1, 16])
    (y,) = g.layernorm(x, s, b)
    y.set_output(True)
    g.validate()
    assert "row-major" in (unsupported_reason(g) or "")


# ---- lowering, against a recording fake of the cudnn module ---------------------------------
class _FakeTensor:
    def __init__(self, graph: _FakePyGraph, **attrs: Any) -> None:
        self.attrs = dict(attrs)
        graph.created.append(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("set_"):
            key = name[4:]

            def setter(value: Any) -> _FakeTensor:
                self.attrs[key] = value
                return self

            return setter
        raise AttributeError(name)


class _FakePyGraph:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.created: list[_FakeTensor] = []

    def tensor(self, **kwargs: Any) -> _FakeTensor:
        return _FakeTensor(self, **kwargs)

    def __getattr__(self, name: str) -> Any:
        def op(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name in ("sdpa", "layernorm"):
                return [
                    _FakeTensor(self, op=name, out=i)
                    for i in range(3 if name == "layernorm" else 2)
                ]
            if name == "rmsnorm":
                return [_FakeTensor(self, op=name, out=0), _FakeTensor(self, op=name, out=1)]
            return _FakeTensor(self, op=name)

        return op


class _Names:
    def __getattr__(self, name: str) -> str:
        return name


def _fake_cudnn() -> Any:
    names = _Names()
    return types.SimpleNamespace(
        pygraph=_FakePyGraph,
        data_type=names,
        reduction_mode=names,
        norm_forward_phase=names,
        diagonal_alignment=names,
        heur_mode=names,
        _compiled_module=types.SimpleNamespace(convolution_mode=names),
    )


def test_lowering_keeps_uids_and_pads_matmul_epilogue_ranks() -> None:
    g = dt.Graph(
        name="mm",
        io_data_type=dt.DataType.HALF,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    a = g.tensor(name="A", dims=[32, 64])
    b = g.tensor(name="B", dims=[64, 48])
    bias = g.tensor(name="BIAS", dims=[48])
    c = g.matmul(a, b)
    c = g.pointwise(c, bias, mode=dt.PointwiseMode.ADD)
    c = g.pointwise(c, mode=dt.PointwiseMode.GELU_FWD)
    c.set_output(True).set_name("C")
    g.validate()
    low = lower_graph(_fake_cudnn(), g, handle=7)
    fake: _FakePyGraph = low.graph
    assert fake.kwargs["handle"] == 7 and fake.kwargs["io_data_type"] == "HALF"
    assert [name for name, _, _ in fake.calls] == ["matmul", "add", "gelu"]
    by_name = {t.attrs.get("name"): t.attrs for t in fake.created if "dim" in t.attrs}
    assert by_name["A"]["dim"] == [1, 32, 64] and by_name["A"]["stride"] == [2048, 64, 1]
    assert by_name["BIAS"]["dim"] == [1, 1, 48]
    assert by_name["A"]["uid"] == a.uid and by_name["BIAS"]["uid"] == bias.uid
    out = [t.attrs for t in fake.created if t.attrs.get("output")]
    assert len(out) == 1 and out[0]["uid"] == c.uid
    assert out[0]["dim"] == [1, 32, 48] and out[0]["stride"] == [1536, 48, 1]
    assert set(low.io_uids) == {a.uid, b.uid, bias.uid, c.uid}
    assert low.scalars == {}


def test_lowering_passes_scalars_by_value_and_flattens_rows_for_layernorm() -> None:
    g = dt.Graph(name="ln", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[4, 8, 16])
    s = g.tensor(name="S", dims=[1, 1, 16])
    b = g.tensor(name="B", dims=[1, 1, 16])
    (y,) = g.layernorm(x, s, b, epsilon=1e-3, normalized_dim_count=1)
    y.set_output(True)
    g.validate()
    low = lower_graph(_fake_cudnn(), g, handle=0)
    fake: _FakePyGraph = low.graph
    by_name = {t.attrs.get("name"): t.attrs for t in fake.created if "dim" in t.attrs}
    assert by_name["X"]["dim"] == [32, 16, 1, 1]
    assert by_name["S"]["dim"] == [1, 16, 1, 1]
    eps = next(t for t in by_name.values() if t.get("is_pass_by_value"))
    assert eps["dim"] == [1, 1, 1, 1]
    (value,) = low.scalars.values()
    assert value.item() == pytest.approx(1e-3)
    assert set(low.scalar_pointers()) == set(low.scalars)


def test_lowering_sdpa_sets_pytorch_default_scale_and_causal_band() -> None:
    g = dt.Graph(name="att", io_data_type=dt.DataType.HALF, compute_data_type=dt.DataType.FLOAT)
    q = g.tensor(name="Q", dims=[1, 4, 8, 64])
    k = g.tensor(name="K", dims=[1, 2, 8, 64])
    v = g.tensor(name="V", dims=[1, 2, 8, 64])
    (o,) = g.sdpa(q, k, v, causal_mask=True)
    o.set_output(True)
    g.validate()
    fake: _FakePyGraph = lower_graph(_fake_cudnn(), g, handle=0).graph
    (name, _, kwargs) = fake.calls[0]
    assert name == "sdpa"
    assert kwargs["attn_scale"] == pytest.approx(0.125)
    assert kwargs["diagonal_alignment"] == "TOP_LEFT" and kwargs["diagonal_band_right_bound"] == 0
    assert kwargs["generate_stats"] is False


def test_uid_signature_tells_renumbered_graphs_apart() -> None:
    g1, g2 = _conv_bias_relu(), _conv_bias_relu()
    assert g1.key() == g2.key()
    assert uid_signature(g1) == uid_signature(g2)
    g2.tensors[0].uid = 1000
    assert g1.key() == g2.key() and uid_signature(g1) != uid_signature(g2)


# ---- plan choice (pure logic with a fake plan source and search) ----------------------------
class _FakeSource:
    """Plans with names, workspaces and (optionally) build failures."""

    def __init__(self, plans: Sequence[tuple[str, int]], broken: Sequence[int] = ()) -> None:
        self.plans = list(plans)
        self.broken = set(broken)
        self.builds: list[int] = []

    @property
    def candidates(self) -> list[int]:
        return list(range(len(self.plans)))

    def build(self, index: int) -> int:
        self.builds.append(index)
        if index in self.broken:
            raise NotSupportedError(f"plan {index} broken")
        return self.plans[index][1]

    def name_at(self, index: int) -> str:
        return self.plans[index][0]


class _FakeSearch:
    def __init__(self, times_ms: dict[int, float], failing: Sequence[int] = ()) -> None:
        self.times_ms = times_ms
        self.failing = set(failing)
        self.calls = 0
        self.timed: list[int] = []

    def __call__(self, candidates: Sequence[tuple[int, int]]) -> list[PlanTiming]:
        self.calls += 1
        out = []
        for index, ws in candidates:
            self.timed.append(index)
            t = PlanTiming(index, f"eng{index}_k2={index}", ws)
            if index in self.failing:
                t.error = "launch failed"
            else:
                t.median_ms = self.times_ms[index]
                t.samples_ms = [self.times_ms[index]]
            out.append(t)
        return out


_PLANS = [("eng0_k2=0", 0), ("eng1_k2=1", 4096), ("eng2_k2=2", 1 << 30), ("eng3_k2=3", 256)]
_TIMES = {0: 1.0, 1: 0.5, 2: 0.1, 3: 0.7}


def _key(**changes: Any) -> FindDbKey:
    fields: dict[str, Any] = dict(
        graph_key="g" * 32,
        device_key="dev0",
        cudnn_backend=91900,
        cudnn_frontend="1.16.0",
        heur_mode="a",
        workspace_limit=1 << 20,
    )
    fields.update(changes)
    return FindDbKey(**fields)


def _select(source: _FakeSource, search: _FakeSearch, db: FindDb | None, **kw: Any) -> Any:
    args: dict[str, Any] = dict(engine_config=-1, benchmarking=False, workspace_limit=1 << 20)
    args.update(kw)
    return select_plan(
        source, db=db, key=_key(workspace_limit=args["workspace_limit"]), search=search, **args
    )


def test_engine_config_picks_the_ith_plan_and_checks_range_and_workspace() -> None:
    source, search = _FakeSource(_PLANS), _FakeSearch(_TIMES)
    chosen = _select(source, search, None, engine_config=3)
    assert (chosen.index, chosen.workspace_bytes, chosen.how) == (3, 256, "engine_config")
    with pytest.raises(InvalidValueError, match=r"offers 4 plan\(s\)"):
        _select(source, search, None, engine_config=4)
    with pytest.raises(NotSupportedError, match="workspace_size_limit"):
        _select(source, search, None, engine_config=2)
    assert search.calls == 0


def test_heuristic_takes_the_first_plan_that_builds_within_the_limit() -> None:
    source = _FakeSource(_PLANS, broken=[0])
    chosen = _select(source, _FakeSearch(_TIMES), None, workspace_limit=1024)
    assert (chosen.index, chosen.how, chosen.find_db) == (3, "heuristic", "disabled")
    with pytest.raises(NotSupportedError, match="no cuDNN plan builds"):
        _select(source, _FakeSearch(_TIMES), None, workspace_limit=100)


def test_search_keeps_the_fastest_within_the_limit_and_records_it(tmp_path: Path) -> None:
    db = FindDb(tmp_path)
    source, search = _FakeSource(_PLANS), _FakeSearch(_TIMES)
    chosen = _select(source, search, db, benchmarking=True)
    # plan 2 is fastest but needs 1 GiB; the limit is 1 MiB
    assert (chosen.index, chosen.how, chosen.find_db) == (1, "search", "written")
    assert search.timed == [0, 1, 3]
    record = db.lookup(_key())
    assert record is not None and record.plan_name == "eng1_k2=1" and record.plan_index == 1
    assert record.cudnn_engine_id == 1 and record.cudnn_knobs == {"k2": 1}
    assert record.median_time_ms == 0.5 and record.plans_timed == 3


def test_only_a_search_builds_every_plan_ahead(tmp_path: Path) -> None:
    """cuDNN's search builds every candidate: it asks for them ahead (worker processes build
    runtime-compiled plans there); a pinned config, the heuristic and a find-db hit do not."""
    asked: list[list[int]] = []

    def ahead(indices: Sequence[int]) -> None:
        asked.append(list(indices))

    db = FindDb(tmp_path)
    _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), db, engine_config=1, build_ahead=ahead)
    _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), None, build_ahead=ahead)
    assert asked == []
    _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), db, benchmarking=True, build_ahead=ahead)
    assert asked == [[0, 1, 2, 3]]
    _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), db, build_ahead=ahead)  # a find-db hit
    assert asked == [[0, 1, 2, 3]]


def test_find_db_round_trip_reuses_the_winner_without_timing(tmp_path: Path) -> None:
    db = FindDb(tmp_path)
    first = _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), db, benchmarking=True)
    search = _FakeSearch(_TIMES)
    second = _select(_FakeSource(_PLANS), search, db)
    assert (second.index, second.how, second.find_db) == (first.index, "find_db", "hit")
    assert second.median_time_ms == 0.5
    assert search.calls == 0
    # another heuristic mode or workspace limit is another problem: a miss
    other = select_plan(
        _FakeSource(_PLANS),
        engine_config=-1,
        benchmarking=False,
        workspace_limit=1 << 20,
        db=db,
        key=_key(heur_mode="b"),
        search=search,
    )
    assert (other.index, other.find_db) == (0, "miss")


def test_find_db_record_that_no_longer_applies_is_stale(tmp_path: Path) -> None:
    db = FindDb(tmp_path)
    db.record(
        _key(),
        FindDbRecord(plan_name="eng9_k2=9", plan_index=9, workspace_bytes=0, median_time_ms=0.1),
    )
    chosen = _select(_FakeSource(_PLANS), _FakeSearch(_TIMES), db)
    assert (chosen.index, chosen.how, chosen.find_db) == (0, "heuristic", "stale")
    db.record(
        _key(),
        FindDbRecord(plan_name="eng0_k2=0", plan_index=0, workspace_bytes=0, median_time_ms=0.1),
    )
    chosen = _select(_FakeSource(_PLANS, broken=[0]), _FakeSearch(_TIMES), db)
    assert (chosen.index, chosen.find_db) == (1, "stale")


def test_search_where_every_plan_fails_is_not_supported(tmp_path: Path) -> None:
    with pytest.raises(NotSupportedError, match="failed during the search"):
        _select(
            _FakeSource(_PLANS),
            _FakeSearch(_TIMES, failing=[0, 1, 2, 3]),
            FindDb(tmp_path),
            benchmarking=True,
        )
    assert FindDb(tmp_path).lookup(_key()) is None


def test_search_prefers_cudnns_order_within_two_percent_and_the_final_round() -> None:
    def search(candidates: Sequence[tuple[int, int]]) -> list[PlanTiming]:
        out = [
            PlanTiming(i, f"eng{i}", ws, median_ms=ms, samples_ms=[ms])
            for (i, ws), ms in zip(candidates, [1.01, 0.2, 1.0, 1.1], strict=True)
        ]
        out[1].round = 1  # fastest in screening, but not re-timed in the final round
        for t in (out[0], out[2], out[3]):
            t.round = 2
        return out

    plans = [("eng0", 0), ("eng1", 0), ("eng2", 0), ("eng3", 0)]
    chosen = select_plan(
        _FakeSource(plans),
        engine_config=-1,
        benchmarking=True,
        workspace_limit=1 << 20,
        db=None,
        key=None,
        search=search,
    )
    # plan 0 is within 2% of the final round's fastest (plan 2) and cuDNN ranks it first
    assert (chosen.index, chosen.median_time_ms) == (0, 1.01)


def test_search_without_find_db_still_chooses() -> None:
    chosen = _select(_FakeSource(_PLANS), _FakeSearch(_TIMES, failing=[1]), None, benchmarking=True)
    assert (chosen.index, chosen.find_db) == (3, "disabled")
    assert [t.ok for t in chosen.timings] == [True, False, True]


# ---- the find db file -----------------------------------------------------------------------
def test_find_db_default_location_and_kill_switch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    db = FindDb.default()
    assert db is not None
    assert db.path_for(_key()) == tmp_path / "cudnn-find-db" / __version__ / "dev0.jsonl"
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    assert FindDb.default() is None


def test_find_db_last_line_wins_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    db = FindDb(tmp_path)
    assert db.lookup(_key()) is None
    for i in range(3):
        assert db.record(
            _key(),
            FindDbRecord(
                plan_name=f"eng{i}", plan_index=i, workspace_bytes=i, median_time_ms=float(i)
            ),
        )
    db.record(
        _key(heur_mode="fallback"),
        FindDbRecord(plan_name="engX", plan_index=5, workspace_bytes=0, median_time_ms=1.0),
    )
    path = db.path_for(_key())
    with path.open("a") as f:
        f.write('{"key": "' + _key().digest() + '", "value": {"plan_na\n')
        f.write("not json at all\n")
    record = db.lookup(_key())
    assert record is not None and record.plan_name == "eng2" and record.timestamp
    lines = path.read_text().splitlines()
    entry = json.loads(lines[0])
    assert entry["problem"]["cudnn_backend"] == 91900 and entry["key"] == _key().digest()
    other = db.lookup(_key(heur_mode="fallback"))
    assert other is not None and other.plan_index == 5


def test_find_db_write_failure_is_soft(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    db = FindDb(blocker / "sub")
    assert db.record(_key(), FindDbRecord("eng0", 0, 0, 1.0)) is False
    assert db.lookup(_key()) is None


def test_find_db_key_covers_every_field() -> None:
    base = _key()
    for change in (
        {"graph_key": "h" * 32},
        {"device_key": "dev1"},
        {"cudnn_backend": 91000},
        {"cudnn_frontend": "1.17.0"},
        {"heur_mode": "b"},
        {"workspace_limit": 0},
    ):
        assert _key(**change).digest() != base.digest()


def test_parse_engine_tag() -> None:
    assert parse_engine_tag("eng28_k2=3_k3=0_k14=-1") == (28, {"k2": 3, "k3": 0, "k14": -1})
    assert parse_engine_tag("sm90_xmma_whatever") == (None, {})


# ---- cudnn.allow_tf32: float32 convolutions and matmuls without TF32 ------------------------
def _fp32_conv(dtype: dt.DataType = dt.DataType.FLOAT) -> dt.Graph:
    g = dt.Graph(name="conv", io_data_type=dtype, compute_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[2, 8, 6, 6])
    w = g.tensor(name="W", dims=[16, 8, 3, 3])
    y = g.conv_fprop(x, w, padding=1)
    y.set_output(True)
    g.validate()
    return g


def _matmul(dtype: dt.DataType) -> dt.Graph:
    g = dt.Graph(name="mm", io_data_type=dtype, compute_data_type=dt.DataType.FLOAT)
    c = g.matmul(g.tensor(name="A", dims=[32, 64]), g.tensor(name="B", dims=[64, 48]))
    c.set_output(True)
    g.validate()
    return g


def _fp32_layernorm() -> dt.Graph:
    g = dt.Graph(name="ln", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[4, 16])
    (y,) = g.layernorm(x, g.tensor(name="S", dims=[1, 16]), g.tensor(name="B", dims=[1, 16]), 1e-5)
    y.set_output(True)
    g.validate()
    return g


@pytest.mark.parametrize(
    ("make", "excluded"),
    [
        (_fp32_conv, TF32_NUMERIC_NOTES),
        (lambda: _matmul(dt.DataType.FLOAT), TF32_NUMERIC_NOTES),
        (lambda: _fp32_conv(dt.DataType.HALF), ()),  # fp16 needs its tensor cores
        (lambda: _matmul(dt.DataType.BFLOAT16), ()),
        (_conv_bias_relu, ()),
        (_fp32_layernorm, ()),  # no dot product, nothing for TF32 to round
    ],
)
def test_tf32_is_deselected_only_for_float32_dot_products(
    make: Any, excluded: tuple[str, ...]
) -> None:
    g = make()
    assert excluded_numeric_notes(g, allow_tf32=False) == excluded
    assert excluded_numeric_notes(g, allow_tf32=True) == ()
    assert has_fp32_dot(g) is bool(excluded)


def test_allow_tf32_knob_is_offered_where_tf32_matters(engine: CudnnEngine) -> None:
    def offered(g: dt.Graph) -> bool:
        return "cudnn.allow_tf32" in {k.knob_id for k in engine.knobs(g)}

    assert offered(_fp32_conv()) and offered(_matmul(dt.DataType.FLOAT))
    assert not offered(_conv_bias_relu()) and not offered(_fp32_layernorm())
    with pytest.raises(InvalidValueError, match=r"knob 'cudnn\.allow_tf32' does not apply"):
        engine.validate_knobs([KnobSetting("cudnn.allow_tf32", 1)], _conv_bias_relu())
    engine.validate_knobs([KnobSetting("cudnn.allow_tf32", 1)], _fp32_conv())


def test_allow_tf32_knob_decides_the_deselection(engine: CudnnEngine) -> None:
    g = _fp32_conv()
    assert engine._excluded_notes(g, engine._values(())) == TF32_NUMERIC_NOTES
    on = engine._values([KnobSetting("cudnn.allow_tf32", 1)])
    assert engine._excluded_notes(g, on) == ()
    assert engine._excluded_notes(_conv_bias_relu(), engine._values(())) == ()


class _PlanningPyGraph(_FakePyGraph):
    """The recording fake, plus the heuristics calls a CudnnProblem makes."""

    #: check_support fails once engine configs were deselected (only TF32 plans exist)
    only_tf32 = False

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args, {}))

    def validate(self) -> None:
        self._record("validate")

    def build_operation_graph(self) -> None:
        self._record("build_operation_graph")

    def create_execution_plans(self, modes: list[Any]) -> None:
        self._record("create_execution_plans", list(modes))

    def deselect_numeric_notes(self, notes: list[Any]) -> None:
        self._record("deselect_numeric_notes", list(notes))

    def check_support(self) -> None:
        self._record("check_support")
        deselected = any(name == "deselect_numeric_notes" for name, _, _ in self.calls)
        if type(self).only_tf32 and deselected:
            raise RuntimeError("[cudnn_frontend] Error: No execution plans support the graph.")

    def get_execution_plan_count(self) -> int:
        return 2

    def get_plan_name_at_index(self, index: int) -> str:
        return f"eng{index}_k2=1"


@pytest.fixture
def fake_frontend(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """``cudnn`` is a recording fake with heuristics; no GPU, no cuDNN needed."""
    import contextlib

    import torch

    from dnntune.providers.cudnn import problem as problem_module

    fake = _fake_cudnn()
    fake.numerical_note = _Names()
    graphs: list[_PlanningPyGraph] = []

    def pygraph(**kwargs: Any) -> _PlanningPyGraph:
        graphs.append(_PlanningPyGraph(**kwargs))
        return graphs[-1]

    fake.pygraph = pygraph
    fake.graphs = graphs
    monkeypatch.setattr(_runtime, "_module", fake)
    monkeypatch.setattr(problem_module, "cudnn_handle", lambda device, stream: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_PlanningPyGraph, "only_tf32", False)
    problem_module.clear_problem_cache()
    yield fake
    problem_module.clear_problem_cache()


def _call_names(g: _PlanningPyGraph) -> list[str]:
    return [name for name, _, _ in g.calls if not name.startswith(("conv", "tensor"))]


def test_problem_deselects_tf32_between_heuristics_and_support_check(
    fake_frontend: types.SimpleNamespace,
) -> None:
    from dnntune.providers.cudnn.problem import get_problem

    g = _fp32_conv()
    exact = get_problem(g, 0, "a", TF32_NUMERIC_NOTES)
    (lowered,) = fake_frontend.graphs
    assert _call_names(lowered) == [
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "deselect_numeric_notes",
        "check_support",
    ]
    (args,) = [a for name, a, _ in lowered.calls if name == "deselect_numeric_notes"]
    assert args == (["TENSOR_CORE", "DOWN_CONVERT_INPUTS"],)
    assert exact.plan_facts(0)["cudnn_excluded_numeric_notes"] == list(TF32_NUMERIC_NOTES)
    # the same graph with TF32 allowed is another problem (the deselection changed the plans)
    tf32 = get_problem(g, 0, "a")
    assert tf32 is not exact and len(fake_frontend.graphs) == 2
    assert "deselect_numeric_notes" not in _call_names(fake_frontend.graphs[1])
    assert get_problem(g, 0, "a", TF32_NUMERIC_NOTES) is exact  # cached


def test_no_float32_plan_names_the_knob(fake_frontend: types.SimpleNamespace) -> None:
    from dnntune.providers.cudnn.problem import get_problem

    _PlanningPyGraph.only_tf32 = True
    with pytest.raises(NotSupportedError, match=r"set cudnn\.allow_tf32=1 to allow TF32"):
        get_problem(_fp32_conv(), 0, "a", TF32_NUMERIC_NOTES)
    assert get_problem(_fp32_conv(), 0, "a").candidates == (0, 1)  # TF32 allowed: it runs


def test_frontend_that_cannot_deselect_is_refused(fake_frontend: types.SimpleNamespace) -> None:
    from dnntune.providers.cudnn.problem import get_problem

    del fake_frontend.numerical_note
    with pytest.raises(NotSupportedError, match=r"cannot deselect.*cudnn\.allow_tf32=1"):
        get_problem(_fp32_conv(), 0, "a", TF32_NUMERIC_NOTES)


def test_find_db_key_tells_tf32_deselection_apart_and_keeps_older_keys() -> None:
    import hashlib

    base = _key()
    older = json.dumps(
        {f: v for f, v in asdict(base).items() if f != "excluded_numeric_notes"},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert base.digest() == hashlib.sha256(older.encode()).hexdigest()[:32]
    assert _key(excluded_numeric_notes=TF32_NUMERIC_NOTES).digest() != base.digest()


def test_fp32_matmul_is_declined_without_tf32(fake_frontend: types.SimpleNamespace) -> None:
    """cuDNN's fp32 matmul plans showed TF32-level error on the H200 even with the TF32 notes
    deselected: with cudnn.allow_tf32=0 the problem is declined before any frontend graph."""
    from dnntune.providers.cudnn.problem import get_problem

    with pytest.raises(NotSupportedError, match=r"cudnn\.allow_tf32=1"):
        get_problem(_matmul(dt.DataType.FLOAT), 0, "a", TF32_NUMERIC_NOTES)
    assert fake_frontend.graphs == []
    get_problem(_matmul(dt.DataType.FLOAT), 0, "a", ())  # TF32 allowed: built
    assert len(fake_frontend.graphs) == 1
    get_problem(_fp32_conv(), 0, "a", TF32_NUMERIC_NOTES)  # convs keep the deselection path


def test_engines_that_write_into_their_inputs_are_named_per_op() -> None:
    # issue 20: cuDNN 9.19's engine 5 overwrote rows of x for layernorm and rmsnorm forward
    from dnntune.providers.cudnn.support import clobbering_reason

    g = dt.Graph(name="ln", io_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[4, 768])
    s = g.tensor(name="S", dims=[1, 768])
    b = g.tensor(name="B", dims=[1, 768])
    (y,) = g.layernorm(x, s, b, epsilon=1e-5)
    y.set_output(True)
    g.validate()
    why = clobbering_reason(g, 5)
    assert why is not None and "writes into an input" in why and "layernorm" in why
    assert clobbering_reason(g, 6) is None
    assert clobbering_reason(g, None) is None
    assert clobbering_reason(_conv_bias_relu(), 5) is None


def test_engine_4_is_barred_for_the_layernorm_training_forward_only() -> None:
    # issue 20, session 8: cuDNN 9.19's engine 4 wrote into x of the layernorm TRAINING forward
    # (fp32, 6 shapes from 1x65536 to 4096x4096); its inference forward left x alone
    from dnntune.providers.cudnn.support import clobbering_reason

    def layernorm(phase: dt.NormFwdPhase) -> dt.Graph:
        g = dt.Graph(name="ln", io_data_type=dt.DataType.FLOAT)
        x = g.tensor(name="X", dims=[1, 65536])
        s = g.tensor(name="S", dims=[1, 65536])
        b = g.tensor(name="B", dims=[1, 65536])
        for out in g.layernorm(x, s, b, epsilon=1e-5, forward_phase=phase):
            out.set_output(True)
        g.validate()
        return g

    why = clobbering_reason(layernorm(dt.NormFwdPhase.TRAINING), 4)
    assert why is not None and "engine 4" in why and "layernorm training" in why
    assert clobbering_reason(layernorm(dt.NormFwdPhase.INFERENCE), 4) is None
    assert clobbering_reason(layernorm(dt.NormFwdPhase.TRAINING), 3) is None


def test_wrong_result_engines_are_refused_only_where_their_condition_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 20, session 9: a cuDNN engine gave wrong conv_wgrad results on inputs whose rows
    # are padded (c00561); such an entry bars the engine there and nowhere else
    from dnntune.graph.node import OpKind
    from dnntune.providers.cudnn import support

    bad = support.WrongResultEngine(
        OpKind.CONV_WGRAD, 7, support.padded_inputs, "on inputs whose rows are padded", "seen"
    )
    monkeypatch.setattr(support, "WRONG_RESULT_ENGINES", (bad,))

    def wgrad(pitch: int) -> dt.Graph:
        g = dt.Graph(name="wgrad", io_data_type=dt.DataType.HALF)
        strides = [64 * 56 * pitch, 56 * pitch, pitch, 1]
        dy = g.tensor(name="DY", dims=[2, 64, 56, 56], strides=strides)
        x = g.tensor(name="X", dims=[2, 64, 56, 56], strides=strides)
        dw = g.conv_wgrad(dy, x, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
        dw.set_dims([64, 64, 3, 3]).set_output(True)
        g.validate()
        return g

    padded, packed = wgrad(59), wgrad(56)
    assert any(support.padded_inputs(n) for n in padded.nodes)
    assert not any(support.padded_inputs(n) for n in packed.nodes)
    why = support.known_fault_reason(padded, 7)
    assert why is not None and "engine 7" in why and "conv_wgrad" in why and "padded" in why
    assert support.known_fault_reason(packed, 7) is None
    assert support.known_fault_reason(padded, 8) is None
    assert support.known_fault_reason(padded, None) is None
    # the input-clobbering table still speaks first
    assert support.known_fault_reason(padded, 5) is None


def test_engine_70_is_barred_for_wgrad_on_padded_rows_only() -> None:
    # issue 20, session 9: c00561 (conv_wgrad fp16, rows padded to a pitch of 59); engine 70
    # was wrong on 4 padded shapes in fp16 and bf16 and right on the same shapes packed
    from dnntune.providers.cudnn.support import known_fault_reason
    from dnntune.testing.conformance import generate_case

    padded = generate_case(0, 561, "full").graph()
    why = known_fault_reason(padded, 70)
    assert why is not None and "engine 70" in why and "conv_wgrad" in why
    assert known_fault_reason(padded, 69) is None
    packed = dt.Graph(name="wgrad", io_data_type=dt.DataType.HALF)
    dy = packed.tensor(name="DY", dims=[2, 64, 56, 56])
    x = packed.tensor(name="X", dims=[2, 64, 56, 56])
    dw = packed.conv_wgrad(dy, x, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    dw.set_dims([64, 64, 3, 3]).set_output(True)
    packed.validate()
    assert known_fault_reason(packed, 70) is None
