"""The cuDNN plan store without a GPU: the file format (round trip, keys, corrupt files, the
private-folder rule, concurrent writers) and a CudnnProblem that stores a slow build and loads
it in a later problem instead of building, on a recording fake of the frontend."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune import _temp_files
from dnntune.providers.cudnn import _runtime
from dnntune.providers.cudnn import plan_store as plan_store_module
from dnntune.providers.cudnn.plan_store import MAGIC, PlanStore, PlanStoreKey


def _key(**changes: Any) -> PlanStoreKey:
    fields: dict[str, Any] = {
        "graph_key": "0" * 32,
        "uids": (1, 2, None, 4),
        "device": "NVIDIA H200 sm_90",
        "cudnn_backend": 91900,
        "cudnn_frontend": "1.16.0",
        "cuda": "13.0",
        "heur_mode": "a",
        "excluded_numeric_notes": (),
        "plan_name": "eng6_k14=0_k24=0",
    }
    fields.update(changes)
    return PlanStoreKey(**fields)


@pytest.fixture
def store(tmp_path: Path) -> PlanStore:
    folder = tmp_path / "plans"
    folder.mkdir(mode=0o700)
    return PlanStore(folder)


def test_a_stored_plan_loads_back_under_its_own_key_only(store: PlanStore) -> None:
    blob = bytes(range(256)) * 40
    assert store.store(_key(), blob, ["SUPPORTS_CUDA_GRAPH_NATIVE_API"])
    assert store.load(_key()) == (blob, ("SUPPORTS_CUDA_GRAPH_NATIVE_API",))
    for other in (
        _key(plan_name="eng4"),
        _key(device="NVIDIA H100 sm_90"),
        _key(cudnn_backend=92000),
        _key(cudnn_frontend="1.17.0"),
        _key(cuda="12.8"),
        _key(heur_mode="fallback"),
        _key(excluded_numeric_notes=("TENSOR_CORE",)),
        _key(uids=(1, 2, 3, 4)),
        _key(graph_key="1" * 32),
    ):
        assert store.load(other) is None, other
    # the file is named by the key's digest: a file moved to another key's name is refused
    # by the key stored inside it
    os.replace(store.path(_key()), store.path(_key(plan_name="eng4")))
    assert store.load(_key(plan_name="eng4")) is None


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "flipped byte",
        "no magic",
        "header not json",
        "header not an object",
        "empty",
        "huge length",
        "infinite length",
        "length a string",
        "length a bool",
        "header nested too deeply",
        "header not utf-8",
        "notes a string",
        "duplicate bytes key",
    ],
)
def test_a_damaged_plan_file_is_a_miss_and_the_next_store_replaces_it(
    store: PlanStore, damage: str
) -> None:
    blob = b"plan" * 1000
    store.store(_key(), blob)
    path = store.path(_key())
    data = path.read_bytes()
    magic, header, rest = data.split(b"\n", 2)

    def with_header(text: bytes) -> bytes:
        return magic + b"\n" + text + b"\n" + rest

    def edited(old: bytes, new: bytes) -> bytes:
        return with_header(header.replace(old, new, 1))

    damaged = {
        "truncated": data[:-10],
        "flipped byte": data[:-5] + bytes([data[-5] ^ 1]) + data[-4:],
        "no magic": b"something else\n" + header + b"\n" + rest,
        "header not json": magic + b"\n{nope\n" + rest,
        "header not an object": magic + b"\n[1, 2]\n" + rest,
        "empty": b"",
        "huge length": edited(b'"bytes":4000', b'"bytes":1e12'),
        # Python's json reads Infinity; int() of it raised OverflowError out of load()
        "infinite length": edited(b'"bytes":4000', b'"bytes":Infinity'),
        "length a string": edited(b'"bytes":4000', b'"bytes":"4000"'),
        "length a bool": edited(b'"bytes":4000', b'"bytes":true'),
        # RecursionError, not a ValueError, out of json.loads
        "header nested too deeply": with_header(b"[" * 100_000 + b"]" * 100_000),
        "header not utf-8": edited(b'"sha256"', b'"sha\xff256"'),
        # a string's letters were read as the plan's notes
        "notes a string": edited(b'"behavior_notes":[]', b'"behavior_notes":"NOTE"'),
        # the last of two keys wins (Python's json), here a wrong length
        "duplicate bytes key": edited(b'"bytes":4000', b'"bytes":4000,"bytes":1'),
    }[damage]
    path.write_bytes(damaged)
    assert store.load(_key()) is None
    assert store.store(_key(), blob)
    assert store.load(_key()) == (blob, ())


def test_the_file_starts_with_its_format_and_key(store: PlanStore) -> None:
    store.store(_key(), b"x" * 10)
    data = store.path(_key()).read_bytes()
    assert data.startswith(MAGIC)
    import json

    header = json.loads(data.split(b"\n")[1])
    assert header["key"]["plan_name"] == "eng6_k14=0_k24=0"
    assert header["bytes"] == 10 and len(header["sha256"]) == 64


def test_an_off_store_loads_and_stores_nothing(tmp_path: Path) -> None:
    off = PlanStore(None)
    assert not off.enabled
    assert off.store(_key(), b"x") is False
    assert off.load(_key()) is None


def test_the_caches_off_switch_and_a_folder_others_can_write_turn_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_store_module, "_stores", {})
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path / "a"))
    assert PlanStore.default().enabled
    assert PlanStore.default() is PlanStore.default()
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    assert not PlanStore.default().enabled
    monkeypatch.delenv("DNNTUNE_DISABLE_CACHE")
    shared = tmp_path / "b"
    (shared / "cudnn-plans").mkdir(parents=True)
    (shared / "cudnn-plans").chmod(0o777)
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(shared))
    assert not PlanStore.default().enabled  # code others could swap is never loaded
    assert not list((shared / "cudnn-plans").rglob("*.plan"))


def test_writers_at_once_leave_one_complete_file(store: PlanStore) -> None:
    blobs = [bytes([i]) * (5000 + i) for i in range(6)]
    seen: list[tuple[bytes, tuple[str, ...]] | None] = []
    stop = threading.Event()

    def write(blob: bytes) -> None:
        for _ in range(40):
            store.store(_key(), blob)

    def read() -> None:
        while not stop.is_set():
            seen.append(store.load(_key()))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(b,)) for b in blobs]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    final = store.load(_key())
    assert final is not None and final[0] in blobs
    assert all(s is None or s[0] in blobs for s in seen)  # never a torn or mixed file
    assert [p.name for p in store.folder.iterdir()] == [store.path(_key()).name]  # type: ignore[union-attr]


# ---- a CudnnProblem on a recording fake of the frontend ------------------------------------
class _FakeTensor:
    """A frontend tensor: every setter returns it."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


class _FakeFrontendGraph:
    """What CudnnProblem asks of a frontend graph, recorded; serialize gives the plan's name."""

    def __init__(self, **kwargs: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.candidate = -1
        self.loaded_name: str | None = None

    def __getattr__(self, name: str) -> Any:  # the lowering's tensor and op calls
        def op(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            if name in ("layernorm", "rmsnorm", "sdpa"):
                return [_FakeTensor() for _ in range(3)]
            return _FakeTensor()

        return op

    def get_execution_plan_count(self) -> int:
        return 2

    def get_plan_name_at_index(self, index: int) -> str:
        return self.loaded_name if self.loaded_name is not None else f"eng{index}_k2=1"

    def build_plan_at_index(self, index: int) -> None:
        self.calls.append(("build_plan_at_index", (index,)))
        self.candidate = index

    def get_workspace_size_plan_at_index(self, index: int) -> int:
        return 128 * (index + 1)

    def serialize(self) -> list[int]:
        return list(f"eng{self.candidate}_k2=1".encode())

    def deserialize(self, handle: int, data: list[int]) -> None:
        self.calls.append(("deserialize", (handle,)))
        if bytes(data) == b"broken":
            raise RuntimeError("cudnn: bad plan")
        self.loaded_name = bytes(data).decode()

    def _execute_plan_at_index(self, pack: Any, workspace: int, index: int, handle: int) -> None:
        self.calls.append(("execute", (index,)))

    def get_workspace_size(self) -> int:
        return 128 * (int(self.loaded_name[3]) + 1) if self.loaded_name else 0

    def get_behavior_notes(self) -> list[Any]:
        return []

    def get_behavior_notes_for_plan_at_index(self, index: int) -> list[Any]:
        return []


@pytest.fixture
def frontend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[types.SimpleNamespace]:
    import torch

    from dnntune.providers.cudnn import problem as problem_module

    graphs: list[_FakeFrontendGraph] = []

    def pygraph(**kwargs: Any) -> _FakeFrontendGraph:
        graphs.append(_FakeFrontendGraph(**kwargs))
        return graphs[-1]

    class _Names:
        def __getattr__(self, name: str) -> str:
            return name

    names = _Names()
    fake = types.SimpleNamespace(
        pygraph=pygraph,
        graphs=graphs,
        data_type=names,
        reduction_mode=names,
        norm_forward_phase=names,
        diagonal_alignment=names,
        heur_mode=names,
        numerical_note=names,
        _compiled_module=types.SimpleNamespace(convolution_mode=names),
    )
    monkeypatch.setattr(_runtime, "_module", fake)
    monkeypatch.setattr(
        _runtime, "versions", lambda: {"cudnn_backend": 91900, "cudnn_frontend": "1.16.0"}
    )
    monkeypatch.setattr(problem_module, "cudnn_handle", lambda device, stream: 5)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "FAKE GPU")
    monkeypatch.setattr(plan_store_module, "_stores", {})
    monkeypatch.setattr(plan_store_module, "STORE_MIN_BUILD_S", 0.0)  # the fake builds at once
    problem_module.clear_problem_cache()
    yield fake
    problem_module.clear_problem_cache()


def _layernorm() -> dt.Graph:
    g = dt.Graph(
        name="ln",
        io_data_type=dt.DataType.BFLOAT16,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[64, 256])
    scale = g.tensor(name="S", dims=[1, 256])
    bias = g.tensor(name="B", dims=[1, 256])
    y = g.layernorm(x, scale, bias, epsilon=1e-5)[0]
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def _built(graph: _FakeFrontendGraph) -> list[int]:
    return [args[0] for name, args in graph.calls if name == "build_plan_at_index"]


def test_a_later_problem_loads_a_stored_plan_instead_of_building_it(
    frontend: types.SimpleNamespace,
) -> None:
    from dnntune.providers.cudnn.problem import clear_problem_cache, get_problem

    first = get_problem(_layernorm(), 0, "a")
    assert first.build(1) == 256
    assert _built(frontend.graphs[0]) == [1]
    assert first.runner(1) == (frontend.graphs[0]._execute_plan_at_index, 1)
    assert first.plan_facts(1)["cudnn_plan_loaded"] is False

    clear_problem_cache()  # as a new process would start
    later = get_problem(_layernorm(), 0, "a")
    assert later.build(1) == 256
    lowered, loaded = frontend.graphs[1], frontend.graphs[2]
    assert _built(lowered) == []  # not compiled again
    assert ("deserialize", (5,)) in loaded.calls
    run, index = later.runner(1)
    assert (run, index) == (loaded._execute_plan_at_index, 0)
    assert later.plan_facts(1)["cudnn_plan_loaded"] is True
    # a plan never stored is built as before
    assert later.build(0) == 128 and _built(lowered) == [0]
    assert later.runner(0) == (lowered._execute_plan_at_index, 0)


def test_a_plan_the_frontend_cannot_load_is_built(frontend: types.SimpleNamespace) -> None:
    from dnntune.providers.cudnn.plan_store import PlanStore
    from dnntune.providers.cudnn.problem import get_problem

    problem = get_problem(_layernorm(), 0, "a")
    stored = problem._stored
    assert stored is not None
    PlanStore.default().store(stored.key("eng1_k2=1"), b"broken")
    assert problem.build(1) == 256
    assert _built(frontend.graphs[0]) == [1]
    assert problem.runner(1)[1] == 1


def test_a_loaded_plan_that_cannot_tell_its_workspace_is_built(
    frontend: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.providers.cudnn.problem import clear_problem_cache, get_problem

    get_problem(_layernorm(), 0, "a").build(1)  # stored
    clear_problem_cache()

    def no_answer(self: _FakeFrontendGraph) -> int:
        raise RuntimeError("cudnn: plan not finalized")

    monkeypatch.setattr(_FakeFrontendGraph, "get_workspace_size", no_answer)
    later = get_problem(_layernorm(), 0, "a")
    assert later.build(1) == 256
    assert _built(frontend.graphs[1]) == [1] and not later.loaded(1)
    assert later.plan_facts(1)["cudnn_plan_loaded"] is False


def test_a_fast_build_is_not_stored(
    frontend: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.providers.cudnn.problem import get_problem

    monkeypatch.setattr(plan_store_module, "STORE_MIN_BUILD_S", 60.0)
    get_problem(_layernorm(), 0, "a").build(1)
    folder = PlanStore.default().folder
    assert folder is not None and not list(folder.glob("*.plan"))


def test_without_a_device_to_name_nothing_is_stored(
    frontend: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from dnntune.providers.cudnn.problem import get_problem

    def no_gpu(index: int) -> tuple[int, int]:
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_capability", no_gpu)
    problem = get_problem(_layernorm(), 0, "a")
    assert problem._stored is None
    assert problem.build(1) == 256


# ---- processes at once, and a writer killed mid-write ---------------------------------------
def _store_many(folder: str, fill: int) -> None:
    store = PlanStore(Path(folder))
    for n in range(30):
        assert store.store(_key(), bytes([fill]) * (3000 + n))


def _store_then_hang(folder: str, ready: Any) -> None:
    """Store a plan, stopping for good between the temporary file and the rename."""

    def hang(src: Any, dst: Any) -> None:
        ready.set()
        time.sleep(600)

    os.replace = hang  # this process only
    PlanStore(Path(folder)).store(_key(), b"never renamed" * 100)


def test_processes_storing_one_plan_at_once_leave_one_complete_file(store: PlanStore) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_store_many, args=(str(store.folder), i)) for i in range(4)]
    for p in procs:
        p.start()
    seen = []
    while any(p.is_alive() for p in procs):
        seen.append(store.load(_key()))
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0] * 4
    final = store.load(_key())
    assert final is not None and len(set(final[0])) == 1
    assert all(s is None or len(set(s[0])) == 1 for s in seen)  # never a mixed file
    assert [p.name for p in store.folder.iterdir()] == [store.path(_key()).name]  # type: ignore[union-attr]


def test_a_writer_killed_mid_store_leaves_a_temporary_file_the_next_store_removes(
    store: PlanStore,
) -> None:
    """Before, each plan store killed between writing and renaming (kill -9, the OOM killer)
    left a ``.plan-*`` file in the cache folder for good."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_store_then_hang, args=(str(store.folder), ready))
    proc.start()
    assert ready.wait(timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert store.folder is not None
    (left,) = [p.name for p in store.folder.iterdir()]
    assert left.startswith(f".{store.path(_key()).name}.{_temp_files._owner()}-{proc.pid}.")
    assert store.load(_key()) is None  # the half-stored plan is not the plan
    assert store.store(_key(), b"plan" * 100)
    assert [p.name for p in store.folder.iterdir()] == [store.path(_key()).name]
    assert store.load(_key()) == (b"plan" * 100, ())


def test_a_running_writers_temporary_file_is_kept(store: PlanStore) -> None:
    assert store.folder is not None
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = f".{store.path(_key()).name}.{_temp_files._owner()}-{other.pid}.abcdefgh.tmp"
        (store.folder / name).write_bytes(b"mid-write")
        assert store.store(_key(), b"plan")
        assert (store.folder / name).exists()
    finally:
        other.kill()
        other.wait()
    assert store.store(_key(), b"plan")
    assert not (store.folder / name).exists()


def test_an_earlier_versions_leftover_temporary_file_goes_once_a_day_old(store: PlanStore) -> None:
    """Earlier versions named the temporary file ``.plan-<random>``: no writer to ask, so it goes
    by age (a day), as other unknown writers' do."""
    assert store.folder is not None
    old, new = store.folder / ".plan-abc123_z", store.folder / ".plan-zzzzzzzz"
    for p in (old, new):
        p.write_bytes(b"half a plan")
    then = time.time() - 2 * _temp_files.STALE_AGE_S
    os.utime(old, (then, then))
    assert store.store(_key(), b"plan")
    assert not old.exists() and new.exists()


def test_a_plan_no_process_used_for_30_days_is_removed_by_a_later_store(
    tmp_path: Path,
) -> None:
    """A plan is stored per graph (shapes included) and per cuDNN version: the folder grew for
    good. A load marks a plan used, so a plan in use never ages out."""
    folder = tmp_path / "plans"
    folder.mkdir(mode=0o700)
    first = PlanStore(folder)
    for name in ("unused", "loaded", "recent"):
        assert first.store(_key(plan_name=name), name.encode() * 100)
    month = time.time() - 31 * 24 * 3600
    for name in ("unused", "loaded"):
        os.utime(first.path(_key(plan_name=name)), (month, month))
    os.utime(first.path(_key(plan_name="recent")), (month + 3 * 24 * 3600,) * 2)
    later = PlanStore(folder)  # another process
    assert later.load(_key(plan_name="loaded")) is not None
    assert later.store(_key(plan_name="new"), b"new")
    left = {p.name for p in folder.iterdir()}
    assert left == {later.path(_key(plan_name=n)).name for n in ("loaded", "recent", "new")}
