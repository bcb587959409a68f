"""Malformed tuning-history files: a bad record or file is skipped with a note naming the
file, never an internal error (audit, session 18)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from learning_helpers import H200, matmul

from dnntune.learning import collect


def _row(engine: Any, kernel: Any, **extra: Any) -> dict[str, Any]:
    row = {
        "provider": "dnntune",
        "engine": engine,
        "status": "success",
        "verdict": "passed",
        "kernel": kernel,
    }
    row.update(extra)
    return row


def _bench(tmp_path: Path, rows: list[Any], name: str = "bench.json") -> Path:
    (tmp_path / "graphs").mkdir(exist_ok=True)
    matmul(64, 1024, 1024).save(tmp_path / "graphs" / "mm.json")
    doc = {
        "schema_version": 1,
        "environment": {"device": {"type": "cuda", "name": "NVIDIA H200"}},
        "graphs": [{"graph_path": "mm.json", "status": "ok", "results": rows}],
    }
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_bench_rows_of_another_shape_are_skipped_with_a_note(tmp_path: Path) -> None:
    rows = [
        _row("TORCH_ENGINE", {"median_ms": 0.1}),  # "engine" a string
        _row({"name": "CUDNN_ENGINE"}, [0.1]),  # "kernel" a list
        _row({"name": ["TRITON_ENGINE"]}, {"median_ms": 0.1}),  # a name that is no string
        _row(
            {"name": "TORCH_COMPILE_ENGINE"},
            {"median_ms": 0.2},
            oracle={"knob_settings": [{"value": 3}, {"knob_id": "k", "value": 1}]},
            oracle_delta={"tuned_median_ms": 0.15},
        ),
        _row({"name": "TORCH_ENGINE"}, {"median_ms": 0.3}),
    ]
    path = _bench(tmp_path, rows)
    found = collect([path], [tmp_path / "graphs"])
    (r,) = found.records
    assert r.device_class == H200
    assert r.times_ms == {"TORCH_COMPILE_ENGINE": 0.2, "TORCH_ENGINE": 0.3}
    # the knob setting without a knob_id is left out, the other kept
    assert r.configs == {"TORCH_COMPILE_ENGINE": {"knobs": {"k": 1}, "time_ms": 0.15}}
    malformed = [n for n in found.notes if "malformed" in n]
    assert len(malformed) == 3 and all(n.startswith(f"{path}: graphs[0]") for n in malformed)
    assert found.files == [str(path)]


def test_a_file_no_reader_expected_is_skipped_whole(tmp_path: Path) -> None:
    """``results`` a number: the file is skipped with a note naming it, and records it gave
    before the bad part are not kept (never half a file)."""
    good = _bench(tmp_path, [_row({"name": "TORCH_ENGINE"}, {"median_ms": 0.3})], "good.json")
    doc = json.loads(good.read_text())
    doc["graphs"].append({"graph_path": "mm.json", "status": "ok", "results": 5})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    found = collect([bad, good], [tmp_path / "graphs"])
    assert len(found.records) == 1 and found.files == [str(good)]
    (note,) = [n for n in found.notes if n.startswith(str(bad))]
    assert "malformed (TypeError" in note and note.endswith("skipped")


def test_a_tune_report_winner_of_another_shape_is_skipped_with_a_note(tmp_path: Path) -> None:
    g = tmp_path / "mm.json"
    matmul(64, 1024, 1024).save(g)
    report = [
        {
            "graph": "mm",
            "source": str(g),
            "graph_key": "k",
            "ok": True,
            "winner": {"engine_name": ["a"], "median_time_ms": 0.05},
            "runner_up": {"engine_name": "TORCH_ENGINE", "median_time_ms": 0.06},
        }
    ]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    found = collect([path], device_name="NVIDIA H200")
    (r,) = found.records
    assert r.times_ms == {"TORCH_ENGINE": 0.06}
    assert any(n.startswith(f"{path}: [0]: winner") and "malformed" in n for n in found.notes)


def test_a_tune_report_of_another_device_type_is_not_relabelled(tmp_path: Path) -> None:
    """--device-name "NVIDIA H200" on a report tuned on the CPU relabelled CPU timings as the
    H200's, silently (audit, session 18): such an entry is skipped with a note saying why."""
    g = tmp_path / "mm.json"
    matmul(64, 1024, 1024).save(g)

    def report(device: str) -> Path:
        entry = {
            "graph": "mm",
            "source": str(g),
            "graph_key": "k",
            "device": device,
            "ok": True,
            "winner": {"engine_name": "TORCH_ENGINE", "median_time_ms": 0.05},
            "runner_up": {"engine_name": "TORCH_COMPILE_ENGINE", "median_time_ms": 0.06},
        }
        path = tmp_path / f"report_{device.replace(':', '')}.json"
        path.write_text(json.dumps([entry]))
        return path

    cpu = report("cpu")
    found = collect([cpu], device_name="NVIDIA H200")
    assert not found.records
    (note,) = found.notes
    assert note.startswith(f"{cpu}: [0]: tuned on 'cpu'") and "--device-name" in note
    assert len(collect([cpu], device_name="AMD EPYC 7763 64-Core Processor").records) == 1
    gpu = report("cuda:0")
    assert len(collect([gpu], device_name="NVIDIA H200").records) == 1
    assert not collect([gpu], device_name="AMD EPYC 7763 64-Core Processor").records


def test_a_file_given_twice_is_read_once(tmp_path: Path, monkeypatch: Any) -> None:
    """`train bench.json bench.json ./bench.json` read it three times ("12 record(s) from 3
    file(s)"); a folder and a file in it too (audit, session 18)."""
    history = tmp_path / "history"
    history.mkdir()
    path = _bench(history, [_row({"name": "TORCH_ENGINE"}, {"median_ms": 0.3})])
    monkeypatch.chdir(history)
    found = collect([path, path, Path("bench.json"), history], [history / "graphs"])
    assert len(found.records) == 1 and found.files == [str(path)]


def test_a_ranking_file_with_a_byte_that_is_not_utf8_is_still_read(tmp_path: Path) -> None:
    """Training skipped the whole exact-match cache file for one 0xff byte in a later line
    (audit, session 18): only that line is lost."""
    import dnntune as dt
    from dnntune.backend.engine import engine_id
    from dnntune.overrides import exact_cache
    from dnntune.rfc import AutotuneResult

    g = matmul(8, 64, 64)
    handle = dt.create_handle("cpu")
    results = [
        AutotuneResult(engine_name=n, engine_id=engine_id(n), rank=i, succeeded=True)
        for i, n in enumerate(("TORCH_COMPILE_ENGINE", "TORCH_ENGINE"))
    ]
    ids = [engine_id("TORCH_ENGINE"), engine_id("TORCH_COMPILE_ENGINE")]
    assert exact_cache.write_ranking(g, handle, results, ids, complete=True).name == "WRITTEN"
    g.save(tmp_path / "g.json")
    path = exact_cache.cache_path(exact_cache.cache_key(g, handle))
    with open(path, "ab") as f:
        f.write(b"\xff\xfe not utf-8\n")
    found = collect([exact_cache.rankings_dir()], [tmp_path])
    (r,) = found.records
    assert r.times_ms == {"TORCH_COMPILE_ENGINE": 1.0, "TORCH_ENGINE": 1.05}
    assert not any("cannot read" in n for n in found.notes)


def test_a_time_too_large_for_a_float_is_skipped_and_far_apart_times_train(
    tmp_path: Path,
) -> None:
    """An integer of 400 digits as a median raised OverflowError out of ``collect``; a
    records file with an infinite time, and times 1e308 and 1e-3 ms apart, trained for the
    whole evaluation and then failed to write the model ("Out of range float values are not
    JSON compliant"; new-user audit, session 56)."""
    from learning_helpers import rec

    from dnntune.backend.learned import ModelParams
    from dnntune.errors import InvalidValueError
    from dnntune.learning import Record, merge, save_model, train

    rows = [
        _row({"name": "CUDNN_ENGINE"}, {"median_ms": 10**400}),
        _row({"name": "TORCH_ENGINE"}, {"median_ms": 0.3}),
    ]
    found = collect([_bench(tmp_path, rows)], [tmp_path / "graphs"])
    (r,) = found.records
    assert r.times_ms == {"TORCH_ENGINE": 0.3}

    good = rec(matmul(64, 1024, 1024), {"TORCH_ENGINE": 1.0}).to_json()
    for bad in (float("inf"), 10**400):
        doc = {**good, "times_ms": {"TORCH_ENGINE": bad}}
        try:
            Record.from_json(doc, "records[0]")
        except InvalidValueError as exc:
            assert "records[0].times_ms.TORCH_ENGINE: expected a finite time > 0" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was taken as a time")

    far = [
        rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1e-3, "CUDNN_ENGINE": 1e308}) for m in (8, 16)
    ]
    (merged, _) = merge(far)
    assert abs(merged.ratios["CUDNN_ENGINE"] - 1e6) < 1  # capped, finite
    save_model(train(far, ModelParams(k=1, radius=4.0)), tmp_path / "m.json")
