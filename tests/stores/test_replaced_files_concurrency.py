"""The files dnntune writes whole and replaces (a graph by ``Graph.save``, a heuristics records
file, a heuristics model, bench results), used by several processes at once: a reader in
another process while two writer processes replace the file sees one writer's file or the
other's, whole, through that format's own reader; and a writer killed between writing and
renaming leaves the old file, readable, and a temporary file the next write removes.

The override file, the ranking cache, the provider databases, the built cuDNN plans and the
Triton kernels have tests of their own (tests/overrides/test_overrides_concurrency.py,
tests/stores/test_jsonl_stores.py, tests/providers/test_cudnn_plan_store.py,
tests/providers/test_triton_codegen_temp_files.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune.backend.learned import ModelParams, device_class, load_model, problem_of
from dnntune.bench.results import SuiteResult
from dnntune.learning import Record, read_records_file, save_model, train, write_records_file

REWRITES = 25


def _matmul(m: int) -> dt.Graph:
    g = dt.Graph(name=f"mm{m}", io_data_type=dt.DataType.HALF)
    a = g.tensor(name="A", dims=[m, 64])
    b = g.tensor(name="B", dims=[64, 32])
    g.matmul(a, b).set_output(True)
    g.validate()
    return g


def _records(variant: int) -> list[Record]:
    """Two problems whose winner is TORCH in variant 0 and CUDNN in variant 1."""
    fast, slow = (1.0, 2.0) if variant == 0 else (2.0, 1.0)
    times = {"TORCH_ENGINE": fast, "CUDNN_ENGINE": slow}
    h200 = device_class("NVIDIA H200")
    return [Record(problem_of(_matmul(m)), h200, dict(times), source=f"v{variant}") for m in (4, 8)]


def _write_graph(path: Path, variant: int) -> None:
    _matmul(4 + variant).save(path)


def _read_graph(path: Path) -> object:
    return dt.Graph.load(path).key()


def _write_records(path: Path, variant: int) -> None:
    write_records_file(_records(variant), path)


def _read_records(path: Path) -> object:
    return tuple(r.source for r in read_records_file(path))


def _write_model(path: Path, variant: int) -> None:
    model = train(_records(variant), ModelParams(k=1))
    model.created = "2026-01-01T00:00:00Z"  # the two variants differ only in their data
    save_model(model, path)


def _read_model(path: Path) -> object:
    model = load_model(path)
    return tuple(
        sorted(str(sorted(p.ratios.items())) for g in model.groups.values() for p in g.points)
    )


def _write_bench(path: Path, variant: int) -> None:
    graph = {"graph_id": f"g{variant}", "graph_name": "g", "status": "ok", "results": []}
    SuiteResult({"complete": True, "config": {}}, {}, [graph]).write(path)


def _read_bench(path: Path) -> object:
    return SuiteResult.load(path)["graphs"][0]["graph_id"]


FORMATS: dict[str, tuple[Callable[[Path, int], None], Callable[[Path], object]]] = {
    "graph": (_write_graph, _read_graph),
    "records": (_write_records, _read_records),
    "model": (_write_model, _read_model),
    "bench-results": (_write_bench, _read_bench),
}


def _rewrite(kind: str, path: str, variant: int, go: Any) -> None:
    write, _ = FORMATS[kind]
    go.wait()
    for _ in range(REWRITES):
        write(Path(path), variant)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_a_reader_sees_one_writers_whole_file_while_two_processes_replace_it(
    tmp_path: Path, kind: str
) -> None:
    write, read = FORMATS[kind]
    path = tmp_path / "f.json"
    expected = set()
    for variant in (1, 0):  # both variants as the reader should see them; variant 0 stays
        write(path, variant)
        expected.add(read(path))
    assert len(expected) == 2  # the test tells the two writers' files apart
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    writers = [ctx.Process(target=_rewrite, args=(kind, str(path), v, go)) for v in (0, 1)]
    for p in writers:
        p.start()
    go.set()
    seen = []
    while any(p.is_alive() for p in writers):  # read for as long as either writes
        seen.append(read(path))  # a torn or empty file raises here
    for p in writers:
        p.join(timeout=60)
        assert p.exitcode == 0
    seen.append(read(path))
    assert set(seen) <= expected, set(seen) - expected
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _write_then_hang(kind: str, path: str, ready: Any) -> None:
    """Write variant 1 but stop, for good, between the temporary file and the rename."""
    write, _ = FORMATS[kind]

    def hang(src: Any, dst: Any) -> None:
        ready.set()
        time.sleep(600)  # killed long before; not a synchronisation

    os.replace = hang  # this process only
    write(Path(path), 1)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_a_writer_killed_mid_write_leaves_the_old_file_and_a_leftover_the_next_write_removes(
    tmp_path: Path, kind: str
) -> None:
    write, read = FORMATS[kind]
    path = tmp_path / "f.json"
    write(path, 0)
    before, old = path.read_bytes(), read(path)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_write_then_hang, args=(kind, str(path), ready))
    proc.start()
    while proc.is_alive() and not ready.wait(timeout=0.05):  # until it renames, or ends
        pass
    assert ready.is_set(), "the writer never renamed a temporary file: it wrote in place"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    assert path.read_bytes() == before and read(path) == old
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert left.name.startswith(".f.json.") and f"-{proc.pid}." in left.name
    write(path, 1)
    assert read(path) != old
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
