"""The exact-match ranking cache: write outcomes, on-disk layout, and the read rules."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, engines, matmul_graph, result, write_winner

import dnntune as dt
from dnntune.backend.engine import Engine, engine_id
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.knobs import KnobSetting
from dnntune.overrides import exact_cache
from dnntune.overrides.exact_cache import cache_key, cache_path, lookup, read_record, write_ranking
from dnntune.overrides.policy import ConfigPolicy
from dnntune.rfc import AutotuneResult, CacheWriteOutcome


@pytest.fixture
def handle() -> Handle:
    return dt.create_handle("cpu")


def _ids(*names: str) -> list[int]:
    return [engine_id(n) for n in names]


def _sweep(*ranking: str, failed: tuple[str, ...] = ()) -> list[AutotuneResult]:
    out = [result(n, rank=i) for i, n in enumerate(ranking)]
    out += [result(n, succeeded=False) for n in failed]
    return out


def _write(
    handle: Handle,
    ranking: tuple[str, ...],
    failed: tuple[str, ...] = (),
    sampled: tuple[str, ...] | None = None,
    complete: bool = True,
    graph: dt.Graph | None = None,
) -> CacheWriteOutcome:
    sampled = sampled if sampled is not None else (*ranking, *failed)
    return write_ranking(
        graph or conv_graph(), handle, _sweep(*ranking, failed=failed), _ids(*sampled), complete
    )


def _names(engs: Sequence[Engine]) -> list[str]:
    return [e.name for e in engs]


# ---- write outcomes -------------------------------------------------------------------------


def test_written_then_unchanged(handle: Handle) -> None:
    assert _write(handle, ("A", "B", "C")) is CacheWriteOutcome.WRITTEN
    assert _write(handle, ("A", "B", "C")) is CacheWriteOutcome.UNCHANGED
    assert _write(handle, ("B", "A", "C")) is CacheWriteOutcome.WRITTEN


def test_strict_subset_of_sampled_is_unchanged(handle: Handle) -> None:
    assert _write(handle, ("A", "B", "C")) is CacheWriteOutcome.WRITTEN
    assert _write(handle, ("B", "A")) is CacheWriteOutcome.UNCHANGED
    assert _write(handle, ("B", "A", "C", "D")) is CacheWriteOutcome.WRITTEN


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "1"),
        ("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", " TRUE "),
        ("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "enabled"),
        ("DNNTUNE_DISABLE_CACHE", "yes"),
    ],
)
def test_declined_disabled(
    handle: Handle, monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    assert _write(handle, ("A", "B")) is CacheWriteOutcome.DECLINED_DISABLED
    assert not (Path(exact_cache.rankings_dir())).exists()


@pytest.mark.parametrize("value", ["0", "false", "no", "maybe", ""])
def test_other_values_leave_the_cache_on(
    handle: Handle, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", value)
    assert _write(handle, ("A", "B")) is CacheWriteOutcome.WRITTEN


def test_declined_unkeyable(handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device() -> dict[str, object]:
        raise RuntimeError("no device properties set")

    monkeypatch.setattr(handle, "device_signature", no_device)
    assert _write(handle, ("A", "B")) is CacheWriteOutcome.DECLINED_UNKEYABLE
    assert lookup(conv_graph(), handle, engines("A", "B")) is None


def test_partial_sweep_not_attempted(handle: Handle) -> None:
    assert (
        _write(handle, ("A", "B"), complete=False) is CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    )


def test_no_successful_engine_not_attempted(handle: Handle) -> None:
    outcome = _write(handle, (), failed=("A", "B"))
    assert outcome is CacheWriteOutcome.NOT_ATTEMPTED_NO_SUCCESSFUL_ENGINE


def test_io_failure_is_soft(
    handle: Handle,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(blocker))  # a file where a folder must go
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        outcome = _write(handle, ("A", "B"))
    assert outcome is CacheWriteOutcome.DECLINED_DISABLED
    assert "unavailable" in caplog.text


@pytest.mark.parametrize("how", ["no folder", "disk full"])
def test_an_unwritable_cache_warns_once_and_says_what_to_do(
    handle: Handle,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    """A read-only or full cache dir fails every sweep's write alike: it warned once per
    graph, without saying what to do (audit, session 20). One warning, naming the fix."""
    if how == "no folder":
        blocker = tmp_path / "file"
        blocker.write_text("")
        monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(blocker))
    else:

        def full(path: Path, text: str) -> None:
            raise exact_cache.ConfigFileError(f"{path}: cannot write: No space left on device")

        monkeypatch.setattr(exact_cache, "atomic_write_text", full)
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        for graph in (conv_graph(), conv_graph(n=3), matmul_graph()):
            _write(handle, ("A", "B"), graph=graph)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "DNNTUNE_CACHE_DIR" in warnings[0].getMessage()


def test_a_cache_dir_that_is_a_file_is_one_warning_for_every_lookup(
    handle: Handle,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DNNTUNE_CACHE_DIR naming a file: every graph's lookup failed with "Not a directory",
    and each warned on its own (`dnntune run -g` of 17 graphs printed 17 warnings, none
    saying what to set; audit, session 57). One warning for the folder, naming the fix, and
    the sweep's failed write adds none."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        for graph in (conv_graph(), conv_graph(n=3), matmul_graph()):
            assert lookup(graph, handle, engines("A", "B")) is None
        _write(handle, ("A", "B"))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [w.getMessage() for w in warnings]
    assert "DNNTUNE_CACHE_DIR" in warnings[0].getMessage()


# ---- on disk --------------------------------------------------------------------------------


def test_file_layout_and_last_line_wins(handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = conv_graph()
    _write(handle, ("A", "B", "C"), graph=graph)
    _write(handle, ("C", "A", "B"), graph=graph)
    key = cache_key(graph, handle)
    path = cache_path(key)
    assert path.parent.parent.name == "autotune-rankings"
    assert path.parent.name == dt.__version__
    assert path.name == f"{graph.key()}{handle.device_key()}.jsonl"
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == exact_cache.FORMAT
    records = [json.loads(line) for line in lines[1:]]
    assert [r["order"] for r in records] == [_ids("A", "B", "C"), _ids("C", "A", "B")]
    assert set(records[0]) >= {"key", "sampled_engine_ids", "order"}
    record = read_record(graph, handle)
    assert record is not None and record.order == _ids("C", "A", "B")


def test_several_results_of_one_engine_collapse_to_the_best(handle: Handle) -> None:
    results = [
        result("A", 0, knobs=[KnobSetting("fake.tile", 8)]),
        result("B", 1),
        result("A", 2, knobs=[KnobSetting("fake.tile", 16)]),
    ]
    graph = conv_graph()
    write_ranking(graph, handle, results, _ids("A", "B"), True)
    record = read_record(graph, handle)
    assert record is not None
    assert record.order == _ids("A", "B")
    assert record.knobs[engine_id("A")] == [KnobSetting("fake.tile", 8)]


def test_torn_and_garbage_lines_are_skipped(handle: Handle) -> None:
    graph = conv_graph()
    _write(handle, ("B", "A"), graph=graph)
    path = cache_path(cache_key(graph, handle))
    with open(path, "a") as f:
        f.write('{"key": "x", "order": [1, 2')  # a writer died mid-line
    record = read_record(graph, handle)
    assert record is not None and record.order == _ids("B", "A")
    assert _write(handle, ("A", "B"), graph=graph) is CacheWriteOutcome.WRITTEN
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["order"] == _ids("A", "B")


def test_a_byte_that_is_not_utf8_spoils_only_its_line(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    """One 0xff byte in a later line disabled the whole file ("can't decode byte 0xff", the
    lookup fell back; audit, session 18). Only that line is lost, even one that would parse
    as JSON once the byte were replaced (it never reaches a record as U+FFFD)."""
    graph = conv_graph()
    _write(handle, ("B", "A"), graph=graph)
    key = cache_key(graph, handle)
    path = cache_path(key)
    reversed_ids = _ids("A", "B")
    spoiled = f'{{"key": "{key}", "sampled_engine_ids": {reversed_ids}, "order": {reversed_ids}'
    with open(path, "ab") as f:
        f.write(spoiled.encode() + b', "timestamp": "\xff"}\n')
        f.write(b"\xff\xfe not utf-8\n")
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        decision = lookup(graph, handle, engines("A", "B"))
    assert decision is not None and _names(decision.engines) == ["B", "A"]
    assert "unavailable" not in caplog.text
    assert _write(handle, ("A", "B"), graph=graph) is CacheWriteOutcome.WRITTEN
    assert read_record(graph, handle).order == _ids("A", "B")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad",
    [
        '"engine_names": ["oops"]',
        '"knobs": ["oops"]',
        '"knobs": {"1": 3}',
        # a double beyond any float: OverflowError escaped the sweep's write (audit, session 20)
        '"knobs": {"1": [{"knob_id": "k", "type": "double", "value": 1' + "0" * 400 + "}]}",
    ],
)
def test_a_record_with_wrong_field_types_is_skipped(handle: Handle, bad: str) -> None:
    """A well-formed JSON line whose fields have the wrong types is a malformed record like a
    torn one: skipped on read, and the next write still works (audit, session 17: it raised
    AttributeError through read, the sweep's write and the policy)."""
    graph = conv_graph()
    _write(handle, ("B", "A"), graph=graph)
    key = cache_key(graph, handle)
    path = cache_path(key)
    with open(path, "a") as f:
        f.write(f'{{"key": "{key}", "sampled_engine_ids": [1], "order": [1], {bad}}}\n')
    record = read_record(graph, handle)
    assert record is not None and record.order == _ids("B", "A")
    assert _write(handle, ("A", "B"), graph=graph) is CacheWriteOutcome.WRITTEN
    assert read_record(graph, handle).order == _ids("A", "B")  # type: ignore[union-attr]


def test_foreign_stamp_is_unavailable_then_rewritten(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    graph = conv_graph()
    path = cache_path(cache_key(graph, handle))
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "something-else"}\n')
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert lookup(graph, handle, engines("A", "B")) is None
    assert "unavailable" in caplog.text
    assert _write(handle, ("A", "B"), graph=graph) is CacheWriteOutcome.WRITTEN
    assert read_record(graph, handle) is not None


def test_a_file_that_cannot_be_read_is_never_replaced(
    handle: Handle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read error (EIO, permissions) was taken for a foreign file: "starting a new file"
    replaced it with the new record alone, and the records of other library versions were
    lost (audit, session 20). The write is declined with the cache-unavailable warning and
    the file is left as it is."""
    graph = conv_graph()
    _write(handle, ("B", "A"), graph=graph)
    path = cache_path(cache_key(graph, handle))
    before = path.read_text()

    def broken(p: Path) -> list[str] | None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(exact_cache, "read_lines_each", broken)
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        outcome = _write(handle, ("A", "B"), graph=graph)
    assert outcome is CacheWriteOutcome.DECLINED_DISABLED
    assert "Input/output error" in caplog.text and "starting a new file" not in caplog.text
    monkeypatch.undo()
    assert path.read_text() == before


def test_an_unusable_file_is_warned_about_once_not_on_every_lookup(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    """The Config policy looks the graph up on every plan build; each lookup of a file with a
    foreign stamp warned again (audit, session 20)."""
    graph = conv_graph()
    path = cache_path(cache_key(graph, handle))
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "something-else"}\n')
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        for _ in range(3):
            assert lookup(graph, handle, engines("A", "B")) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()


def test_reads_never_create_files(handle: Handle) -> None:
    assert lookup(conv_graph(), handle, engines("A", "B")) is None
    assert not exact_cache.rankings_dir().exists()


# ---- read rules -----------------------------------------------------------------------------


def test_exact_hit_orders_every_candidate(handle: Handle) -> None:
    _write(handle, ("C", "A", "B"))
    decision = lookup(conv_graph(), handle, engines("A", "B", "C"))
    assert decision is not None
    assert _names(decision.engines) == ["C", "A", "B"]
    assert decision.matched["source"] == "exact_cache"
    assert decision.matched["hit"] == "exact"
    assert "hit (exact)" in decision.reason


def test_partial_hit_when_a_sampled_engine_is_gone(handle: Handle) -> None:
    _write(handle, ("C", "A", "B"))
    decision = lookup(conv_graph(), handle, engines("A", "B"))
    assert decision is not None
    assert _names(decision.engines) == ["A", "B"]
    assert decision.matched["hit"] == "partial"


def test_unsampled_candidate_rejects_the_record(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    _write(handle, ("A", "B"))
    with caplog.at_level(logging.INFO, logger="dnntune"):
        assert lookup(conv_graph(), handle, engines("A", "B", "NEW")) is None
    assert "rejected -- unsampled" in caplog.text and "NEW" in caplog.text


def test_sampled_but_failed_engines_follow_the_ranked_ones(handle: Handle) -> None:
    _write(handle, ("B",), failed=("A", "C"))
    decision = lookup(conv_graph(), handle, engines("C", "A", "B"))
    assert decision is not None
    assert _names(decision.engines) == ["B", "C", "A"]


def test_fewer_than_two_engines_declines(handle: Handle) -> None:
    _write(handle, ("A", "B"))
    assert lookup(conv_graph(), handle, engines("A")) is None


def test_no_ranked_engine_among_candidates_declines(handle: Handle) -> None:
    _write(handle, ("A",), failed=("B", "C"))
    assert lookup(conv_graph(), handle, engines("B", "C")) is None


def test_duplicate_in_order_is_malformed(handle: Handle, caplog: pytest.LogCaptureFixture) -> None:
    graph = conv_graph()
    _write(handle, ("A", "B"), graph=graph)
    path = cache_path(cache_key(graph, handle))
    bad = {
        "key": cache_key(graph, handle),
        "sampled_engine_ids": _ids("A", "B"),
        "order": _ids("A", "A", "B"),
        "libraries": exact_cache.library_versions(),
    }
    with open(path, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with caplog.at_level(logging.INFO, logger="dnntune"):
        assert lookup(graph, handle, engines("A", "B")) is None
    assert "malformed" in caplog.text


def test_other_graph_or_device_misses(handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(handle, ("B", "A"))
    assert lookup(matmul_graph(), handle, engines("A", "B")) is None
    assert lookup(conv_graph(n=3), handle, engines("A", "B")) is None
    other = dt.create_handle("cpu")
    monkeypatch.setattr(other, "device_signature", lambda: {"type": "cpu", "name": "other"})
    assert lookup(conv_graph(), other, engines("A", "B")) is None


def _libraries(monkeypatch: pytest.MonkeyPatch, **versions: str) -> None:
    monkeypatch.setattr(exact_cache, "library_versions", lambda: dict(versions))


def test_a_ranking_from_other_library_versions_is_not_applied(
    handle: Handle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ranking is measured data: after a torch (or Triton, cuDNN) upgrade it says nothing
    about the engines. It was applied anyway: the key held only the graph and the device
    (audit, session 20). Two environments sharing the cache dir each keep their own."""
    _libraries(monkeypatch, torch="2.5.0")
    assert _write(handle, ("B", "A")) is CacheWriteOutcome.WRITTEN
    _libraries(monkeypatch, torch="2.6.0")
    with caplog.at_level(logging.INFO, logger="dnntune"):
        assert lookup(conv_graph(), handle, engines("A", "B")) is None
    assert "other library versions" in caplog.text
    assert _write(handle, ("B", "A")) is CacheWriteOutcome.WRITTEN  # not UNCHANGED
    assert _write(handle, ("A", "B")) is CacheWriteOutcome.WRITTEN
    hit = lookup(conv_graph(), handle, engines("A", "B"))
    assert hit is not None and _names(hit.engines) == ["A", "B"]
    _libraries(monkeypatch, torch="2.5.0")
    back = lookup(conv_graph(), handle, engines("A", "B"))
    assert back is not None and _names(back.engines) == ["B", "A"]


def test_a_record_without_library_versions_is_not_applied(handle: Handle) -> None:
    """A record written before the versions were kept cannot say what it was measured on."""
    graph = conv_graph()
    _write(handle, ("B", "A"), graph=graph)
    path = cache_path(cache_key(graph, handle))
    stamp, line = path.read_text().splitlines()
    old = json.loads(line)
    assert old.pop("libraries") == exact_cache.library_versions()
    path.write_text(f"{stamp}\n{json.dumps(old)}\n")
    assert lookup(graph, handle, engines("A", "B")) is None
    assert _write(handle, ("B", "A"), graph=graph) is CacheWriteOutcome.WRITTEN
    assert lookup(graph, handle, engines("A", "B")) is not None


def test_library_versions_name_torch() -> None:
    assert exact_cache.library_versions()["torch"] == __import__("torch").__version__


def test_disabled_read(handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(handle, ("B", "A"))
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "on")
    assert lookup(conv_graph(), handle, engines("A", "B")) is None


def test_exact_hit_preempts_the_override_file(
    handle: Handle, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "A")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    _write(handle, ("B", "A"))
    policy = ConfigPolicy()
    decision = policy.order(conv_graph(), handle, engines("A", "B"), HeuristicMode.A)
    assert decision is not None and decision.matched["source"] == "exact_cache"
    assert _names(decision.engines) == ["B", "A"]
    # a rejected record falls through to the file
    decision = policy.order(conv_graph(), handle, engines("A", "B", "NEW"), HeuristicMode.A)
    assert decision is not None and decision.matched["source"] == "override_file"
    assert _names(decision.engines) == ["A", "B", "NEW"]
    # so does a disabled cache
    monkeypatch.setenv("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "1")
    decision = policy.order(conv_graph(), handle, engines("A", "B"), HeuristicMode.A)
    assert decision is not None and decision.matched["source"] == "override_file"


def test_cache_failure_inside_the_policy_is_soft(
    handle: Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(exact_cache, "lookup", boom)
    assert ConfigPolicy().order(conv_graph(), handle, engines("A", "B"), HeuristicMode.A) is None


# ---- processes at once -----------------------------------------------------------------------
def _sweep_again_and_again(turn: int) -> None:
    """A process sweeping the same graph 15 times, its ranking changing each time."""
    handle = dt.create_handle("cpu")
    names = ("A", "B", "C")
    for n in range(15):
        ranking = names[(turn + n) % 3 :] + names[: (turn + n) % 3]
        assert _write(handle, ranking) in (CacheWriteOutcome.WRITTEN, CacheWriteOutcome.UNCHANGED)


@pytest.mark.slow
def test_processes_sweeping_one_graph_at_once_keep_a_readable_file(handle: Handle) -> None:
    """Four processes write rankings of one graph while this one reads it: every read is a
    miss (before the first write) or a whole ranking, the file keeps its stamp line first, and
    every line is a record; no temporary file is left."""
    import multiprocessing

    path = cache_path(cache_key(conv_graph(), handle))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_sweep_again_and_again, args=(i,)) for i in range(4)]
    for p in procs:
        p.start()
    seen = []
    while any(p.is_alive() for p in procs):
        seen.append(read_record(conv_graph(), handle))
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0] * 4
    assert all(r is None or sorted(r.order) == sorted(_ids("A", "B", "C")) for r in seen)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == exact_cache.FORMAT
    assert all(json.loads(line)["key"] for line in lines[1:])
    assert len(lines) >= 2 and read_record(conv_graph(), handle) is not None
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")) == [
        path.name
    ]
