"""The cache folders of other dnntune versions (``autotune-rankings/<version>``,
``cudnn-find-db/<version>``, ``cudnn-plans/<version>``) stayed under the cache folder for good,
one more per upgrade. A process's first write to a versioned cache removes those no process has
used for 30 days, and nothing else: not this version's, not one in use (recently used, or a lock
held), not one that holds anything but its cache's own files, not a link."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, result

from dnntune import _cache_versions, _temp_files
from dnntune._version import __version__
from dnntune.backend.engine import engine_id
from dnntune.backend.handle import Handle
from dnntune.overrides.exact_cache import write_ranking
from dnntune.rfc import CacheWriteOutcome

DAY_S = 24 * 3600.0
RANKING = "0123abcd" * 5 + "cpu.jsonl"
PLAN = "ab" * 20 + ".plan"


@pytest.fixture(autouse=True)
def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sweeps as a new process would (the sweep runs once per process and folder)."""
    monkeypatch.setattr(_cache_versions, "_swept", set())


def _cache() -> Path:
    return Path(os.environ["DNNTUNE_CACHE_DIR"])


def _folder(kind: str, version: str, *names: str, age_days: float = 0.0) -> Path:
    """A version's cache folder holding ``names`` (files), each and the folder last used
    ``age_days`` ago."""
    folder = _cache() / kind / version
    folder.mkdir(parents=True)
    then = time.time() - age_days * DAY_S
    for name in names:
        (folder / name).write_text("{}\n")
        os.utime(folder / name, (then, then))
    os.utime(folder, (then, then))
    return folder


def _write(handle: Handle) -> None:
    """A ranking written as an exhaustive sweep writes it: this version's first cache write."""
    results = [result("A", rank=0), result("B", rank=1)]
    ids = [engine_id("A"), engine_id("B")]
    assert write_ranking(conv_graph(), handle, results, ids, True) is CacheWriteOutcome.WRITTEN


def test_other_versions_folders_unused_for_30_days_go_at_the_first_write(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    old = [
        _folder("autotune-rankings", "0.0.9", RANKING, f".{RANKING}.lock", age_days=31),
        _folder("cudnn-find-db", "0.0.9", "dev.jsonl", "dev.jsonl.lock", age_days=40),
        _folder("cudnn-plans", "0.0.9", PLAN, ".plan-abcd1234", age_days=31),
        _folder("cudnn-plans", "0.1.0rc1", PLAN, f".{PLAN}.{'a' * 8}.tmp", age_days=31),
        _folder("autotune-rankings", "0.0.8", RANKING, f"{RANKING}.corrupt-17000", age_days=60),
    ]
    mine = _folder("autotune-rankings", __version__, RANKING, age_days=400)
    recent = _folder("autotune-rankings", "0.0.7", RANKING, age_days=29)
    caplog.set_level(logging.INFO, logger="dnntune")
    _write(handle)
    assert [p.exists() for p in old] == [False] * len(old)
    assert (mine / RANKING).exists() and (recent / RANKING).exists()
    said = [r.getMessage() for r in caplog.records if r.name == "dnntune._cache_versions"]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name.endswith("versions"))
    assert sorted(said) == sorted(
        f"dnntune: removed {p}, the cache of dnntune {p.name}, unused for 30 days" for p in old
    )
    assert sorted(p.name for p in (_cache() / "cudnn-plans").iterdir()) == []  # no trash left


def test_a_file_read_recently_keeps_its_folder(handle: Handle) -> None:
    folder = _folder("autotune-rankings", "0.0.9", RANKING, age_days=45)
    then = time.time() - 45 * DAY_S
    os.utime(folder / RANKING, (time.time() - DAY_S, then))  # read yesterday, written long ago
    os.utime(folder, (then, then))
    _write(handle)
    assert (folder / RANKING).exists()


@pytest.mark.parametrize(
    "extra",
    ["notes.txt", f"{RANKING}.unsaved-1700000000", "sub/", "link"],
)
def test_a_folder_with_anything_else_in_it_is_kept(handle: Handle, extra: str) -> None:
    folder = _folder("autotune-rankings", "0.0.9", RANKING, age_days=45)
    if extra == "sub/":
        (folder / "sub").mkdir()
    elif extra == "link":
        (folder / "link.jsonl").symlink_to(folder / RANKING)
    else:
        (folder / extra).write_text("mine")
    then = time.time() - 45 * DAY_S
    for p in folder.iterdir():
        os.utime(p, (then, then), follow_symlinks=False)
    os.utime(folder, (then, then))
    _write(handle)
    assert (folder / RANKING).exists()


def test_what_is_not_a_version_folder_is_never_touched(handle: Handle, tmp_path: Path) -> None:
    not_versions = [
        _folder("autotune-rankings", "backup", RANKING, age_days=90),
        _folder("autotune-rankings", "0.0.9-old", RANKING, age_days=90),
        _folder("triton-perf-db", "0.0.9", RANKING, age_days=90),  # not a versioned cache
    ]
    elsewhere = tmp_path / "0.0.9"
    elsewhere.mkdir()
    (elsewhere / RANKING).write_text("{}\n")
    then = time.time() - 90 * DAY_S
    os.utime(elsewhere / RANKING, (then, then))
    os.utime(elsewhere, (then, then))
    link = _cache() / "cudnn-plans" / "0.0.5"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere, target_is_directory=True)
    (_cache() / "cudnn-find-db").mkdir()
    (_cache() / "cudnn-find-db" / "0.0.4").write_text("a file named like a version")
    _write(handle)
    assert all((p / RANKING).exists() for p in not_versions)
    assert link.is_symlink() and (elsewhere / RANKING).exists()
    assert (_cache() / "cudnn-find-db" / "0.0.4").is_file()


_HOLD = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_held_lock_keeps_the_folder_until_it_is_released(handle: Handle) -> None:
    lock = f".{RANKING}.lock"
    folder = _folder("autotune-rankings", "0.0.9", RANKING, lock, age_days=45)
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder / lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        _write(handle)
        assert (folder / RANKING).exists()  # an old-version writer is at work
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert _cache_versions.remove_unused_versions(_cache()) == [folder]
    assert not folder.exists()


def test_a_removal_killed_midway_is_finished_by_the_next_sweep(handle: Handle) -> None:
    parent = _cache() / "cudnn-plans"
    parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = _temp_files._owner()
    trash = parent / f".0.0.9.{owner}-{dead.pid}.abcd1234.tmpdir"
    (trash / "0.0.9").mkdir(parents=True)
    (trash / "0.0.9" / PLAN).write_text("half removed")
    running = parent / f".0.0.8.{owner}-{os.getpid()}.abcd1234.tmpdir"
    running.mkdir()
    _write(handle)
    assert not trash.exists()
    assert running.exists()  # a running process's removal is its own


def test_nothing_is_swept_with_the_cache_off(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder("autotune-rankings", "0.0.9", RANKING, age_days=45)
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    assert _cache_versions.sweep_once() == []
    assert folder.exists()


def _plan_store_write() -> None:
    from dnntune.providers.cudnn.plan_store import PlanStore, PlanStoreKey

    key = PlanStoreKey("0" * 32, (1, 2), "NVIDIA H200 sm_90", 91900, "1.16.0", "13.0", "a", (), "e")
    assert PlanStore(_cache() / "cudnn-plans" / __version__).store(key, b"plan" * 100)


def _find_db_write() -> None:
    from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord

    db = FindDb.default()
    assert db is not None
    assert db.record(FindDbKey("graph", "dev", 91900, "1.16.0", "a", 0), FindDbRecord("e", 0, 0, 1))


@pytest.mark.parametrize("write", [_plan_store_write, _find_db_write])
def test_the_cudnn_stores_first_write_sweeps_too(write: Callable[[], None]) -> None:
    folder = _folder("autotune-rankings", "0.0.9", RANKING, age_days=31)
    (_cache() / "cudnn-plans" / __version__).mkdir(parents=True, mode=0o700)
    write()
    assert not folder.exists()
