"""What ``dnntune bench --oracle`` tunes CUDNN_ENGINE over: one candidate per cuDNN engine
config. ``(cudnn.heur_mode, cudnn.engine_config)`` pairs are identified by the engine config
(engine id and knobs) the index names in that mode's plan list, not by the index, so a plan of
mode b or fallback that mode a's list also holds is swept once (issue 25: each mode's graph
built its own copy of largely the same plans). The CPU tests fake cuDNN's plan lists; the GPU
test reads them from cuDNN."""

from __future__ import annotations

from typing import Any

import pytest

import dnntune as dt
from dnntune.bench.oracle import oracle_variants
from dnntune.errors import NotSupportedError
from dnntune.providers.cudnn import engine as cudnn_engine
from dnntune.providers.cudnn.engine import ENGINE_CONFIG, HEUR_MODE, CudnnEngine
from dnntune.providers.cudnn.find_db import parse_engine_tag
from dnntune.rfc import TuneMode

H, F = dt.DataType.HALF, dt.DataType.FLOAT

#: per heur mode, cuDNN's deduplicated plan list (engine tags, heuristic order)
LISTS = {
    "a": ["eng28_k2=3_k3=0", "eng1_k2=1", "eng0"],
    "b": ["eng0", "eng7", "eng28_k2=3_k3=0"],
    "fallback": ["eng1_k2=1", "eng0", "eng28_k2=3_k3=1"],
}


def _conv() -> dt.Graph:
    g = dt.Graph(name="conv_relu", io_data_type=H, compute_data_type=F)
    x = g.tensor(name="X", dims=[4, 32, 14, 14], strides=[32 * 196, 1, 14 * 32, 32])
    w = g.tensor(name="W", dims=[64, 32, 3, 3], strides=[32 * 9, 1, 3 * 32, 32])
    y = g.conv_fprop(x, w, padding=1, stride=1)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


class _Problem:
    def __init__(self, names: list[str]) -> None:
        self._names = names

    @property
    def candidates(self) -> tuple[int, ...]:
        return tuple(range(len(self._names)))

    def name_at(self, index: int) -> str:
        return self._names[index]


@pytest.fixture
def fake_lists(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """cuDNN's lists faked per heur mode; the modes whose list was read, in order."""
    asked: list[str] = []

    def get_problem(graph: Any, device: int, mode: str, notes: Any = ()) -> _Problem:
        asked.append(mode)
        return _Problem(LISTS[mode])

    monkeypatch.setattr(cudnn_engine, "get_problem", get_problem)
    monkeypatch.setattr(cudnn_engine, "_current_device", lambda: 0)
    monkeypatch.setattr(cudnn_engine, "_distinct_plan_count", lambda graph: 3)
    return asked


def _tag(variant: dict[str, Any]) -> str | None:
    index = int(variant.get(ENGINE_CONFIG, -1))
    return None if index < 0 else LISTS[str(variant.get(HEUR_MODE, "a"))][index]


def test_a_pair_naming_an_engine_config_already_swept_is_left_out(fake_lists: list[str]) -> None:
    graph = _conv()
    standard = oracle_variants(CudnnEngine(), graph, TuneMode.STANDARD)
    assert standard == [
        {ENGINE_CONFIG: 0},
        {ENGINE_CONFIG: 1},
        {ENGINE_CONFIG: 2},
        {HEUR_MODE: "b"},  # b's heuristic choice: which plan builds first is not known
        {HEUR_MODE: "b", ENGINE_CONFIG: 1},  # eng7: only in b's list
        {HEUR_MODE: "fallback"},
        {HEUR_MODE: "fallback", ENGINE_CONFIG: 2},  # eng28 with other knobs: its own config
    ]
    # every engine config of every list is swept once
    tags = [_tag(v) for v in standard if _tag(v) is not None]
    assert sorted(tags) == sorted({t for names in LISTS.values() for t in names})
    # exhaustive keeps every pair (as before)
    exhaustive = oracle_variants(CudnnEngine(), graph, TuneMode.EXHAUSTIVE)
    assert len(exhaustive) == 3 * 4 - 1
    assert all(v in exhaustive for v in standard)


def test_the_identity_is_the_engine_config_not_the_tag_text() -> None:
    # knob order in a tag does not make another config; other knob values do
    assert parse_engine_tag("eng28_k3=0_k2=3") == parse_engine_tag("eng28_k2=3_k3=0")
    assert parse_engine_tag("eng28_k2=3_k3=1") != parse_engine_tag("eng28_k2=3_k3=0")


def test_unknown_lists_keep_every_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the lists (no GPU, a mode cuDNN refuses), nothing is provably a duplicate."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError("cuDNN: no heuristics")

    monkeypatch.setattr(cudnn_engine, "get_problem", refused)
    monkeypatch.setattr(cudnn_engine, "_current_device", lambda: 0)
    monkeypatch.setattr(cudnn_engine, "_distinct_plan_count", lambda graph: 3)
    graph = _conv()
    standard = oracle_variants(CudnnEngine(), graph, TuneMode.STANDARD)
    assert standard == oracle_variants(CudnnEngine(), graph, TuneMode.EXHAUSTIVE)
    assert len(standard) == 3 * 4 - 1


@pytest.mark.gpu
def test_on_a_gpu_each_engine_config_of_the_lists_is_swept_once() -> None:
    """Not run by the CPU suite: cuDNN's real lists for a conv (modes a, b, fallback)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))
    from dnntune.providers.cudnn.problem import get_problem

    graph = _conv()
    device = torch.cuda.current_device()
    lists = {}
    for mode in ("a", "b", "fallback"):
        try:
            problem = get_problem(graph, device, mode)
        except NotSupportedError:
            continue
        lists[mode] = [problem.name_at(i) for i in problem.candidates]
    count = len(lists["a"])
    standard = oracle_variants(CudnnEngine(), graph, TuneMode.STANDARD)
    configs = []
    for v in standard:
        index = int(v.get(ENGINE_CONFIG, -1))
        names = lists.get(str(v.get(HEUR_MODE, "a")), [])
        # the knob's range is a's count: an index past a shorter list (b, fallback) names no
        # plan there (its build declines), so it names no config to compare (H200, session 24)
        if 0 <= index < len(names):
            configs.append(parse_engine_tag(names[index]))
    keys = [(e, tuple(sorted(k.items()))) for e, k in configs]
    assert len(keys) == len(set(keys)), "an engine config swept twice"
    # the full product (fp16: no cudnn.allow_tf32): every listed config below a's count
    if 3 * (count + 1) <= 64:
        want = {
            (e, tuple(sorted(k.items())))
            for names in lists.values()
            for e, k in map(parse_engine_tag, names[:count])
        }
        assert set(keys) == want
