"""A process's private folders in the system temp dir (generated Triton kernels where the cache
folder is off or unsafe, a compiled helper's build there) are removed at its exit; one killed
by ``kill -9`` left its folder for good. The next process that makes one of that kind removes
the folders of dead processes, and those of unknown ones once 10 days unchanged; never a running
process's, never anything else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dnntune import _temp_files
from dnntune._temp_files import PRIVATE_STALE_AGE_S, remove_stale_private
from dnntune.backend import native
from dnntune.providers.triton.kernels import codegen

#: a process that makes its private folder as dnntune does, says where, and waits to be killed
_TRITON = """
from dnntune.providers.triton.kernels import codegen
module = codegen.load_module("killed", "VALUE = 1\\n")
print(module.__file__, flush=True)
import sys; sys.stdin.readline()
"""
_NATIVE = """
from pathlib import Path
from dnntune.backend import native
def build(folder, cxx=False, helper=None):  # a compile that takes its time
    print(folder, flush=True)
    import sys; sys.stdin.readline()
native.build = build
native._built(False)
"""


_procs: list[subprocess.Popen[str]] = []


@pytest.fixture
def system_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The system temp dir of this process and of the processes it starts (each ended at the
    test's end, whatever became of the test)."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    monkeypatch.setattr(codegen, "_LOADED", {})
    monkeypatch.setattr(codegen, "_PRIVATE_DIR", [])
    yield folder
    while _procs:
        _end(_procs.pop(), kill=False)


def _started(script: str) -> tuple[subprocess.Popen[str], Path]:
    """A process running ``script`` and the private folder it made."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    _procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, "the process made no private folder"
    path = Path(line)
    return proc, path if path.is_dir() else path.parent


def _end(proc: subprocess.Popen[str], kill: bool) -> None:
    if proc in _procs:
        _procs.remove(proc)
    if kill:
        proc.send_signal(signal.SIGKILL)
    else:
        assert proc.stdin is not None
        proc.stdin.close()
    proc.wait(timeout=60)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def test_a_killed_processs_kernel_folder_goes_when_the_next_is_made(system_tmp: Path) -> None:
    killed, left = _started(_TRITON)
    running, alive = _started(_TRITON)
    assert left.parent == system_tmp and left.name.startswith("dnntune-triton-kernels-")
    _end(killed, kill=True)
    assert left.is_dir()  # what kill -9 leaves
    module = codegen.load_module("next", "VALUE = 2\n")
    assert module.VALUE == 2
    assert not left.exists()
    assert alive.is_dir()  # a running process's folder is its own, however old
    _end(running, kill=False)
    assert not alive.exists()  # removed at its exit, as before


def test_a_build_folder_of_a_helper_killed_mid_build_goes_at_the_next_build(
    system_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed, left = _started(_NATIVE)
    assert left.parent == system_tmp and left.name.startswith("dnntune-native-")
    _end(killed, kill=True)
    assert left.is_dir()
    seen: list[Path] = []

    def build(folder: Path, cxx: bool = False, helper: object = None) -> Path:
        seen.append(folder)
        raise OSError("no compiler here")

    monkeypatch.setattr(native, "build", build)
    with pytest.raises(OSError, match="no compiler"):
        native._built(False)
    assert not left.exists()
    assert seen and not seen[0].exists()  # this build's own folder went with its end


def _folder(system_tmp: Path, name: str, age_s: float) -> Path:
    path = system_tmp / name
    path.mkdir()
    (path / "k.py").write_text("VALUE = 0\n")
    then = time.time() - age_s
    os.utime(path / "k.py", (then, then))
    os.utime(path, (then, then))
    return path


def test_unknown_processes_folders_go_only_after_10_days(system_tmp: Path) -> None:
    old = PRIVATE_STALE_AGE_S + 3600
    legacy_old = _folder(system_tmp, "dnntune-triton-kernels-abcd_123", old)
    legacy_new = _folder(system_tmp, "dnntune-triton-kernels-wxyz9876", 3 * 24 * 3600.0)
    other_old = _folder(system_tmp, "dnntune-triton-kernels-0000beef-42-qwerty12", old)
    touched = _folder(system_tmp, "dnntune-triton-kernels-1111beef-42-qwerty12", old)
    (touched / "k.py").touch()  # a kernel added today: its process is at work
    assert sorted(remove_stale_private("triton-kernels")) == sorted([legacy_old, other_old])
    assert legacy_new.is_dir() and touched.is_dir()


def test_nothing_else_in_the_temp_dir_is_touched(system_tmp: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = _temp_files._owner()
    old = PRIVATE_STALE_AGE_S * 3
    keep = [
        _folder(system_tmp, f"dnntune-native-{owner}-{dead.pid}-abcd1234", old),  # other kind
        _folder(system_tmp, "tmpabcd1234", old),  # another program's
        _folder(system_tmp, f"dnntune-triton-kernels-{owner}-{dead.pid}-abcd1234-mine", old),
        _folder(system_tmp, "elsewhere", old),
    ]
    (system_tmp / f"dnntune-triton-kernels-{owner}-{dead.pid}-file0000").write_text("a file")
    link = system_tmp / f"dnntune-triton-kernels-{owner}-{dead.pid}-link0000"
    link.symlink_to(keep[3], target_is_directory=True)
    assert remove_stale_private("triton-kernels") == []
    assert all((p / "k.py").exists() for p in keep)
    assert link.is_symlink()
    assert (system_tmp / f"dnntune-triton-kernels-{owner}-{dead.pid}-file0000").is_file()
