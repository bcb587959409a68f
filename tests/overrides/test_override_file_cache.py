"""The override file is parsed once per state of the file (dnntune.overrides.file_cache).

The Config policy and dnntune.torch ask the file about every graph; each ask used to read and
parse it again (new-user audit: 44 ms per new shape with a 91-entry file on a busy CPU).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from overrides_helpers import FakeEngine, conv_graph, matmul_graph

from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import HeuristicMode
from dnntune.errors import ConfigFileError
from dnntune.overrides import file_cache
from dnntune.overrides import format as override_format
from dnntune.overrides.file_cache import load_file_cached
from dnntune.overrides.format import OverrideFile
from dnntune.overrides.policy import ConfigPolicy, match_override_file

#: a modification time well outside the cache's racy window
_OLD_NS = time.time_ns() - 3600 * 1_000_000_000


def _entry(engine: str, op: str = "matmul") -> dict[str, Any]:
    return {
        "op": op,
        "engine_name": engine,
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [4, 8], "stride": [8, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [8, 16], "stride": [16, 1]},
        ],
        "autotune_metadata": {"rank": 0, "min_time_ms": 0.5},
    }


def _write(path: Path, text: str, mtime_ns: int | None = _OLD_NS) -> Path:
    """Write ``text``; with ``mtime_ns``, date the file then (None: leave it just written)."""
    path.write_text(text)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def _doc(*engines: str) -> str:
    return json.dumps({"version": 2, "engine_overrides": [_entry(e) for e in engines]})


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources :func:`override_format.parse_text` was called for (each one a parse)."""
    calls: list[str] = []
    parse_text = override_format.parse_text

    def counted(text: str, source: str = "") -> OverrideFile:
        calls.append(source)
        return parse_text(text, source)

    monkeypatch.setattr(override_format, "parse_text", counted)
    return calls


def _engines(config: OverrideFile) -> list[str]:
    return [e.engine_name for e in config.entries]


def _uncached_error(path: Path) -> str:
    with pytest.raises(ConfigFileError) as info:
        override_format.load_file(path)
    return str(info.value)


def test_two_reads_of_an_unchanged_file_parse_it_once(tmp_path: Path, parses: list[str]) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A", "FAKE_B"))
    first = load_file_cached(path)
    second = load_file_cached(path)
    assert second is first and _engines(first) == ["FAKE_A", "FAKE_B"]
    assert parses == [str(path)]
    # the policy's reads go through the cache: two graphs, still one parse
    assert match_override_file(matmul_graph(), path) is not None
    assert match_override_file(conv_graph(), path) is None
    assert parses == [str(path)]


def test_a_same_size_rewrite_is_seen(tmp_path: Path, parses: list[str]) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    assert _engines(load_file_cached(path)) == ["FAKE_A"]
    _write(path, _doc("FAKE_B"), _OLD_NS + 1)  # same size, same inode, mtime one ns later
    assert _engines(load_file_cached(path)) == ["FAKE_B"]
    assert len(parses) == 2


def test_a_replace_by_rename_is_seen_even_with_the_same_size_and_mtime(
    tmp_path: Path, parses: list[str]
) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    assert _engines(load_file_cached(path)) == ["FAKE_A"]
    new = _write(tmp_path / "o.json.tmp", _doc("FAKE_B"))  # as the writer replaces files
    os.replace(new, path)
    assert _engines(load_file_cached(path)) == ["FAKE_B"]
    assert len(parses) == 2


def test_a_file_written_a_moment_ago_is_parsed_on_every_read(
    tmp_path: Path, parses: list[str]
) -> None:
    """Timestamps are coarse: a same-size rewrite within one tick keeps the mtime, so a file
    younger than the racy window is not kept."""
    path = _write(tmp_path / "o.json", _doc("FAKE_A"), mtime_ns=None)
    load_file_cached(path)
    assert _engines(load_file_cached(path)) == ["FAKE_A"]
    stat = path.stat()
    _write(path, _doc("FAKE_B"), mtime_ns=stat.st_mtime_ns)  # same size, same mtime
    assert _engines(load_file_cached(path)) == ["FAKE_B"]
    assert len(parses) == 3


def test_a_deleted_file_is_seen_and_errs_as_before(
    tmp_path: Path,
    parses: list[str],
    caplog: pytest.LogCaptureFixture,
    handle: Handle,
    cands: list[FakeEngine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    assert _engines(load_file_cached(path)) == ["FAKE_A"]
    path.unlink()
    expected = _uncached_error(path)
    assert "cannot read" in expected
    for _ in range(2):
        with pytest.raises(ConfigFileError) as info:
            load_file_cached(path)
        assert str(info.value) == expected
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.WARNING, logger="dnntune.overrides.policy"):
        assert ConfigPolicy().order(matmul_graph(), handle, cands, HeuristicMode.A) is None
    assert "file unusable" in caplog.text and "cannot read" in caplog.text
    _write(path, _doc("FAKE_C"))  # created again: read again
    assert _engines(load_file_cached(path)) == ["FAKE_C"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "invalid JSON"),
        ("", "the file is empty"),
        (
            json.dumps(
                {"version": 2, "engine_overrides": [{**_entry("FAKE_A"), "x": float("nan")}]}
            ),
            "engine_overrides[0].x: not a finite number",
        ),
    ],
    ids=["corrupt", "empty", "nan"],
)
def test_a_bad_file_errs_on_every_read_and_a_fix_is_seen(
    tmp_path: Path, parses: list[str], text: str, fragment: str
) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    load_file_cached(path)
    _write(path, text, _OLD_NS + 1)
    expected = _uncached_error(path)
    assert fragment in expected
    parsed_before = len(parses)
    for _ in range(3):
        with pytest.raises(ConfigFileError) as info:
            load_file_cached(path)
        assert str(info.value) == expected
    assert len(parses) == parsed_before + 3  # a failure is never kept
    _write(path, _doc("FAKE_B"), _OLD_NS + 2)
    assert _engines(load_file_cached(path)) == ["FAKE_B"]


def test_callers_cannot_change_what_later_reads_see(tmp_path: Path, parses: list[str]) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A", "FAKE_B"))
    found = match_override_file(matmul_graph(), path)
    assert found is not None
    match, config = found
    assert config.entries[match.index] is match.entry
    assert match.entry.metadata is not None
    match.entry.metadata["min_time_ms"] = 99.0
    match.entry.engine_name = "CHANGED"
    config.entries.clear()
    again = match_override_file(matmul_graph(), path)
    assert again is not None
    assert again[0].entry.engine_name == "FAKE_A"
    assert again[0].entry.metadata == {"rank": 0, "min_time_ms": 0.5}
    assert _engines(again[1]) == ["FAKE_A", "FAKE_B"]
    assert len(parses) == 1


def test_the_same_file_under_two_names_keeps_each_name(tmp_path: Path, parses: list[str]) -> None:
    """The parsed file carries its path for messages (``source``): one spelling per entry."""
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    other = tmp_path / "sub" / ".." / "o.json"
    (tmp_path / "sub").mkdir()
    assert load_file_cached(path).source == str(path)
    assert load_file_cached(other).source == str(other)
    assert load_file_cached(path).source == str(path)
    assert len(parses) == 2


def test_concurrent_reads_agree(tmp_path: Path, parses: list[str]) -> None:
    path = _write(tmp_path / "o.json", _doc("FAKE_A"))
    seen: list[list[str]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(20):
                seen.append(_engines(load_file_cached(path)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert seen == [["FAKE_A"]] * 160
    assert 1 <= len(parses) <= 8  # a benign race: at most one parse per thread
    file_cache.clear()
    load_file_cached(path)
    assert len(parses) >= 2


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """DNNTUNE_HEUR_CONFIG_PATH naming a FIFO: the read blocked until a process wrote to it,
    so `dnntune run` hung (audit, session 57). It is refused at once, naming what to do."""
    fifo = tmp_path / "overrides.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            load_file_cached(fifo)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5.0)
    if reader.is_alive():  # the old behaviour: let the blocked read end before failing
        with open(fifo, "w"):
            pass
        reader.join(5.0)
        pytest.fail("reading a FIFO blocked")
    assert isinstance(outcome[0], ConfigFileError)
    assert "not a regular file" in str(outcome[0])


def test_a_pipe_is_refused_not_read_once(tmp_path: Path) -> None:
    """A pipe (`DNNTUNE_HEUR_CONFIG_PATH=<(cat overrides.json)`) was read whole by the first
    query, and every later one found it empty ("the file is empty"): refused from the first
    read, so every query says the same."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, json.dumps({"version": 2, "engine_overrides": []}).encode())
        os.close(write_end)
        path = Path(f"/dev/fd/{read_end}")
        for _ in range(2):
            with pytest.raises(ConfigFileError, match="not a regular file"):
                load_file_cached(path)
    finally:
        os.close(read_end)
