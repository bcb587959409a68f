"""Every reader of a file a user or an earlier run left behind treats JSON nested past Python's
recursion limit as the corrupt data it is, by the reader's own policy for a corrupt line or
file: ``json.loads`` raises RecursionError there, which is not a ValueError, so a reader that
caught only JSONDecodeError (or ValueError) let it out of the read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, engines, result

import dnntune as dt
from dnntune.backend.engine import engine_id
from dnntune.bench.results import SuiteResult
from dnntune.errors import InvalidValueError
from dnntune.overrides import exact_cache
from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord
from dnntune.providers.triton.perf_db import PerfDb, PerfKey, PerfRecord
from dnntune.rfc import CacheWriteOutcome

#: one line of JSON nested far deeper than the decoder's recursion limit
DEEP = "[" * 100_000 + "]" * 100_000


def _exact_cache_read(tmp_path: Path) -> None:
    """The Config policy's lookup: a corrupt stamp line is a file it cannot use (a miss)."""
    handle = dt.create_handle("cpu")
    graph = conv_graph()
    path = exact_cache.cache_path(exact_cache.cache_key(graph, handle))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEEP + "\n")
    assert exact_cache.lookup(graph, handle, engines("A", "B")) is None
    assert exact_cache.read_record(graph, handle) is None


def _exact_cache_write(tmp_path: Path) -> None:
    """The sweep's write: a file that is not a ranking file is replaced (a new file started)."""
    handle = dt.create_handle("cpu")
    graph = conv_graph()
    path = exact_cache.cache_path(exact_cache.cache_key(graph, handle))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEEP + "\n")
    results = [result("A", rank=0), result("B", rank=1)]
    ids = [engine_id("A"), engine_id("B")]
    outcome = exact_cache.write_ranking(graph, handle, results, ids, True)
    assert outcome is CacheWriteOutcome.WRITTEN
    record = exact_cache.read_record(graph, handle)
    assert record is not None and record.order == ids


def _find_db(tmp_path: Path) -> None:
    """A torn or foreign line is skipped; the record before it is still found."""
    db = FindDb(tmp_path)
    key = FindDbKey("graph", "dev", 91900, "1.16.0", "a", 0)
    assert db.record(key, FindDbRecord("eng1", 1, 0, 1.0))
    with open(db.path_for(key), "a") as f:
        f.write(DEEP + "\n")
    found = db.lookup(key)
    assert found is not None and found.plan_index == 1


def _perf_key() -> PerfKey:
    return PerfKey("matmul", {"m": 1}, {"name": "dev"}, {"triton": "3.6"})


def _perf_db_lookup(tmp_path: Path) -> None:
    """A line that is not JSON is skipped (logged); the record before it is still found."""
    db = PerfDb(tmp_path)
    db.store(_perf_key(), PerfRecord({"block_m": 64}, 1.0))
    with open(db.path_for("matmul"), "a") as f:
        f.write(DEEP + "\n")
    found = db.lookup(_perf_key())
    assert found is not None and found.config == {"block_m": 64}


def _perf_db_clean(tmp_path: Path) -> None:
    """DB_CLEAN keeps a line it cannot parse and deletes the problem's records."""
    db = PerfDb(tmp_path)
    db.store(_perf_key(), PerfRecord({"block_m": 64}, 1.0))
    with open(db.path_for("matmul"), "a") as f:
        f.write(DEEP + "\n")
    assert db.delete(_perf_key()) == 1
    assert db.path_for("matmul").read_text() == DEEP + "\n"


def _plan_serialization(tmp_path: Path) -> None:
    """``Graph.deserialize_plan`` of a saved plan: not valid JSON (InvalidValueError)."""
    graph = conv_graph()
    with pytest.raises(InvalidValueError, match="not valid JSON"):
        graph.deserialize_plan(dt.create_handle("cpu"), DEEP)


def _bench_results(tmp_path: Path) -> None:
    """`dnntune bench compare` reads results files with it: not a JSON results file."""
    path = tmp_path / "results.json"
    path.write_text(DEEP)
    with pytest.raises(InvalidValueError, match="not a JSON results file"):
        SuiteResult.load(path)


@pytest.mark.parametrize(
    "read",
    [
        _exact_cache_read,
        _exact_cache_write,
        _find_db,
        _perf_db_lookup,
        _perf_db_clean,
        _plan_serialization,
        _bench_results,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_json_nested_past_the_recursion_limit_is_a_corrupt_line(
    read: Callable[[Path], None], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        read(tmp_path)  # RecursionError escaped every one of these
