"""``dnntune cache show | clear``: there was no command to see or clear what dnntune keeps in its
cache folder (file-formats.md said to delete folders by hand). A new user's cases: an empty or
missing folder, a file another process is writing (its lock held), a file that cannot be
removed, a cache folder setting that names a file; each says what, where and what to try, loses
nothing that is not dnntune's cache, and exits 0, 1 or 2 as cli.md says."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune._version import __version__

Cli = Callable[..., Result]
RANKING = "0123abcd" * 5 + "cpu.jsonl"
PLAN = "ab" * 20 + ".plan"
KERNEL = "pw_0123456789abcdef0123.py"
HELPER = "_dnntune_reader_0123.cpython-311-x86_64-linux-gnu.so"


def _cache() -> Path:
    return Path(os.environ["DNNTUNE_CACHE_DIR"])


def _fill() -> dict[str, Path]:
    """A cache folder as dnntune leaves it, with a few things of the user's in it."""
    root = _cache()
    files = {
        "ranking": root / "autotune-rankings" / __version__ / RANKING,
        "old ranking": root / "autotune-rankings" / "0.0.9" / RANKING,
        "find db": root / "cudnn-find-db" / __version__ / "dev.jsonl",
        "plan": root / "cudnn-plans" / __version__ / PLAN,
        "perf db": root / "triton-perf-db" / "pointwise.jsonl",
        "kernel": root / "triton-kernels" / KERNEL,
        "helper": root / "native" / HELPER,
        "corrupt": root / "autotune-rankings" / __version__ / f"{RANKING}.corrupt-1700000000",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x" * 100)
    (root / "autotune-rankings" / __version__ / f".{RANKING}.lock").touch()
    (root / "cudnn-find-db" / __version__ / "dev.jsonl.lock").touch()
    return files


def _users(root: Path) -> list[Path]:
    mine = [
        root / "my-notes.txt",
        root / "autotune-rankings" / "0.0.9" / "notes.txt",
        root / "autotune-rankings" / __version__ / f"{RANKING}.unsaved-1700000000",
        root / "autotune-rankings" / "backup" / RANKING,
    ]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    return mine


def test_an_empty_or_missing_cache_folder_is_nothing_to_clear(cli: Cli, tmp_path: Path) -> None:
    for root in (_cache(), tmp_path / "never-made"):
        env = {"DNNTUNE_CACHE_DIR": str(root)}
        res = cli("cache", "clear", env=env)
        assert res.exit_code == 0, res.output
        assert f"nothing to clear: no dnntune cache files in {root}" in res.output
        res = cli("cache", "show", env=env)
        assert res.exit_code == 0, res.output
        assert f"cache folder: {root}" in res.output
    assert not (tmp_path / "never-made").exists()


def test_show_then_clear_removes_dnntunes_files_only(cli: Cli) -> None:
    files, mine = _fill(), _users(_cache())
    res = cli("cache", "show")
    assert res.exit_code == 0, res.output
    assert f"0.0.9, {__version__} (this one)" in res.output
    assert "autotune-rankings" in res.output and "native" in res.output
    assert str(mine[1]) in res.output  # named as not dnntune's
    res = cli("cache", "clear")
    assert res.exit_code == 0, res.output
    assert f"removed {len(files)} cache files (800 bytes) from {_cache()}" in res.output
    assert [p for p in files.values() if p.exists()] == []
    assert all(p.read_text() == "mine" for p in mine)
    assert "kept what dnntune did not write" in res.output
    # the locks stay (a waiting writer holds them open), and with them their folders
    assert (_cache() / "autotune-rankings" / __version__ / f".{RANKING}.lock").exists()
    assert not (_cache() / "cudnn-plans" / __version__).exists()  # emptied: removed


def test_other_versions_only(cli: Cli) -> None:
    files = _fill()
    res = cli("cache", "clear", "--other-versions")
    assert res.exit_code == 0, res.output
    assert "removed 1 other versions' cache file (100 bytes)" in res.output
    assert not files["old ranking"].exists()
    assert all(p.exists() for name, p in files.items() if name != "old ranking")


_HOLD = """
import sys
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_file_another_process_is_writing_is_kept_and_named(cli: Cli) -> None:
    files = _fill()
    lock = files["ranking"].with_name(f".{RANKING}.lock")
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        res = cli("cache", "clear")
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert res.exit_code == 1, res.output
    assert files["ranking"].exists()
    assert "kept 1 file another process is writing (its lock is held)" in res.output
    assert str(files["ranking"]) in res.output and "again once it has finished" in res.output
    assert not files["plan"].exists()  # the rest was cleared
    res = cli("cache", "clear")
    assert res.exit_code == 0, res.output
    assert not files["ranking"].exists()


def test_a_file_that_cannot_be_removed_is_named_with_what_to_try(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _fill()
    stuck = files["kernel"]
    real = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self == stuck:  # a read-only folder (which root, running these tests, ignores)
            raise PermissionError(13, "Permission denied", str(self))
        real(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    res = cli("cache", "clear")
    assert res.exit_code == 1, res.output
    assert f"{stuck}: not removed: Permission denied" in res.output
    assert f"check that you may write to {stuck.parent}" in res.output
    assert stuck.read_text() == "x" * 100
    assert [p for p in files.values() if p.exists()] == [stuck]


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes files from read-only folders")
def test_a_read_only_cache_folder(cli: Cli) -> None:
    files = _fill()
    folder = files["kernel"].parent
    folder.chmod(0o555)
    try:
        res = cli("cache", "clear")
    finally:
        folder.chmod(0o755)
    assert res.exit_code == 1, res.output
    assert f"{files['kernel']}: not removed: Permission denied" in res.output
    assert files["kernel"].exists()


@pytest.mark.parametrize("under", [False, True])
def test_a_cache_folder_setting_that_names_a_file(cli: Cli, tmp_path: Path, under: bool) -> None:
    a_file = tmp_path / "cache.txt"
    a_file.write_text("not a folder")
    root = a_file / "dnntune" if under else a_file
    for command in ("show", "clear"):
        res = cli("cache", command, env={"DNNTUNE_CACHE_DIR": str(root)})
        assert res.exit_code == 2, res.output
        said = "a file stands above it" if under else "it is a file, not a folder"
        assert f"error: {root} (DNNTUNE_CACHE_DIR): {said}" in res.output
        assert "set DNNTUNE_CACHE_DIR to a folder" in res.output
        assert "Traceback" not in res.output
    assert a_file.read_text() == "not a folder"


def test_a_running_writers_temporary_file_stays(cli: Cli) -> None:
    from dnntune import _temp_files

    files = _fill()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = _temp_files._owner()
    folder = files["ranking"].parent
    running = folder / f".{RANKING}.{owner}-{os.getpid()}.abcd1234.tmp"
    left = folder / f".{RANKING}.{owner}-{dead.pid}.abcd1234.tmp"
    running.write_text("half")
    left.write_text("half")
    res = cli("cache", "clear")
    assert res.exit_code == 0, res.output
    assert running.exists() and not left.exists()
