"""The config-file writer: entry construction, metadata presence rules, write modes, recovery."""

from __future__ import annotations

import datetime as dt_
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from overrides_helpers import (
    conv_bias_relu_graph,
    conv_graph,
    layernorm_graph,
    matmul_graph,
    pointwise_graph,
    result,
    write_winner,
)

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.overrides import store
from dnntune.overrides.format import load_file
from dnntune.overrides.writer import (
    build_entry,
    build_metadata,
    check_appendable,
    winner_of,
    write_autotune_winner,
    write_entry,
)
from dnntune.rfc import AutotuneStorageConfig, AutotuneStrategy, TuneMode

F = dt.DataType.FLOAT


def _doc(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# ---- entry construction ---------------------------------------------------------------------


def test_metadata_fields_match_the_rfc_schema() -> None:
    now = dt_.datetime(2026, 4, 21, 10, 30, tzinfo=dt_.UTC)
    r = result(
        "FAKE_A",
        mode=TuneMode.EXHAUSTIVE,
        supports_exhaustive=True,
        ran_exhaustive=True,
        knobs=[KnobSetting("global.workspace_size_limit", 16777216)],
        workspace_size=16777216,
    )
    meta = build_metadata(r, dt.AutotuneConfig(), now=now)
    assert meta["rank"] == 0
    assert meta["min_time_ms"] == pytest.approx(0.041)
    assert meta["avg_time_ms"] == pytest.approx(0.044)
    assert meta["stddev_ms"] == pytest.approx(0.0018)
    assert meta["workspace_size"] == 16777216
    assert meta["mode"] == "exhaustive"
    assert meta["supports_exhaustive"] is True
    assert meta["ran_exhaustive"] is True
    assert meta["exhaustive_not_run_reason"] == ""
    assert meta["strategy"] == "run_until_stable"
    assert meta["iterations_run"] == 37
    assert meta["converged"] is True
    assert meta["timestamp"] == "2026-04-21T10:30:00Z"
    assert meta["knobs"] == [
        {"knob_id": "global.workspace_size_limit", "type": "int", "value": 16777216}
    ]
    # dnntune extras, ignored by readers
    assert meta["dnntune_version"] == dt.__version__
    assert meta["ranking_metric"] == "latency"


def test_converged_present_only_for_run_until_stable() -> None:
    stable = build_metadata(
        result("E", strategy=AutotuneStrategy.RUN_UNTIL_STABLE, converged=False)
    )
    fixed = build_metadata(result("E", strategy=AutotuneStrategy.FIXED_AVERAGE))
    assert stable["converged"] is False
    assert "converged" not in fixed
    assert fixed["strategy"] == "fixed_average"


def test_ran_exhaustive_always_present_and_reason_kept() -> None:
    meta = build_metadata(
        result(
            "E",
            mode=TuneMode.EXHAUSTIVE,
            ran_exhaustive=False,
            exhaustive_not_run_reason="priming workspace 9000 > budget 1024",
        )
    )
    assert meta["ran_exhaustive"] is False
    assert meta["exhaustive_not_run_reason"].startswith("priming workspace")
    assert build_metadata(result("E"))["ran_exhaustive"] is False


def test_knobs_omitted_for_default_knob_entries() -> None:
    assert "knobs" not in build_metadata(result("E", knobs=[]))


def test_knobs_written_with_types() -> None:
    knobs = [KnobSetting("a.int", 3), KnobSetting("a.dbl", 0.5), KnobSetting("a.str", "fft")]
    meta = build_metadata(result("E", knobs=knobs))
    assert [k["type"] for k in meta["knobs"]] == ["int", "double", "string"]


def test_timestamp_is_utc_iso8601() -> None:
    meta = build_metadata(result("E"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["timestamp"])
    local = dt_.datetime(2026, 1, 1, 12, 0, tzinfo=dt_.timezone(dt_.timedelta(hours=2)))
    assert build_metadata(result("E"), now=local)["timestamp"] == "2026-01-01T10:00:00Z"


def test_non_finite_times_become_null() -> None:
    meta = build_metadata(result("E", stddev_ms=float("nan")))
    assert meta["stddev_ms"] is None


@pytest.mark.parametrize(
    ("graph", "op", "ids", "criteria"),
    [
        (conv_graph, "conv_fprop", ["x_tensor_uid", "w_tensor_uid"], None),
        (conv_bias_relu_graph, "conv_fprop", ["x_tensor_uid", "w_tensor_uid"], None),
        (matmul_graph, "matmul", ["a_tensor_uid", "b_tensor_uid"], None),
        (pointwise_graph, "pointwise", ["in_0_tensor_uid"], {"pointwise_mode": 20}),
        # the scalar operand (pass-by-value) is not a tensor of the match key
        (
            lambda: pointwise_graph(mode=dt.PointwiseMode.MUL),
            "pointwise",
            ["in_0_tensor_uid"],
            {"pointwise_mode": 3},
        ),
        # epsilon is a scalar: left out
        (
            layernorm_graph,
            "layernorm",
            ["x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid"],
            {"norm_fwd_phase": 1},
        ),
    ],
)
def test_entry_op_tensor_ids_and_criteria(
    graph: Callable[[], dt.Graph], op: str, ids: list[str], criteria: dict[str, int] | None
) -> None:
    entry = build_entry(graph(), result("E"))
    assert entry["op"] == op
    assert [t["tensor_id"] for t in entry["tensors"]] == ids
    assert entry.get("criteria") == criteria


def test_entry_for_other_ops() -> None:
    g = dt.Graph(name="dgrad", io_data_type=F)
    dy = g.tensor(name="DY", dims=[2, 16, 8, 8])
    w = g.tensor(name="W", dims=[16, 8, 3, 3])
    g.conv_dgrad(dy, w, padding=1).set_output(True)
    assert [t["tensor_id"] for t in build_entry(g, result("E"))["tensors"]] == [
        "dy_tensor_uid",
        "w_tensor_uid",
    ]
    g = dt.Graph(name="wgrad", io_data_type=F)
    dy = g.tensor(name="DY", dims=[2, 16, 8, 8])
    x = g.tensor(name="X", dims=[2, 8, 8, 8])
    g.conv_wgrad(dy, x, padding=1).set_output(True)
    entry = build_entry(g, result("E"))
    assert entry["op"] == "conv_wgrad"
    assert [t["tensor_id"] for t in entry["tensors"]] == ["x_tensor_uid", "dy_tensor_uid"]
    g = dt.Graph(name="sdpa", io_data_type=F)
    q, k, v = (g.tensor(name=n, dims=[1, 2, 8, 16]) for n in "QKV")
    g.sdpa(q, k, v)[0].set_output(True)
    entry = build_entry(g, result("E"))
    assert entry["op"] == "sdpa_fwd"
    assert [t["tensor_id"] for t in entry["tensors"]] == [
        "q_tensor_uid",
        "k_tensor_uid",
        "v_tensor_uid",
    ]


def test_entry_tensors_carry_dims_and_strides() -> None:
    entry = build_entry(conv_graph(channels_last=True), result("E"))
    x = entry["tensors"][0]
    assert x["dim"] == [2, 8, 8, 8]
    assert x["stride"] == [512, 1, 64, 8]


def test_winner_is_rank_zero_or_first_success() -> None:
    results = [result("B", 1), result("F", succeeded=False), result("A", 0)]
    assert winner_of(results) is results[2]
    unranked = [result("F", succeeded=False), result("X", rank=-1), result("Y", rank=-1)]
    assert winner_of(unranked) is unranked[1]
    assert winner_of([result("F", succeeded=False)]) is None


# ---- write modes ----------------------------------------------------------------------------


def test_new_file_is_version_2(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "new.json"
    write_winner(conv_graph(), path)
    doc = _doc(path)
    assert doc["version"] == 2
    assert len(doc["engine_overrides"]) == 1
    assert doc["engine_overrides"][0]["engine_name"] == "FAKE_A"


def test_append_keeps_unrelated_entries(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "E1")
    write_winner(matmul_graph(), path, "E2")
    write_winner(conv_graph(n=4), path, "E3")
    assert [e["engine_name"] for e in _doc(path)["engine_overrides"]] == ["E1", "E2", "E3"]


def test_replace_matching_entry_unconditionally(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "FAST", min_time_ms=0.001)
    write_winner(matmul_graph(), path, "MM")
    write_winner(conv_graph(), path, "SLOWER", min_time_ms=5.0)  # no timing comparison
    entries = _doc(path)["engine_overrides"]
    assert [e["engine_name"] for e in entries] == ["MM", "SLOWER"]


def test_layout_change_is_a_different_key(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "NCHW")
    write_winner(conv_graph(channels_last=True), path, "NHWC")
    assert len(_doc(path)["engine_overrides"]) == 2


def test_criteria_distinguish_entries(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(pointwise_graph(mode=dt.PointwiseMode.RELU_FWD), path, "R")
    write_winner(pointwise_graph(mode=dt.PointwiseMode.TANH_FWD), path, "T")
    write_winner(layernorm_graph(dt.NormFwdPhase.INFERENCE), path, "LI")
    write_winner(layernorm_graph(dt.NormFwdPhase.TRAINING), path, "LT")
    entries = _doc(path)["engine_overrides"]
    assert [e["engine_name"] for e in entries] == ["R", "T", "LI", "LT"]
    assert [e["criteria"] for e in entries][:2] == [{"pointwise_mode": 20}, {"pointwise_mode": 23}]


def test_replace_matches_tensors_by_id_ignoring_order(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    entry = build_entry(conv_graph(), result("OLD"))
    entry["tensors"].reverse()
    entry["note"] = "hand edited"
    path.write_text(json.dumps({"version": 2, "engine_overrides": [entry]}))
    write_winner(conv_graph(), path, "NEW")
    assert [e["engine_name"] for e in _doc(path)["engine_overrides"]] == ["NEW"]


def test_delete_all_drops_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "E1")
    write_winner(matmul_graph(), path, "E2")
    write_winner(pointwise_graph(), path, "E3", delete_all=True)
    assert [e["engine_name"] for e in _doc(path)["engine_overrides"]] == ["E3"]


def test_unknown_fields_of_other_entries_and_top_level_survive(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    other = {"op": "matmul", "engine_name": "X", "tensors": [], "mine": {"keep": True}}
    path.write_text(json.dumps({"version": 2, "owner": "team", "engine_overrides": [other]}))
    write_winner(conv_graph(), path)
    doc = _doc(path)
    assert doc["owner"] == "team"
    assert doc["engine_overrides"][0] == other


def test_empty_existing_file_is_treated_as_new(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text("  \n")
    write_winner(conv_graph(), path)
    assert _doc(path)["version"] == 2


def test_permissions_of_an_existing_file_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path)
    os.chmod(path, 0o640)
    write_winner(matmul_graph(), path)
    assert path.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_empty_file_path_writes_nothing(tmp_path: Path) -> None:
    write_autotune_winner(conv_graph(), [result("E")], AutotuneStorageConfig(""), None)
    assert list(tmp_path.iterdir()) == []


def test_no_successful_results_warns_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.json"
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        write_autotune_winner(
            conv_graph(), [result("F", succeeded=False)], AutotuneStorageConfig(str(path)), None
        )
    assert "autotune: no successful results to write" in caplog.text
    assert not path.exists()


# ---- v2-only append -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        {"engine_overrides": []},  # legacy: no version key
        {"version": 1, "engine_overrides": []},
        {"version": 3, "engine_overrides": []},
        {"version": True, "engine_overrides": []},
        [1, 2, 3],
        "a string",
    ],
)
def test_append_to_non_v2_file_is_refused_and_nothing_written(
    tmp_path: Path, content: object
) -> None:
    path = tmp_path / "legacy.json"
    text = json.dumps(content)
    path.write_text(text)
    # a JSON list or value is refused as the reader refuses it, "expected a JSON object" (it
    # read "legacy/non-current autotune config file ...: not a JSON object"; new-user audit,
    # session 55)
    said = "legacy/non-current" if isinstance(content, dict) else "expected a JSON object"
    if content == {"version": 3, "engine_overrides": []}:
        said = "version 3 file, written by a newer dnntune"
    with pytest.raises(InvalidValueError, match=f"refusing to update .*{said}"):
        write_winner(conv_graph(), path)
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "legacy.json"
    ]


_MATMUL_ENTRY = {
    "op": "matmul",
    "engine_name": "FAKE_B",
    "tensors": [{"tensor_id": "a_tensor_uid", "dim": [1, 2, 3]}],
}


@pytest.mark.parametrize(
    ("content", "json_path"),
    [
        ({"version": 2, "engine_overrides": [{"op": "matmul"}]}, "engine_overrides[0].engine_name"),
        (
            {"version": 2, "engine_overrides": [_MATMUL_ENTRY, {**_MATMUL_ENTRY, "tensors": 5}]},
            "engine_overrides[1].tensors",
        ),
        (
            {"version": 2, "engine_overrides": {"not": "a list"}},
            "engine_overrides: expected a list",
        ),
        (
            {
                "version": 2,
                "engine_overrides": [
                    {**_MATMUL_ENTRY, "autotune_metadata": {"avg_time_ms": "NaN"}}
                ],
            },
            "engine_overrides[0].autotune_metadata.avg_time_ms",
        ),
    ],
)
def test_append_to_a_file_readers_reject_is_refused_naming_the_entry(
    tmp_path: Path, content: dict[str, Any], json_path: str
) -> None:
    """Reader and writer agree: a file the Config policy ignores as a whole is never extended,
    so a new entry cannot silently go unused; the refusal names the bad entry's JSON path."""
    path = tmp_path / "o.json"
    # "NaN" stands for the literal Python's json reads (and readers must reject)
    text = json.dumps(content).replace('"NaN"', "NaN")
    path.write_text(text)
    with pytest.raises(ConfigFileError):
        load_file(path)  # the reader's verdict
    with pytest.raises(InvalidValueError, match=re.escape(json_path)) as refused:
        write_winner(conv_graph(), path)
    assert "version 2 file" not in str(refused.value)
    assert "delete_all_existing_file_content=True" in str(refused.value)
    assert path.read_text() == text
    # --overwrite / delete_all still replaces it
    write_winner(conv_graph(), path, delete_all=True)
    assert [e["op"] for e in _doc(path)["engine_overrides"]] == ["conv_fprop"]


def test_check_appendable_refuses_up_front_with_the_callers_hint(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 3, "engine_overrides": []}))
    with pytest.raises(InvalidValueError, match=r"version 3.*pass --overwrite") as refused:
        check_appendable(path, replace_hint="pass --overwrite")
    assert "AutotuneStorageConfig" not in str(refused.value)
    check_appendable(tmp_path / "missing.json")  # a new file is fine
    (tmp_path / "corrupt.json").write_text("{not json")
    check_appendable(tmp_path / "corrupt.json")  # the writer moves it aside: fine


def test_a_symlink_is_written_through_to_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    target = real / "o.json"
    write_winner(matmul_graph(), target)
    link = tmp_path / "link.json"
    link.symlink_to(Path("real") / "o.json")  # relative, as `ln -s` makes them
    write_winner(conv_graph(), link)
    assert link.is_symlink()
    assert os.readlink(link) == os.path.join("real", "o.json")
    assert [e["op"] for e in _doc(target)["engine_overrides"]] == ["matmul", "conv_fprop"]
    # the lock and the temporary file were beside the target; nothing new beside the link
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real"]
    assert sorted(p.name for p in real.iterdir()) == [".o.json.lock", "o.json"]


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    write_winner(conv_graph(), link)
    assert link.is_symlink()
    assert [e["op"] for e in _doc(tmp_path / "new.json")["engine_overrides"]] == ["conv_fprop"]


def test_the_lock_is_a_hidden_sibling(tmp_path: Path) -> None:
    path = tmp_path / "overrides.json"
    write_winner(conv_graph(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".overrides.json.lock", "overrides.json"]
    assert store.lock_path(path) == tmp_path / ".overrides.json.lock"


def test_delete_all_replaces_a_legacy_file(tmp_path: Path) -> None:
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps({"engine_overrides": [{"op": "conv_fprop"}]}))
    write_winner(conv_graph(), path, delete_all=True)
    assert _doc(path)["version"] == 2


# ---- corrupt JSON ---------------------------------------------------------------------------


def test_corrupt_file_is_moved_aside_in_append_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.json"
    path.write_text('{"version": 2, "engine_overrides": [ {broken')
    with caplog.at_level(logging.ERROR, logger="dnntune"):
        write_winner(conv_graph(), path)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("o.json.corrupt-")]
    assert len(aside) == 1
    assert re.fullmatch(r"o\.json\.corrupt-\d+", aside[0].name)
    assert aside[0].read_text().endswith("{broken")
    assert len(_doc(path)["engine_overrides"]) == 1
    assert "moved it aside" in caplog.text


def test_a_byte_order_mark_is_read_and_appended_to_not_moved_aside(tmp_path: Path) -> None:
    """A valid file saved with a UTF-8 BOM (Notepad; hipDNN's reader skips it) was 'not valid
    JSON': readers ignored it and the next tune moved it aside, leaving a file with one entry
    (audit, session 20). It is read, and a write keeps its entries."""
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert len(load_file(path).entries) == 1
    check_appendable(path)
    write_winner(matmul_graph(), path)
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
    assert len(load_file(path).entries) == 2


def test_repeated_recoveries_do_not_overwrite_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.time, "time", lambda: 1_700_000_000.0)
    path = tmp_path / "o.json"
    for i in range(3):
        path.write_text(f"corrupt {i}")
        write_winner(conv_graph(), path)
    aside = sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name)
    assert aside == [
        "o.json.corrupt-1700000000",
        "o.json.corrupt-1700000000-1",
        "o.json.corrupt-1700000000-2",
    ]


def test_invalid_utf8_counts_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    write_winner(conv_graph(), path)
    assert _doc(path)["version"] == 2
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())


def test_corrupt_file_is_overwritten_when_it_cannot_be_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "o.json"
    path.write_text("{{{{")

    def refuse(src: object, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", refuse)
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        write_winner(conv_graph(), path)
    assert not any(".corrupt-" in p.name for p in tmp_path.iterdir())
    assert len(_doc(path)["engine_overrides"]) == 1
    assert "could not be moved aside" in caplog.text


def test_corrupt_file_with_delete_all_is_replaced_without_moving(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text("not json")
    write_winner(conv_graph(), path, delete_all=True)
    assert not any(".corrupt-" in p.name for p in tmp_path.iterdir())
    assert _doc(path)["version"] == 2


def test_replace_falls_back_to_remove_and_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "OLD")
    real_replace = os.replace
    calls = {"n": 0}

    def flaky(src: Any, dst: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1 and Path(dst).exists():
            raise PermissionError(13, "target exists")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    write_winner(conv_graph(), path, "NEW")
    assert [e["engine_name"] for e in _doc(path)["engine_overrides"]] == ["NEW"]


@pytest.mark.parametrize("refuse_rename_too", [False, True])
def test_a_failed_fallback_rename_keeps_the_new_content_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse_rename_too: bool
) -> None:
    """The fallback removes the old file before its second rename; when that rename failed too,
    the temporary file, by then the only copy of every entry, was deleted (audit, session 20:
    the whole file was lost). It is kept, and the error names it: renamed to
    ``o.json.unsaved-<epoch>``, so that no later write takes it for a stale temporary file of a
    writer that is gone (``refuse_rename_too``: that rename fails as well, and the temporary file
    keeps its name)."""
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "OLD")
    write_winner(matmul_graph(), path, "KEPT")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "replace", refuse)
    if refuse_rename_too:
        monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(ConfigFileError, match=r"rename that to o\.json") as info:
        write_winner(conv_graph(), path, "NEW")
    monkeypatch.undo()
    mark = ".tmp" if refuse_rename_too else "o.json.unsaved-"
    kept = [p for p in tmp_path.iterdir() if mark in p.name]
    assert len(kept) == 1 and str(kept[0]) in str(info.value)
    names = sorted(e["engine_name"] for e in json.loads(kept[0].read_text())["engine_overrides"])
    assert names == ["KEPT", "NEW"]
    if not refuse_rename_too:
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        write_winner(layernorm_graph(), path, "LATER")  # removes stale temporary files
        assert kept[0].exists()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    """Ctrl-C while the new content was being synced left a hidden ``.o.json.*.tmp`` beside
    the file, one per interrupted write (audit, session 20). The file itself is untouched."""
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "OLD")
    before = path.read_text()

    def stop(fd: int) -> None:
        raise interrupt()

    monkeypatch.setattr(os, "fsync", stop)
    with pytest.raises(interrupt):
        write_winner(conv_graph(), path, "NEW")
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_write_entry_rejects_unkeyable_entries(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="tensor_id"):
        write_entry(
            tmp_path / "o.json", {"op": "matmul", "engine_name": "E", "tensors": [{"dim": [1]}]}
        )


def test_written_file_loads_with_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, knobs=[KnobSetting("fake.alpha", 2.0)])
    config = load_file(path)
    assert config.named_tensor_ids
    assert config.entries[0].knobs == [KnobSetting("fake.alpha", 2.0)]
    assert isinstance(config.entries[0].knobs[0].value, float)


def test_device_name_is_recorded_when_the_graph_was_built(tmp_path: Path) -> None:
    g = conv_graph()
    handle = dt.create_handle("cpu")
    g.build_operation_graph(handle)
    meta = build_entry(g, result("E"))["autotune_metadata"]
    assert meta["device"] == handle.device_signature()["name"]
    assert "device" not in build_entry(conv_graph(), result("E"))["autotune_metadata"]


def test_appending_to_a_graph_file_says_it_is_a_graph_not_a_legacy_file(tmp_path: Path) -> None:
    from dnntune import testing
    from dnntune.overrides.writer import check_appendable

    graph = tmp_path / "g.json"
    testing.small_matmul_graph().save(graph)
    with pytest.raises(InvalidValueError, match="looks like a graph file") as caught:
        check_appendable(graph)
    assert "legacy" not in str(caught.value)
