"""``dnntune overrides merge`` / ``generalize`` lose no entry and refuse what they cannot do.

- The output is read under its lock (``.<file>.lock``, the writers' lock): an entry that a
  concurrent ``dnntune tune -o`` adds while a merge or generalize runs is kept.
- An existing output that is not an input is merged in first (as ``tune -o`` appends);
  ``--overwrite`` replaces it.
- An output that cannot be written is a usage error (exit 2), checked before any work.
- Messages say what is true: a ``"version": 1`` file has a version key; a generalize of one
  file replaces entries by later entries of the same file.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from overrides_helpers import conv_graph, matmul_graph, pointwise_graph, result, write_winner
from typer.testing import CliRunner

import dnntune.overrides.merge as merge_module
from dnntune.cli.overrides_cmd import app as overrides_app
from dnntune.errors import ConfigFileError
from dnntune.overrides.format import dumps
from dnntune.overrides.merge import merge_files
from dnntune.overrides.store import atomic_write_text, lock_path, locked
from dnntune.overrides.writer import build_entry


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def _engines(path: Path) -> list[str]:
    return [e["engine_name"] for e in json.loads(path.read_text())["engine_overrides"]]


def _two_entries(path: Path, conv: str = "CONV", mm: str = "MM") -> Path:
    write_winner(conv_graph(), path, conv)
    write_winner(matmul_graph(), path, mm)
    return path


# ---- 1. the output is read under its lock --------------------------------------------------


class _ConcurrentWriter:
    """A ``dnntune tune -o`` stand-in that holds the file's lock and appends an entry exactly
    when the merge asks for the lock: after a merge that read the file before locking it
    (the race), before one that reads it under the lock."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.held = threading.Event()
        self.merge_wants_lock = threading.Event()
        self.appended = False
        self.error: BaseException | None = None
        real_locked = merge_module.locked

        def spying_locked(p: str | Path, *args: Any, **kwargs: Any) -> AbstractContextManager[None]:
            self.merge_wants_lock.set()
            return real_locked(p, *args, **kwargs)

        monkeypatch.setattr(merge_module, "locked", spying_locked)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with locked(self.path):  # the lock `dnntune tune -o` holds while it writes
                self.held.set()
                if not self.merge_wants_lock.wait(10):
                    return
                entry = build_entry(pointwise_graph(), result("TUNED_MEANWHILE"))
                doc = json.loads(self.path.read_text())
                doc["engine_overrides"].append(entry)
                atomic_write_text(self.path, dumps(doc))
                self.appended = True
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc
            self.held.set()

    def __enter__(self) -> _ConcurrentWriter:
        self.thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(10)
        assert not self.thread.is_alive()
        assert self.error is None, self.error
        assert self.appended


def test_the_writers_lock_blocks_the_merges_lock(tmp_path: Path) -> None:
    """The premise of the tests below: a second holder of ``locked`` waits, in one process too."""
    path = tmp_path / "o.json"
    with (
        locked(path),
        pytest.raises(ConfigFileError, match="another process"),
        locked(path, timeout_s=0.05),
    ):
        pass  # pragma: no cover - not reached: the second lock times out
    assert lock_path(path).name == ".o.json.lock"


def test_generalize_in_place_keeps_an_entry_a_concurrent_tune_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _two_entries(tmp_path / "race.json")
    with _ConcurrentWriter(path, monkeypatch):
        merge_files([path], path, wildcard_batch=True)
    assert sorted(_engines(path)) == ["CONV", "MM", "TUNED_MEANWHILE"]
    assert json.loads(path.read_text())["engine_overrides"][0]["tensors"][0]["dim"][0] == -1


@pytest.mark.parametrize("command", ["generalize", "merge-into-input", "merge-into-existing"])
def test_cli_keeps_an_entry_a_concurrent_tune_appends_to_the_output(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    out = _two_entries(tmp_path / "race.json")
    other = tmp_path / "other.json"
    write_winner(conv_graph(n=4), other, "OTHER")
    args = {
        "generalize": ["generalize", str(out)],
        "merge-into-input": ["merge", str(out), str(other), "-o", str(out)],
        "merge-into-existing": ["merge", str(other), "-o", str(out)],
    }[command]
    with _ConcurrentWriter(out, monkeypatch):
        res = runner.invoke(overrides_app, args)
    assert res.exit_code == 0, res.output
    assert "TUNED_MEANWHILE" in _engines(out)
    assert {"CONV", "MM"} <= set(_engines(out))


def test_an_input_that_is_a_link_to_the_output_is_read_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _two_entries(tmp_path / "race.json")
    link = tmp_path / "link.json"
    link.symlink_to(path.name)
    with _ConcurrentWriter(path, monkeypatch):
        merge_files([link], path, wildcard_batch=True)
    assert "TUNED_MEANWHILE" in _engines(path)


# ---- 2. an existing output is kept (append), or replaced with --overwrite ------------------


def test_merge_into_an_existing_output_keeps_its_entries(tmp_path: Path) -> None:
    lib = _two_entries(tmp_path / "lib.json", conv="LIB_CONV", mm="LIB_MM")
    new = tmp_path / "new.json"
    write_winner(pointwise_graph(), new, "NEW_PW")
    write_winner(conv_graph(), new, "NEW_CONV")  # the same key as lib's conv: replaces it
    report = merge_files([new], lib)
    assert _engines(lib) == ["NEW_CONV", "LIB_MM", "NEW_PW"]  # lib's entries come first
    assert report.existing_entries == 2
    assert report.entries_read == 2
    assert (report.replaced, report.replaced_within_file) == (1, 0)
    (conflict,) = report.conflicts
    assert (conflict.kept_from, conflict.dropped_from) == (str(new), str(lib))


def test_merge_overwrite_replaces_an_existing_output(tmp_path: Path) -> None:
    lib = _two_entries(tmp_path / "lib.json")
    new = tmp_path / "new.json"
    write_winner(pointwise_graph(), new, "NEW_PW")
    report = merge_files([new], lib, overwrite=True)
    assert _engines(lib) == ["NEW_PW"]
    assert report.existing_entries is None


def test_cli_merge_appends_to_an_existing_output_and_says_so(
    runner: CliRunner, tmp_path: Path
) -> None:
    lib = _two_entries(tmp_path / "lib.json")
    new = tmp_path / "new.json"
    write_winner(pointwise_graph(), new, "NEW_PW")
    res = runner.invoke(overrides_app, ["merge", str(new), "-o", str(lib)])
    assert res.exit_code == 0, res.output
    assert _engines(lib) == ["CONV", "MM", "NEW_PW"]
    assert "wrote 3 entries" in res.output and "2 entries already in it" in res.output
    res = runner.invoke(overrides_app, ["merge", str(new), "-o", str(lib), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert _engines(lib) == ["NEW_PW"]
    assert "already in it" not in res.output


def test_cli_generalize_into_another_existing_file_keeps_its_entries(
    runner: CliRunner, tmp_path: Path
) -> None:
    lib = _two_entries(tmp_path / "lib.json", conv="LIB_CONV", mm="LIB_MM")
    src = tmp_path / "src.json"
    write_winner(pointwise_graph(), src, "SRC_PW")
    res = runner.invoke(overrides_app, ["generalize", str(src), "-o", str(lib)])
    assert res.exit_code == 0, res.output
    doc = json.loads(lib.read_text())
    assert [e["engine_name"] for e in doc["engine_overrides"]] == ["LIB_CONV", "LIB_MM", "SRC_PW"]
    # lib's own entries are kept as they were; the generalized input's entry has dim 0 = -1
    assert doc["engine_overrides"][0]["tensors"][0]["dim"][0] == 2
    assert doc["engine_overrides"][2]["tensors"][0]["dim"][0] == -1
    assert _engines(src) == ["SRC_PW"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"engine_overrides": []}, "no version key"),
        ({"version": 2, "engine_overrides": [3]}, r"engine_overrides\[0\]"),
        ("{broken", "invalid JSON"),
    ],
)
def test_an_existing_output_that_cannot_be_merged_into_is_refused_and_left_untouched(
    runner: CliRunner, tmp_path: Path, content: object, fragment: str
) -> None:
    lib = tmp_path / "lib.json"
    lib.write_text(content if isinstance(content, str) else json.dumps(content))
    before = lib.read_text()
    new = tmp_path / "new.json"
    write_winner(pointwise_graph(), new, "NEW_PW")
    with pytest.raises(ConfigFileError, match=fragment):
        merge_files([new], lib)
    assert lib.read_text() == before
    res = runner.invoke(overrides_app, ["merge", str(new), "-o", str(lib)])
    assert res.exit_code == 1
    assert "--overwrite" in res.output and str(lib) in res.output
    assert lib.read_text() == before
    res = runner.invoke(overrides_app, ["merge", str(new), "-o", str(lib), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert _engines(lib) == ["NEW_PW"]


def test_an_empty_existing_output_is_a_fresh_one(tmp_path: Path) -> None:
    lib = tmp_path / "lib.json"
    lib.write_text("\n")
    new = tmp_path / "new.json"
    write_winner(pointwise_graph(), new, "NEW_PW")
    report = merge_files([new], lib)
    assert _engines(lib) == ["NEW_PW"]
    assert report.existing_entries == 0


# ---- 3. an output that cannot be written is a usage error, before any work ----------------


def _a_dir(tmp_path: Path) -> Path:
    d = tmp_path / "adir"
    d.mkdir()
    return d


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("x")
    return tmp_path / "plain" / "o.json"


def _loop(tmp_path: Path) -> Path:
    a, b = tmp_path / "loop_a", tmp_path / "loop_b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_a_dir, "is a directory"),
        (_under_a_file, "plain is not a directory"),
        (_loop, "Too many levels of symbolic links"),
    ],
)
@pytest.mark.parametrize("command", ["merge", "generalize"])
def test_an_unwritable_output_is_a_usage_error(
    runner: CliRunner,
    tmp_path: Path,
    make: Callable[[Path], Path],
    reason: str,
    command: str,
) -> None:
    src = tmp_path / "o1.json"
    write_winner(conv_graph(), src, "E")
    out = make(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    if command == "merge":
        args = ["merge", str(src), "-o", str(out)]
    else:
        args = ["generalize", str(src), "-o", str(out)]
    res = runner.invoke(overrides_app, args)
    assert res.exit_code == 2, res.output
    assert reason in res.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no lock, no temp file


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_an_output_in_a_read_only_folder_is_a_usage_error(
    runner: CliRunner, tmp_path: Path
) -> None:  # pragma: no cover - CI runs as a user
    src = tmp_path / "o1.json"
    write_winner(conv_graph(), src, "E")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        res = runner.invoke(overrides_app, ["merge", str(src), "-o", str(ro / "o.json")])
    finally:
        ro.chmod(0o700)
    assert res.exit_code == 2, res.output


def test_generalize_in_place_names_the_file_not_an_option_never_given(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unwritable FILE generalized in place blamed '-o' / '--output' (new-user audit,
    session 15: a read-only file system)."""
    import dnntune.cli.overrides_cmd as overrides_cmd

    src = tmp_path / "o1.json"
    write_winner(conv_graph(), src, "E")

    def read_only(path: Path) -> None:
        raise ConfigFileError(f"{path}: Read-only file system")

    monkeypatch.setattr(overrides_cmd, "check_writable", read_only)
    res = runner.invoke(overrides_app, ["generalize", str(src)])
    assert res.exit_code == 2, res.output
    assert "FILE (in place)" in res.output and "--output" not in res.output
    res = runner.invoke(overrides_app, ["generalize", str(src), "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 2 and "--output" in res.output


def test_merge_files_checks_the_output_before_reading_the_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{broken")
    with pytest.raises(ConfigFileError, match="is a directory"):
        merge_files([bad], _a_dir(tmp_path))


# ---- 6. messages say what is true ---------------------------------------------------------


def _v1_doc(**top: Any) -> dict[str, Any]:
    entry = {"op": "matmul", "engine_name": "E", "tensors": [{"dim": [4, 8]}, {"dim": [8, 16]}]}
    return {**top, "engine_overrides": [entry]}


def test_a_version_1_file_is_named_as_such(runner: CliRunner, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(_v1_doc(version=1)))
    res = runner.invoke(overrides_app, ["merge", str(v1), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 1
    assert "version 1 file" in res.output
    assert "no version key" not in res.output
    assert not (tmp_path / "x.json").exists()
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(_v1_doc()))
    res = runner.invoke(overrides_app, ["merge", str(legacy), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 1
    assert "legacy v1 file (no version key)" in res.output


def test_generalize_of_one_file_reports_later_entries_of_that_file(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "batches.json"
    write_winner(conv_graph(n=1), path, "N1")
    write_winner(conv_graph(n=8), path, "N8")
    res = runner.invoke(overrides_app, ["generalize", str(path)])
    assert res.exit_code == 0, res.output
    assert _engines(path) == ["N8"]
    assert "1 replaced by a later entry of the same file" in res.output
    assert "later file" not in res.output
    # the conflict names each entry's place, so "from" and "from" are not the same thing
    assert "engine_overrides[1]" in res.output and "engine_overrides[0]" in res.output
    again = tmp_path / "again.json"
    write_winner(conv_graph(n=1), again, "N1")
    write_winner(conv_graph(n=8), again, "N8")
    (conflict,) = merge_files([again], again, wildcard_batch=True).conflicts
    assert (conflict.kept_from, conflict.kept_index) == (str(again), 1)
    assert (conflict.dropped_from, conflict.dropped_index) == (str(again), 0)


def test_merge_of_two_files_reports_replacements_by_a_later_file(
    runner: CliRunner, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_winner(conv_graph(), a, "A")
    write_winner(conv_graph(), b, "B")
    res = runner.invoke(overrides_app, ["merge", str(a), str(b), "-o", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    assert "1 replaced by a later file's entry" in res.output
    assert "same file" not in res.output


def test_nothing_replaced_is_said_plainly(runner: CliRunner, tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    write_winner(conv_graph(), a, "A")
    res = runner.invoke(overrides_app, ["generalize", str(a)])
    assert res.exit_code == 0, res.output
    assert "none replaced" in res.output


def test_a_folder_in_the_lock_files_place_says_what_to_do(tmp_path: Path) -> None:
    """A folder where the lock file goes read only 'cannot lock: Is a directory'."""
    target = tmp_path / "o.json"
    lock_path(target).mkdir()
    with (
        pytest.raises(ConfigFileError, match="remove the folder or write the file elsewhere"),
        locked(target),
    ):
        pass
