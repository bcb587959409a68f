"""cuDNN plan builds in worker processes, without a GPU: when build_ahead hands plans to
workers (and when it does not), what it counts as stored, that nothing it meets raises, and that
CudnnEngine.precompile and add_engine_variants ask for it with the right plan indices."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import dnntune as dt
from dnntune.providers.cudnn import parallel_build
from dnntune.providers.cudnn.parallel_build import build_ahead, worker_count


class _Problem:
    """What build_ahead asks of a CudnnProblem."""

    device_index = 0
    heur_mode = "a"
    excluded_notes: tuple[str, ...] = ()

    def __init__(self, n: int, build_s: float = 0.0, stores: bool = True) -> None:
        self.names = [f"eng{i}_k1=0" for i in range(n)]
        self.built: list[int] = []
        self.build_s = build_s
        self.stores_plans = stores
        self.stored: set[int] = set()

    def needs_build(self, index: int) -> bool:
        return index not in self.built and index not in self.stored

    def build(self, index: int) -> int:
        time.sleep(self.build_s)
        self.built.append(index)
        return 0

    def loaded(self, index: int) -> bool:
        return False

    def name_at(self, index: int) -> str:
        return self.names[index]


class _Pool:
    """The workers, replaced: each task is answered at once, in this thread."""

    def __init__(self, run: Callable[..., Any]) -> None:
        self.run = run
        self.jobs: list[tuple[Any, ...]] = []

    def __call__(self, count: int, tasks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        replies = {}
        for task in tasks:
            args = (task["graph"], task["device"], task["heur_mode"], task["notes"], task["index"])
            self.jobs.append(args)
            try:
                index, name, error = self.run(*args)
            except Exception:  # a worker that died: no reply
                continue
            replies[index] = {"index": index, "name": name, "error": error}
        return replies


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> _Pool:
    def built_in_worker(text: str, device: int, mode: str, notes: Any, index: int) -> Any:
        return index, f"eng{index}_k1=0", None

    fake = _Pool(built_in_worker)
    monkeypatch.setattr(parallel_build, "_run_tasks", fake)
    monkeypatch.setattr(parallel_build, "_graph_json", lambda graph: "{}")
    monkeypatch.setenv("DNNTUNE_CUDNN_BUILD_PROCESSES", "4")
    monkeypatch.setattr(parallel_build, "MIN_SERIAL_S", 0.0)
    return fake


def test_slow_plans_go_to_the_workers_after_the_first_is_built_here(pool: _Pool) -> None:
    problem = _Problem(6, build_s=0.01)
    assert build_ahead(problem, object(), [0, 1, 2, 3, 4, 5, 2]) == 5  # type: ignore[arg-type]
    assert problem.built == [0]  # the pace is taken from one build here
    assert [job[-1] for job in pool.jobs] == [1, 2, 3, 4, 5]  # each index once


def test_fast_plans_are_built_here(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel_build, "MIN_SERIAL_S", 60.0)
    problem = _Problem(6)
    assert build_ahead(problem, object(), range(6)) == 0  # type: ignore[arg-type]
    assert not pool.jobs


@pytest.mark.parametrize(
    "setup",
    ["two plans", "store off", "processes 0", "processes 1", "already stored"],
)
def test_no_workers_where_they_cannot_help(
    pool: _Pool, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    problem = _Problem(2 if setup == "two plans" else 6, stores=setup != "store off")
    if setup.startswith("processes"):
        monkeypatch.setenv("DNNTUNE_CUDNN_BUILD_PROCESSES", setup.split()[1])
    if setup == "already stored":
        problem.stored = {1, 2, 3, 4, 5}
    assert build_ahead(problem, object(), range(len(problem.names))) == 0  # type: ignore[arg-type]
    assert not pool.jobs


def test_what_a_worker_did_not_store_is_not_counted(pool: _Pool) -> None:
    def mixed(text: str, device: int, mode: str, notes: Any, index: int) -> Any:
        if index == 1:
            raise RuntimeError("the worker died")
        if index == 2:
            return index, "eng2_k1=0", "NotSupportedError: it did not build"
        if index == 3:
            return index, "eng9", None  # lowered to another plan list there
        return index, f"eng{index}_k1=0", None

    pool.run = mixed
    problem = _Problem(5, build_s=0.01)
    assert build_ahead(problem, object(), range(5)) == 1  # type: ignore[arg-type]


def test_build_ahead_never_raises(pool: _Pool) -> None:
    class Broken(_Problem):
        def needs_build(self, index: int) -> bool:
            raise RuntimeError("boom")

    assert build_ahead(Broken(5), object(), range(5)) == 0  # type: ignore[arg-type]


def test_the_number_of_workers(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setenv("DNNTUNE_CUDNN_BUILD_PROCESSES", "3")
    assert worker_count() == 3
    monkeypatch.setenv("DNNTUNE_CUDNN_BUILD_PROCESSES", "0")
    assert worker_count() == 0
    monkeypatch.setenv("DNNTUNE_CUDNN_BUILD_PROCESSES", "many")
    assert 1 <= worker_count() <= 8
    assert "is not a whole number" in caplog.text
    monkeypatch.delenv("DNNTUNE_CUDNN_BUILD_PROCESSES")
    assert 1 <= worker_count() <= 8
    monkeypatch.setattr(parallel_build.os, "cpu_count", lambda: 64)
    assert worker_count() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun's eight ranks share the cores
    assert worker_count() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert worker_count() == 1


def _norm() -> dt.Graph:
    g = dt.Graph(
        name="rms",
        io_data_type=dt.DataType.BFLOAT16,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[64, 512])
    scale = g.tensor(name="S", dims=[1, 512])
    y = g.rmsnorm(x, scale, epsilon=1e-5)[0]
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def test_precompile_asks_for_the_pinned_engine_configs_per_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from dnntune.providers.cudnn import CudnnEngine
    from dnntune.providers.cudnn import engine as engine_module

    asked: list[tuple[str, list[int]]] = []

    def fake_problem(graph: Any, device: int, mode: str, notes: Any) -> Any:
        return types.SimpleNamespace(candidates=(0, 2, 5, 7), heur_mode=mode)

    monkeypatch.setattr(engine_module, "get_problem", fake_problem)
    monkeypatch.setattr(
        engine_module,
        "build_ahead",
        lambda problem, graph, indices: asked.append((problem.heur_mode, list(indices))),
    )
    handle = types.SimpleNamespace(is_cuda=True, device=types.SimpleNamespace(index=0))
    knob = dt.KnobSetting
    CudnnEngine().precompile(
        _norm(),
        [
            [knob("cudnn.engine_config", 1)],
            [knob("cudnn.engine_config", 3)],
            [knob("cudnn.engine_config", 9)],  # past the list: its compile names it
            [knob("cudnn.engine_config", -1)],  # the heuristic's pick: built by its compile
            [knob("cudnn.engine_config", 2), knob("global.benchmarking", 1)],  # a search
            [knob("cudnn.engine_config", 0), knob("cudnn.heur_mode", "fallback")],
            [knob("cudnn.engine_config", "x")],  # a bad value: its compile names it
        ],
        handle,  # type: ignore[arg-type]
    )
    assert asked == [("a", [2, 7]), ("fallback", [0])]
    asked.clear()
    CudnnEngine().precompile(
        _norm(),
        [[knob("cudnn.engine_config", 1)]],
        types.SimpleNamespace(is_cuda=False),  # type: ignore[arg-type]
    )
    assert asked == []


def test_add_engine_variants_builds_each_engines_variants_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dnntune.autotune.plan_specs import PlanSpecCollection
    from dnntune.backend.engine import Engine
    from dnntune.backend.registry import get_registry

    calls: list[tuple[str, int]] = []

    def record(self: Engine, graph: Any, knob_sets: Any, handle: Any) -> None:
        calls.append((self.name, len(knob_sets)))

    monkeypatch.setattr(Engine, "estimate_ahead", record)
    g = _norm()
    handle = dt.create_handle("cpu")
    g.build_operation_graph(handle)
    torch_engine = get_registry().find("TORCH_ENGINE")
    assert torch_engine is not None
    specs = PlanSpecCollection(g, handle)
    variants = [dt.EngineVariant(torch_engine.id, {}) for _ in range(2)]
    variants.append(dt.EngineVariant(987654, {}))  # unknown: skipped with a warning below
    specs.add_engine_variants(variants)
    assert calls == [("TORCH_ENGINE", 2)]


def test_a_worker_answers_each_task_on_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import json

    def build(text: str, device: int, mode: str, notes: Any, index: int) -> Any:
        if index == 2:
            raise RuntimeError("no such plan")
        print("a frontend's chatter")  # in a real worker stdout is stderr: never a reply
        return index, f"eng{index}", None

    monkeypatch.setattr(parallel_build, "build_in_worker", build)
    tasks = "".join(
        json.dumps({"graph": "{}", "device": 0, "heur_mode": "a", "notes": [], "index": i}) + "\n"
        for i in (1, 2)
    )
    out = io.StringIO()
    parallel_build.serve(io.StringIO(tasks), out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert replies == [
        {"index": 1, "name": "eng1", "error": None},
        {"index": 2, "name": None, "error": "RuntimeError: no such plan"},
    ]


def test_a_real_worker_process_replies_and_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker program itself, in its own Python process: a task whose graph is not JSON
    gets an error reply (no CUDA needed to get that far), and closing its stdin ends it."""
    worker = parallel_build._Worker()
    try:
        task = {"graph": "not json", "device": 0, "heur_mode": "a", "notes": [], "index": 3}
        reply = worker.ask(task)
        assert reply["index"] == 3 and reply["name"] is None
        assert "GraphFormatError" in reply["error"]
    finally:
        worker.close()
    assert worker.proc.returncode == 0
