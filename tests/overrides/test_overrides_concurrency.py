"""Beyond the RFC: many processes appending to one override file, or to one ranking file of
the exact-match cache, lose no entry."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from dnntune.overrides.format import load_file

PROCESSES = 8
ENTRIES_PER_PROCESS = 6

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import dnntune as dt
    from dnntune.rfc import AutotuneResult, AutotuneStorageConfig
    from dnntune.overrides.writer import write_autotune_winner

    index, per_process, target, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    while not Path(go).exists():  # start together: maximum contention
        time.sleep(0.005)
    for j in range(per_process):
        g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT)
        a = g.tensor(name="A", dims=[index + 1, 8 + j])
        b = g.tensor(name="B", dims=[8 + j, 4])
        g.matmul(a, b).set_output(True)
        g.validate()
        result = AutotuneResult(engine_id=index, engine_name=f"E{index}_{j}", rank=0,
                                succeeded=True, min_time_ms=0.1, avg_time_ms=0.1)
        write_autotune_winner(g, [result], AutotuneStorageConfig(target), None)
    """
)


@pytest.mark.slow
def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    target = tmp_path / "shared.json"
    go = tmp_path / "go"
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(ENTRIES_PER_PROCESS), str(target), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(PROCESSES)
    ]
    time.sleep(0.5)
    go.write_text("")
    failures = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        if p.returncode != 0:
            failures.append(err.decode(errors="replace"))
    assert not failures, failures[0]
    doc = json.loads(target.read_text())  # valid JSON
    names = sorted(e["engine_name"] for e in doc["engine_overrides"])
    expected = sorted(f"E{i}_{j}" for i in range(PROCESSES) for j in range(ENTRIES_PER_PROCESS))
    assert names == expected
    assert load_file(target).named_tensor_ids
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


# ---- the exact-match ranking cache: writers and readers of one file at once ------------------
RANKERS = 8
LOOKUPS = 40


def _rank(index: int, go: Any, out: Any) -> None:
    """One process's sweep result: its own order of four engines, appended under the lock."""
    import itertools

    from overrides_helpers import conv_graph, result

    import dnntune as dt
    from dnntune.backend.engine import engine_id
    from dnntune.overrides.exact_cache import write_ranking

    names = list(itertools.permutations(("A", "B", "C", "D")))[index]
    go.wait()
    outcome = write_ranking(
        conv_graph(),
        dt.create_handle("cpu"),
        [result(n, rank=i) for i, n in enumerate(names)],
        [engine_id(n) for n in names],
        True,
    )
    out.put((index, outcome.name))


def _look(go: Any, out: Any) -> None:
    """Reads while the rankers append: every answer is a whole record or none, never an error."""
    from overrides_helpers import conv_graph

    import dnntune as dt
    from dnntune.overrides.exact_cache import read_record

    graph, handle = conv_graph(), dt.create_handle("cpu")
    go.wait()
    seen = []
    for _ in range(LOOKUPS):
        record = read_record(graph, handle)
        seen.append(None if record is None else sorted(record.order))
    out.put(("reader", seen))


@pytest.mark.slow
def test_concurrent_ranking_writers_and_readers_lose_nothing() -> None:
    """Each of eight processes appends its own ranking of one graph while two others read it:
    the file ends with the stamp and all eight records, each line whole, and no read failed."""
    from overrides_helpers import conv_graph

    import dnntune as dt
    from dnntune.overrides.exact_cache import cache_key, cache_path

    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(i, go, out)) for i in range(RANKERS)]
    procs += [ctx.Process(target=_look, args=(go, out)) for _ in range(2)]
    for p in procs:
        p.start()
    go.set()
    answers = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    outcomes = sorted(a[1] for a in answers if a[0] != "reader")
    assert outcomes == ["WRITTEN"] * RANKERS
    for _, seen in (a for a in answers if a[0] == "reader"):
        assert all(s is None or len(s) == 4 for s in seen)
    path = cache_path(cache_key(conv_graph(), dt.create_handle("cpu")))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "dnntune-autotune-ranking"
    records = [json.loads(line) for line in lines[1:]]  # every line whole
    assert len(records) == RANKERS
    assert len({tuple(r["order"]) for r in records}) == RANKERS


# ---- a writer killed mid-write ---------------------------------------------------------------
def _write_then_hang(target: str, ready: Any) -> None:
    """Write an entry but stop, for good, between the temporary file and the rename."""
    from overrides_helpers import matmul_graph, write_winner

    def hang(src: Any, dst: Any) -> None:
        ready.set()
        time.sleep(600)

    os.replace = hang  # this process only
    write_winner(matmul_graph(), Path(target), "NEVER")


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_the_file_whole_and_the_lock_free(
    tmp_path: Path,
) -> None:
    """SIGKILL while the new content is written but not yet renamed: the file is the old one,
    whole, and the next writer gets the lock (the kernel drops a dead process's lock) and keeps
    the old entries. The dead writer's hidden temporary file is all that is left of it, and the
    next write removes it (it stayed for good, one more per killed writer)."""
    from overrides_helpers import conv_graph, layernorm_graph, write_winner

    target = tmp_path / "o.json"
    write_winner(conv_graph(), target, "OLD")
    before = target.read_text()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_write_then_hang, args=(str(target), ready))
    proc.start()
    assert ready.wait(timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    assert target.read_text() == before
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert left.name.startswith(".o.json.") and f"-{proc.pid}." in left.name
    started = time.monotonic()
    write_winner(layernorm_graph(), target, "NEXT")
    assert time.monotonic() - started < 30  # not the 120 s lock timeout
    names = sorted(e["engine_name"] for e in load_file(target).to_json()["engine_overrides"])
    assert names == ["NEXT", "OLD"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
