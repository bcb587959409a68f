"""The JSON-lines stores (cuDNN find db, Triton perf db): many writers at once lose nothing,
the last record wins, and torn or foreign lines are skipped rather than crashing a lookup."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dnntune.overrides import store as store_module
from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord
from dnntune.providers.triton.perf_db import PerfDb, PerfKey, PerfRecord

WRITER = Path(__file__).with_name("_writer.py")
WRITERS = 8


def _find_key(tag: int) -> FindDbKey:
    return FindDbKey(f"graph{tag}", "dev", 91900, "1.16.0", "a", 0)


def _perf_key(tag: int) -> PerfKey:
    return PerfKey("matmul", {"m": tag}, {"name": "dev"}, {"triton": "3.6"})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["find_db", "perf_db"])
def test_concurrent_writers_lose_nothing(tmp_path: Path, kind: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, str(WRITER), kind, str(tmp_path), str(i)])
        for i in range(WRITERS)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    for i in range(WRITERS):
        for n in range(5):
            tag = i * 100 + n
            if kind == "find_db":
                found = FindDb(tmp_path).lookup(_find_key(tag))
                assert found is not None and found.plan_name == f"eng{tag}"
            else:
                record = PerfDb(tmp_path).lookup(_perf_key(tag))
                assert record is not None and record.config == {"block_m": 64 + tag}


def test_find_db_last_record_wins_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    db = FindDb(tmp_path)
    key = _find_key(1)
    assert db.record(key, FindDbRecord("eng1", 1, 0, 2.0))
    assert db.record(key, FindDbRecord("eng2", 2, 0, 1.0))
    path = db.path_for(key)
    with path.open("a") as f:
        f.write('{"key": "torn", "value": {"plan_na')  # a writer killed mid-line
        f.write("\nnot json at all\n")
    found = db.lookup(key)
    assert found is not None and found.plan_name == "eng2"
    assert db.lookup(_find_key(2)) is None


def test_perf_db_round_trip_and_corrupt_lines(tmp_path: Path) -> None:
    db = PerfDb(tmp_path)
    key = _perf_key(1)
    db.store(key, PerfRecord({"block_m": 64}, 2.0))
    db.store(key, PerfRecord({"block_m": 128}, 1.0))
    path = db.path_for("matmul")
    with path.open("a") as f:
        f.write("{broken\n[1, 2, 3]\n")
    record = db.lookup(key)
    assert record is not None and record.config == {"block_m": 128}
    assert db.lookup(_perf_key(2)) is None


@pytest.mark.parametrize("kind", ["find_db", "perf_db"])
def test_a_torn_last_line_or_stray_bytes_lose_no_later_record(tmp_path: Path, kind: str) -> None:
    """A writer killed mid-append leaves a line without its newline; the next record must not
    be glued to it. A byte that is not UTF-8 spoils its own line only."""
    first, second = (1, "eng1", {"block_m": 65}), (2, "eng2", {"block_m": 66})
    find, perf = FindDb(tmp_path), PerfDb(tmp_path)

    def write(tag: int, name: str, config: dict[str, int]) -> None:
        if kind == "find_db":
            assert find.record(_find_key(tag), FindDbRecord(name, tag, 0, 1.0))
        else:
            perf.store(_perf_key(tag), PerfRecord(config, 1.0))

    def read(tag: int) -> object:
        if kind == "find_db":
            found = find.lookup(_find_key(tag))
            return None if found is None else found.plan_name
        record = perf.lookup(_perf_key(tag))
        return None if record is None else record.config

    write(*first)
    path = find.path_for(_find_key(1)) if kind == "find_db" else perf.path_for("matmul")
    with path.open("ab") as f:
        f.write(b'{"key": "torn", "val')  # no newline: the writer died here
    write(*second)
    assert read(2) == second[1 + (kind == "perf_db")]
    with path.open("ab") as f:
        f.write(b"\xff\xfe not utf-8\n")
    assert read(1) == first[1 + (kind == "perf_db")]
    assert read(2) == second[1 + (kind == "perf_db")]


def test_a_perf_db_that_cannot_be_written_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    db = PerfDb(blocker / "perf")  # its folder cannot be made: as on a read-only cache
    db.store(_perf_key(1), PerfRecord({"block_m": 64}, 1.0))
    assert "not written" in caplog.text
    assert db.lookup(_perf_key(1)) is None


def test_perf_db_record_with_a_malformed_field_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = PerfDb(tmp_path)
    key = _perf_key(1)
    db.store(key, PerfRecord({"block_m": 64}, 2.0))
    path = db.path_for("matmul")
    last = json.loads(path.read_text().splitlines()[-1])
    last["time_ms"] = None  # a hand edit or a foreign writer
    with path.open("a") as f:
        f.write(json.dumps(last) + "\n")
    assert db.lookup(key) is None  # the newest record cannot be read: search again
    assert "malformed" in caplog.text


def test_perf_db_delete_keeps_other_lines_the_file_mode_and_stray_bytes(tmp_path: Path) -> None:
    db = PerfDb(tmp_path)
    db.store(_perf_key(1), PerfRecord({"block_m": 64}, 2.0))
    db.store(_perf_key(2), PerfRecord({"block_m": 32}, 1.0))
    path = db.path_for("matmul")
    path.chmod(0o644)
    with path.open("ab") as f:
        f.write(b'{"junk": "\xff"}\n')  # not UTF-8: delete used to raise
    assert db.delete(_perf_key(1)) == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # was 0600 after a delete
    assert db.lookup(_perf_key(1)) is None
    record = db.lookup(_perf_key(2))
    assert record is not None and record.config == {"block_m": 32}
    assert len(path.read_text(encoding="utf-8", errors="replace").splitlines()) == 2


def test_perf_db_delete_that_cannot_write_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert PerfDb(blocker / "perf").delete(_perf_key(1)) == 0
    assert "not cleaned" in caplog.text


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelname == "WARNING" and text in r.getMessage())


def test_a_cache_that_cannot_be_written_warns_once_and_says_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every store to a read-only or full cache failed alike, each with its own WARNING and no
    advice; one warning per folder names what to set, later ones are DEBUG."""
    caplog.set_level("DEBUG")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    perf = PerfDb(blocker / "perf")
    for tag in range(3):
        perf.store(_perf_key(tag), PerfRecord({"block_m": 64}, 1.0))
    assert _warnings(caplog, "not written") == 1
    assert "DNNTUNE_CACHE_DIR" in caplog.text
    find = FindDb(blocker / "find")
    for tag in range(3):
        assert not find.record(_find_key(tag), FindDbRecord("eng", 1, 0, 1.0))
    assert _warnings(caplog, "cudnn find db") == 1


def test_a_torn_perf_db_line_warns_once_not_on_every_lookup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer killed mid-line leaves a torn line, which every later lookup of the kernel
    read again and warned about again."""
    db = PerfDb(tmp_path)
    db.store(_perf_key(1), PerfRecord({"block_m": 64}, 1.0))
    with db.path_for("matmul").open("a") as f:
        f.write('{"key": "torn", "con')
    for _ in range(3):
        assert db.lookup(_perf_key(1)) is not None
    assert _warnings(caplog, "is not JSON") == 1


def test_a_cache_folder_that_is_a_file_warns_once_on_lookup_and_says_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """DNNTUNE_CACHE_DIR naming a file made every lookup fail with "Not a directory": one
    warning per kernel's perf db file and per device's find db file, none saying what to set
    (new-user audit, session 57); one warning per database now names DNNTUNE_CACHE_DIR."""
    caplog.set_level("DEBUG")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    perf = PerfDb(blocker / "perf")
    for kernel in ("matmul", "layernorm", "softmax"):
        key = PerfKey(kernel, {"m": 1}, {"name": "dev"}, {"triton": "3.6"})
        assert perf.lookup(key) is None
    assert _warnings(caplog, "triton perf db") == 1
    find = FindDb(blocker / "find")
    for device in ("dev0", "dev1", "dev2"):
        key = FindDbKey("graph", device, 91900, "1.16.0", "a", 0)
        assert find.lookup(key) is None
    assert _warnings(caplog, "cudnn find db") == 1
    assert _warnings(caplog, "DNNTUNE_CACHE_DIR") == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # Python's json reads these; int() of them raised OverflowError out of the plan's build
        ("plan_index", "Infinity"),
        ("workspace_bytes", "1e400"),
        ("cudnn_knobs", '{"k2": -Infinity}'),
        # taken before, as another type or a value no search measures
        ("plan_name", "7"),
        ("plan_index", "true"),
        ("plan_index", "2.7"),
        ("plan_index", "-1"),
        ("median_time_ms", "NaN"),
        ("cudnn_knobs", "[[1, 2]]"),
    ],
)
def test_a_find_db_record_of_wrong_types_is_skipped_for_the_one_before(
    tmp_path: Path, field: str, value: str
) -> None:
    db = FindDb(tmp_path)
    key = _find_key(1)
    assert db.record(key, FindDbRecord("eng1", 1, 0, 2.0))
    path = db.path_for(key)
    entry = json.loads(path.read_text())
    entry["value"][field] = "@@"
    with path.open("a") as f:  # the newest record, hand-edited
        f.write(json.dumps(entry).replace('"@@"', value) + "\n")
    found = db.lookup(key)
    assert found is not None and found.plan_name == "eng1" and found.plan_index == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("candidates", "Infinity"), ("written_at", "NaN"), ("time_ms", "-Infinity")],
)
def test_a_perf_db_record_with_a_non_finite_number_is_malformed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, value: str
) -> None:
    db = PerfDb(tmp_path)
    key = _perf_key(1)
    db.store(key, PerfRecord({"block_m": 64}, 2.0))
    path = db.path_for("matmul")
    last = json.loads(path.read_text().splitlines()[-1])
    last[field] = "@@"
    with path.open("a") as f:
        f.write(json.dumps(last).replace('"@@"', value) + "\n")
    assert db.lookup(key) is None  # searched again, not an OverflowError out of the build
    assert "malformed" in caplog.text


def _record(db: FindDb | PerfDb, tag: int, value: int) -> None:
    if isinstance(db, FindDb):
        assert db.record(_find_key(tag), FindDbRecord(f"eng{value}", value, 0, 1.0))
    else:
        db.store(_perf_key(tag), PerfRecord({"block_m": value}, 1.0))


def _found(db: FindDb | PerfDb, tag: int) -> int | None:
    if isinstance(db, FindDb):
        found = db.lookup(_find_key(tag))
        return None if found is None else found.plan_index
    record = db.lookup(_perf_key(tag))
    return None if record is None else record.config["block_m"]


@pytest.mark.parametrize("kind", ["find_db", "perf_db"])
def test_a_store_searched_again_and_again_stays_bounded_and_keeps_each_keys_last_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Each search appends a line and the last line of a key wins: a process that searched on
    every start (``global.benchmarking=1``) grew the file for good, one line per graph per run,
    and every lookup read all of it."""
    monkeypatch.setattr(store_module, "COMPACT_MIN_BYTES", 4096)
    db: FindDb | PerfDb = FindDb(tmp_path) if kind == "find_db" else PerfDb(tmp_path)
    path = db.path_for(_find_key(0)) if isinstance(db, FindDb) else db.path_for("matmul")
    for run in range(200):
        for tag in range(3):
            _record(db, tag, run * 10 + tag)
        if run == 100:
            with path.open("a") as f:
                f.write('{"key": "torn", "val')  # a writer killed mid-line
    assert path.stat().st_size < 2 * 4096
    assert len(path.read_text().splitlines()) < 100
    assert [_found(db, tag) for tag in range(3)] == [1990, 1991, 1992]
    assert "torn" not in path.read_text()


def test_a_small_or_mostly_live_file_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "db.jsonl"
    lines = [json.dumps({"key": f"k{i}", "v": i}) for i in range(10)]
    path.write_text("\n".join([*lines, lines[0]]) + "\n")
    before = path.stat()
    assert store_module.compact_lines(path, store_module.json_line_key) == 0  # small
    assert store_module.compact_lines(path, store_module.json_line_key, min_bytes=0) == 0
    assert path.stat().st_ino == before.st_ino  # 10 of 11 lines live: left alone


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["find_db", "perf_db"])
def test_writers_compacting_at_once_lose_no_record(tmp_path: Path, kind: str) -> None:
    """Four processes rewrite the same keys 30 times each, compacting on every append, while
    this one looks them up: every lookup after the first write finds a record, and at the end
    each key holds one of the values written last."""
    procs = [
        subprocess.Popen([sys.executable, str(WRITER), kind, str(tmp_path), str(i), "30"])
        for i in range(4)
    ]
    db: FindDb | PerfDb = FindDb(tmp_path) if kind == "find_db" else PerfDb(tmp_path)
    seen_all = False
    while any(p.poll() is None for p in procs):
        found = [_found(db, i * 100 + n) for i in range(4) for n in range(3)]
        if all(f is not None for f in found):
            seen_all = True
        elif seen_all:
            pytest.fail(f"a record went missing mid-compaction: {found}")
    assert all(p.wait(timeout=120) == 0 for p in procs)
    for i in range(4):
        for n in range(3):
            tag = i * 100 + n
            expected = tag if kind == "find_db" else 64 + tag
            assert _found(db, tag) == expected
    lines = db.path_for(_find_key(0)) if isinstance(db, FindDb) else db.path_for("matmul")
    assert len(lines.read_text().splitlines()) <= 2 * 12
