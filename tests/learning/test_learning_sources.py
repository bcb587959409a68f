"""Training records from dnntune's own files: bench results, tune reports, override files, the
exact-match cache, records files; merging repeated measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from learning_helpers import H200, F, layernorm, matmul, rec
from overrides_helpers import result
from typer.testing import CliRunner

import dnntune as dt
from dnntune.backend.engine import engine_id
from dnntune.backend.learned import device_class, problem_of
from dnntune.cli.app import app
from dnntune.errors import ConfigFileError
from dnntune.learning import collect, merge, order_record, read_records_file, write_records_file
from dnntune.overrides import exact_cache


def _row(engine: str, median_ms: float | None, **extra: Any) -> dict[str, Any]:
    row = {
        "provider": "dnntune",
        "engine": {"id": "0x0", "name": engine},
        "status": "success",
        "verdict": "passed",
        "kernel": {"median_ms": median_ms},
    }
    row.update(extra)
    return row


def _bench_doc(graph_path: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "tool": {"name": "dnntune", "version": "0"},
        "environment": {"device": {"type": "cuda", "name": "NVIDIA H200"}},
        "graphs": [
            {"graph_id": "x", "graph_path": graph_path, "status": "ok", "results": rows},
            {"graph_id": "y", "graph_path": "gone.json", "status": "error", "results": []},
        ],
    }


def test_bench_results_rows_become_engine_times_and_oracle_configs(tmp_path: Path) -> None:
    (tmp_path / "graphs").mkdir()
    matmul(64, 1024, 1024).save(tmp_path / "graphs" / "mm.json")
    rows = [
        _row(
            "CUDNN_ENGINE",
            0.05,
            oracle={"knob_settings": [{"knob_id": "cudnn.engine_config", "value": 3}]},
            oracle_delta={"tuned_median_ms": 0.04},
        ),
        _row("TORCH_ENGINE", 0.08),
        _row("TRITON_ENGINE", 0.01, verdict="failed"),  # a wrong answer is no time
        _row("TORCH_COMPILE_ENGINE", None, status="error", verdict="error"),
    ]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_bench_doc("mm.json", rows)))
    found = collect([results], [tmp_path / "graphs"])
    (r,) = found.records
    assert r.device_class == H200
    assert r.times_ms == {"CUDNN_ENGINE": 0.05, "TORCH_ENGINE": 0.08}
    assert r.configs == {"CUDNN_ENGINE": {"knobs": {"cudnn.engine_config": 3}, "time_ms": 0.04}}
    assert r.problem == problem_of(matmul(64, 1024, 1024))
    assert found.files == [str(results)]


def test_a_training_file_naming_a_key_twice_is_skipped_with_a_note(tmp_path: Path) -> None:
    """A bench results file whose row names its time twice (a hand edit: json kept the last,
    another engine won) is skipped whole with a note naming the key, as a file that is not JSON
    is; the file beside it is still read."""
    (tmp_path / "graphs").mkdir()
    matmul(64, 1024, 1024).save(tmp_path / "graphs" / "mm.json")
    rows = [_row("CUDNN_ENGINE", 0.05), _row("TORCH_ENGINE", 0.08)]
    text = json.dumps(_bench_doc("mm.json", rows))
    (tmp_path / "good.json").write_text(text)
    twice = text.replace('"median_ms": 0.05', '"median_ms": 0.5, "median_ms": 0.05', 1)
    assert twice != text
    (tmp_path / "twice.json").write_text(twice)
    found = collect([tmp_path / "good.json", tmp_path / "twice.json"], [tmp_path / "graphs"])
    assert found.files == [str(tmp_path / "good.json")]
    (r,) = found.records
    assert r.times_ms == {"CUDNN_ENGINE": 0.05, "TORCH_ENGINE": 0.08}
    (note,) = [n for n in found.notes if "twice.json" in n]
    assert 'the key "median_ms" appears twice' in note and note.endswith("skipped")


def test_bench_rows_timed_on_a_busy_cpu_are_not_learned(tmp_path: Path) -> None:
    """A bench row whose timing threads waited for a core a quarter of the time or more (bench
    flags it "CPU busy") is not a label, as a tune report's entry timed so is not: a busy CPU's
    times rank the load, not the engines. The skip is noted."""
    (tmp_path / "graphs").mkdir()
    matmul(64, 1024, 1024).save(tmp_path / "graphs" / "mm.json")
    rows = [
        _row("CUDNN_ENGINE", 0.05, timing={"cpu_wait_share": 0.01}),
        _row("TORCH_ENGINE", 0.02, timing={"cpu_wait_share": 0.6}),  # busy: not learned
        _row("TRITON_ENGINE", 0.07, timing={"cpu_wait_share": None}),  # not measured: kept
    ]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_bench_doc("mm.json", rows)))
    found = collect([results], [tmp_path / "graphs"])
    (r,) = found.records
    assert r.times_ms == {"CUDNN_ENGINE": 0.05, "TRITON_ENGINE": 0.07}
    assert any("1 row(s) timed while the CPU was busy" in n for n in found.notes)


def test_a_real_bench_run_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = tmp_path / "mm.json"
    matmul(4, 32, 32, F).save(graph)
    out = tmp_path / "bench.json"
    monkeypatch.chdir(tmp_path)
    # the run's CPU wait unmeasured: on a loaded test machine its row would be flagged busy
    # and, rightly, not learned (test_bench_rows_timed_on_a_busy_cpu_are_not_learned)
    from dnntune.measure import contention

    monkeypatch.setattr(contention, "timer_wait_s", lambda *args, **kwargs: None)
    args = [
        "bench",
        "-g",
        "mm.json",
        "--device",
        "cpu",
        "--engine",
        "TORCH_ENGINE",
        "--iters",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
        "-q",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0
    (r,) = collect([out]).records
    cpu = dt.create_handle("cpu").device_signature()["name"]
    assert r.device_class == device_class(str(cpu))
    assert set(r.times_ms) == {"TORCH_ENGINE"} and r.times_ms["TORCH_ENGINE"] > 0


def test_tune_reports_need_a_device_name(tmp_path: Path) -> None:
    g = tmp_path / "ln.json"
    layernorm(4096, 1024).save(g)
    report = [
        {
            "graph": "ln",
            "source": str(g),
            "graph_key": "k",
            "device": "cuda:0",
            "ok": True,
            "winner": {"engine_name": "CUDNN_ENGINE", "median_time_ms": 0.05, "knobs": {}},
            "runner_up": {"engine_name": "TRITON_ENGINE", "median_time_ms": 0.06, "knobs": {}},
        }
    ]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    found = collect([path])
    assert not found.records and "--device-name" in found.notes[0]
    (r,) = collect([path], device_name="NVIDIA H200").records
    assert r.times_ms == {"CUDNN_ENGINE": 0.05, "TRITON_ENGINE": 0.06}


def test_override_entries_are_winner_only_records(tmp_path: Path) -> None:
    doc = {
        "version": 2,
        "engine_overrides": [
            {
                "op": "conv_fprop",
                "engine_name": "CUDNN_ENGINE",
                "tensors": [
                    {"tensor_id": "x_tensor_uid", "dim": [2, 8, 8, 8], "stride": [512, 64, 8, 1]},
                    {"tensor_id": "w_tensor_uid", "dim": [16, 8, 3, 3], "stride": [72, 9, 3, 1]},
                ],
                "autotune_metadata": {"device": "NVIDIA H200", "median_time_ms": 0.02},
            },
            {  # a generalized entry is no single problem
                "op": "matmul",
                "engine_name": "TORCH_ENGINE",
                "tensors": [{"tensor_id": "a_tensor_uid", "dim": [-1, 8], "stride": [8, 1]}],
                "autotune_metadata": {"device": "NVIDIA H200"},
            },
            {
                "op": "matmul",
                "engine_name": "TORCH_ENGINE",
                "tensors": [{"tensor_id": "a_tensor_uid", "dim": [4, 8], "stride": [8, 1]}],
            },
        ],
    }
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(doc))
    found = collect([path])
    (r,) = found.records
    assert r.order_only and r.times_ms == {"CUDNN_ENGINE": 1.0}
    assert r.problem.op == "conv_fprop" and r.problem.dtype is None
    assert r.device_class == H200
    assert any(
        "no autotune_metadata.device (give the device with --device-name)" in n for n in found.notes
    )
    # the generalized entry is skipped with a note (it was skipped without one, and train then
    # said to pass override files; new-user audit, session 56)
    assert any("1 generalized entry (-1 wildcards" in n for n in found.notes)
    # an entry without a device takes --device-name
    named = collect([path], device_name="NVIDIA H100 80GB HBM3")
    assert sorted(r.device_class for r in named.records) == sorted(
        [H200, device_class("NVIDIA H100 80GB HBM3")]
    )


def test_exact_cache_rankings_need_the_graph_and_this_machine(tmp_path: Path) -> None:
    g = matmul(8, 64, 64, F)
    handle = dt.create_handle("cpu")
    results = [result("TORCH_COMPILE_ENGINE", 0), result("TORCH_ENGINE", 1)]
    ids = [engine_id("TORCH_ENGINE"), engine_id("TORCH_COMPILE_ENGINE")]
    assert exact_cache.write_ranking(g, handle, results, ids, complete=True).name == "WRITTEN"
    rankings = exact_cache.rankings_dir()
    without = collect([rankings])
    assert not without.records and "no graph file given" in without.notes[0]
    g.save(tmp_path / "g.json")
    (r,) = collect([rankings], [tmp_path]).records
    assert r.order_only
    assert r.times_ms == {"TORCH_COMPILE_ENGINE": 1.0, "TORCH_ENGINE": 1.05}
    assert r.device_class == device_class(str(handle.device_signature()["name"]))


def test_exact_cache_rankings_skip_bad_lines_and_other_keys(tmp_path: Path) -> None:
    """Training reads a ranking file as the cache does: the last valid record of the file's
    own key (a malformed line, or a record of another key, is skipped, not an internal
    error)."""
    import json

    g = matmul(8, 64, 64, F)
    handle = dt.create_handle("cpu")
    results = [result("TORCH_COMPILE_ENGINE", 0), result("TORCH_ENGINE", 1)]
    ids = [engine_id("TORCH_ENGINE"), engine_id("TORCH_COMPILE_ENGINE")]
    assert exact_cache.write_ranking(g, handle, results, ids, complete=True).name == "WRITTEN"
    g.save(tmp_path / "g.json")
    path = exact_cache.cache_path(exact_cache.cache_key(g, handle))
    last = json.loads(path.read_text().splitlines()[-1])
    foreign = {**last, "key": "0" * len(last["key"]), "order": list(reversed(last["order"]))}
    with open(path, "a") as f:
        f.write(json.dumps({**last, "engine_names": ["oops"]}) + "\n")
        f.write(json.dumps(foreign) + "\n")
    (r,) = collect([exact_cache.rankings_dir()], [tmp_path]).records
    assert r.times_ms == {"TORCH_COMPILE_ENGINE": 1.0, "TORCH_ENGINE": 1.05}


def test_default_paths_are_the_cache_and_the_override_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.learning import default_paths

    assert default_paths() == []  # a fresh cache dir holds nothing yet
    overrides = tmp_path / "o.json"
    overrides.write_text('{"version": 2, "engine_overrides": []}')
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(overrides))
    assert default_paths() == [overrides]


def test_records_file_round_trip_and_errors(tmp_path: Path) -> None:
    records = [rec(matmul(8, 64, 64), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 2.0})]
    path = write_records_file(records, tmp_path / "r.json", note="test")
    assert read_records_file(path) == records
    assert collect([tmp_path]).records == records  # found by walking the folder
    doc = json.loads(path.read_text())
    doc["records"][0]["times_ms"]["TORCH_ENGINE"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigFileError, match=r"records\[0\]\.times_ms\.TORCH_ENGINE"):
        read_records_file(path)
    doc["format_version"] = 9
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigFileError, match="format_version 9"):
        read_records_file(path)


def test_unrecognised_and_broken_files_are_notes_not_errors(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{broken")
    (tmp_path / "b.json").write_text('{"hello": 1}')
    (tmp_path / "c.json").write_text("null")  # was taken for a ranking (session 15 audit)
    found = collect([tmp_path])
    assert not found.records
    assert any("not readable JSON" in n for n in found.notes)
    unrecognised = [n for n in found.notes if "not a recognised tuning-history file" in n]
    assert {Path(n.split(":")[0]).name for n in unrecognised} == {"b.json", "c.json"}


def test_files_nested_too_deeply_are_notes_not_errors(tmp_path: Path) -> None:
    """Past the JSON decoder's nesting limit (a RecursionError): a history file, a records
    file and a graph file named by results are each invalid JSON, never a crash."""
    deep = "[" * 100000 + "]" * 100000
    history = tmp_path / "history"
    history.mkdir()
    (history / "deep.json").write_text(
        '{"format": "dnntune-heuristics-records", "x": ' + deep + "}"
    )
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "g.json").write_text('{"tensors": ' + deep + ', "nodes": []}')
    doc = _bench_doc("g.json", [_row("TORCH_ENGINE", 1.0), _row("CUDNN_ENGINE", 2.0)])
    (history / "bench.json").write_text(json.dumps(doc))
    found = collect([history], [graphs])
    assert not found.records
    deep_note = f"{history / 'deep.json'}: not readable JSON (invalid JSON: nested too deeply)"
    assert f"{deep_note}; skipped" in found.notes
    assert any("graph 'g.json' not found" in n for n in found.notes)
    with pytest.raises(ConfigFileError, match="invalid JSON: nested too deeply"):
        read_records_file(history / "deep.json")


def test_merge_combines_repeats_and_prefers_measured_records() -> None:
    g = matmul(8, 64, 64)
    first = rec(g, {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 2.0})
    second = rec(g, {"TORCH_ENGINE": 4.0, "CUDNN_ENGINE": 2.0, "TRITON_ENGINE": 8.0})
    winner = order_record(problem_of(g), H200, ["CUDNN_ENGINE"], "overrides")
    (m,) = merge([first, second, winner])
    assert m.records == 2 and not m.order_only
    # slowdowns vs each record's fastest, geometric mean over the records that measured them,
    # then against the fastest of those: TORCH and CUDNN each won once by 2x (a tie)
    assert m.ratios["TORCH_ENGINE"] == pytest.approx(1.0)
    assert m.ratios["CUDNN_ENGINE"] == pytest.approx(1.0)
    assert m.ratios["TRITON_ENGINE"] == pytest.approx(4.0 / 2.0**0.5)
    (only,) = merge([winner])
    assert only.order_only and only.best == "CUDNN_ENGINE"
    other_device = rec(g, {"TORCH_ENGINE": 1.0}, device="nvidia-a100")
    assert len(merge([first, other_device])) == 2


def test_a_file_that_names_a_key_twice_is_skipped_with_a_note(tmp_path: Path) -> None:
    """``overrides show`` refuses an override file with a key named twice; ``heuristics train``
    read it with the last value kept, silently."""
    (tmp_path / "o.json").write_text(
        '{"version": 2, "engine_overrides": [{"engine_name": "A", "engine_name": "B"}]}'
    )
    found = collect([tmp_path])
    assert not found.records
    assert any(
        n.startswith(f'{tmp_path / "o.json"}: engine_overrides[0]: the key "engine_name"')
        and n.endswith("; skipped")
        for n in found.notes
    ), found.notes
