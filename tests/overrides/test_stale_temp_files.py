"""The hidden ``.<name>.*.tmp`` files of atomic writes that a writer killed mid-write (``kill -9``)
left beside an override file, a cache file or any file dnntune writes stayed for good, one more
per crash. The next write of that file removes them: a dead writer's at once, an unknown
writer's (another machine's, a name of before) once a day old, and never one that a running
writer is using (the writer's rename would fail)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dnntune import _temp_files as temp_files
from dnntune.overrides.store import append_line, atomic_write_text, check_writable

DAY_S = 24 * 3600.0


def _dead_pid() -> int:
    """The pid of a process that has ended (and was waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _temp(folder: Path, name: str, age_s: float = 0.0) -> Path:
    p = folder / name
    p.write_text("half a file")
    if age_s:
        then = time.time() - age_s
        os.utime(p, (then, then))
    return p


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_write_names_its_temporary_file_after_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write_text(tmp_path / "o.json", "{}\n")
    (name,) = seen
    owner = temp_files._owner()
    assert name.startswith(f".o.json.{owner}-{os.getpid()}.") and name.endswith(".tmp")


def test_a_dead_writers_temporary_file_goes_at_the_next_write(tmp_path: Path) -> None:
    owner = temp_files._owner()
    dead = _temp(tmp_path, f".o.json.{owner}-{_dead_pid()}.abcd1234.tmp")
    atomic_write_text(tmp_path / "o.json", "{}\n")
    assert not dead.exists()
    assert _left(tmp_path) == ["o.json"]


def test_a_running_writers_temporary_file_stays_however_old(tmp_path: Path) -> None:
    """This process (another thread's write) and its parent are running: their files are kept,
    a week old or not (a writer suspended with Ctrl-Z is still a writer)."""
    owner = temp_files._owner()
    mine = _temp(tmp_path, f".o.json.{owner}-{os.getpid()}.abcd1234.tmp", age_s=7 * DAY_S)
    parent = _temp(tmp_path, f".o.json.{owner}-{os.getppid()}.abcd1234.tmp", age_s=7 * DAY_S)
    atomic_write_text(tmp_path / "o.json", "{}\n")
    assert mine.exists() and parent.exists()


@pytest.mark.parametrize(
    "name",
    [
        ".o.json.0badc0de-{pid}.abcd1234.tmp",  # another machine's (or container's) writer
        ".o.json.abcd1234.tmp",  # named before the writer was part of the name
        ".o.json.abcd1234.probe",  # check_writable's probe, of before too
    ],
    ids=["other-machine", "old-name", "old-probe"],
)
def test_an_unknown_writers_temporary_file_goes_once_a_day_old(tmp_path: Path, name: str) -> None:
    """Its pid says nothing about this machine's processes: only its age tells."""
    recent = _temp(tmp_path, name.format(pid=_dead_pid()).replace("abcd", "new0"), age_s=3600)
    old = _temp(tmp_path, name.format(pid=_dead_pid()), age_s=DAY_S + 60)
    atomic_write_text(tmp_path / "o.json", "{}\n")
    assert recent.exists()
    assert not old.exists()


def test_nothing_but_that_files_temporary_files_is_touched(tmp_path: Path) -> None:
    owner, dead = temp_files._owner(), _dead_pid()
    others = [
        ".o.json.lock",  # the lock stays (store.py says why)
        "o.json.corrupt-1700000000",  # a corrupt file moved aside
        "o.json.unsaved-1700000000",  # the only copy of a failed replacement
        f".other.json.{owner}-{dead}.abcd1234.tmp",  # another file's
        f".o.json.bak.{owner}-{dead}.abcd1234.tmp",  # o.json.bak's, not o.json's
        ".o.json.not-a-temp.tmp",  # not a name dnntune makes
    ]
    for name in others:
        _temp(tmp_path, name, age_s=30 * DAY_S)
    (tmp_path / f".o.json.{owner}-{dead}.dir12345.tmp").mkdir()  # not a file
    atomic_write_text(tmp_path / "o.json", "{}\n")
    assert _left(tmp_path) == sorted([*others, f".o.json.{owner}-{dead}.dir12345.tmp", "o.json"])


def test_appends_and_write_checks_clear_them_too(tmp_path: Path) -> None:
    """The JSON-lines stores (ranking cache, perf and find databases) append, and rewrite
    atomically only now and then: an append clears the leftovers of a killed rewrite. The
    probe of an output check is named after its writer as well."""
    owner = temp_files._owner()
    target = tmp_path / "k.jsonl"
    target.write_text("{}\n")
    dead = _temp(tmp_path, f".k.jsonl.{owner}-{_dead_pid()}.abcd1234.tmp")
    append_line(target, "{}")
    assert not dead.exists()
    probe = _temp(tmp_path, f".k.jsonl.{owner}-{_dead_pid()}.abcd1234.probe")
    check_writable(target)
    assert probe.exists()  # a check writes nothing: the next write removes it
    atomic_write_text(target, "{}\n")
    assert _left(tmp_path) == ["k.jsonl"]


def test_a_name_too_long_for_the_writer_in_it_still_writes(tmp_path: Path) -> None:
    """The writer's part (``<owner>-<pid>.``) lengthens the temporary name: a name that fitted
    before (255 bytes less the 16 of ``.`` and ``.<random>.probe``) must still be written."""
    target = tmp_path / ("n" * 234 + ".json")
    check_writable(target)
    atomic_write_text(target, "{}\n")
    assert target.read_text() == "{}\n"
    assert _left(tmp_path) == [target.name]


# ---- a writer running next to the cleanup ----------------------------------------------------
def _write_when_told(target: str, ready: Any, go: Any) -> None:
    """Write ``target``, holding between the temporary file and the rename until ``go``."""
    real = os.replace

    def wait_then_replace(src: Any, dst: Any) -> None:
        ready.set()
        go.wait(120)
        real(src, dst)

    os.replace = wait_then_replace  # this process only
    atomic_write_text(Path(target), "from the other writer\n")


@pytest.mark.slow
def test_a_running_writers_temporary_file_survives_a_write_next_to_it(tmp_path: Path) -> None:
    """Another process is mid-write (its temporary file written, not yet renamed) while this one
    writes the same file: its temporary file stays, and its rename then succeeds."""
    target = tmp_path / "o.json"
    ctx = multiprocessing.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_write_when_told, args=(str(target), ready, go))
    proc.start()
    try:
        assert ready.wait(timeout=120)
        (theirs,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        atomic_write_text(target, "from this writer\n")
        assert theirs.exists()
    finally:
        go.set()
        proc.join(timeout=60)
    assert proc.exitcode == 0
    assert target.read_text() == "from the other writer\n"
    assert _left(tmp_path) == ["o.json"]


def test_a_dead_writers_temporary_folder_goes_with_its_contents(tmp_path: Path) -> None:
    """Results that take several files to make (the compiled helpers) are made in a folder
    ``.<name>.<owner>-<pid>.<random>.tmpdir``: a dead writer's goes whole, a running writer's
    stays, and a link of that name is removed as a link, never followed."""
    target = tmp_path / "helper.so"
    owner, dead = temp_files._owner(), _dead_pid()
    theirs = Path(temp_files.make_temp_dir(target))
    assert theirs.name.startswith(f".helper.so.{owner}-{os.getpid()}.")
    dead_dir = tmp_path / f".helper.so.{owner}-{dead}.abcdefgh.tmpdir"
    (dead_dir / "sub").mkdir(parents=True)
    (dead_dir / "sub" / "half.c").write_text("int x;")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("kept")
    link = tmp_path / f".helper.so.{owner}-{dead}.zzzzzzzz.tmpdir"
    link.symlink_to(elsewhere)
    removed = temp_files.remove_stale(target)
    assert sorted(removed) == sorted([dead_dir])
    assert theirs.is_dir() and link.is_symlink() and (elsewhere / "keep").exists()
