"""``dnntune heuristics train | show | predict`` through the real entry point."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import half_matmul
from typer.testing import Result

from dnntune.backend.learned import device_class, load_model, problem_of
from dnntune.learning import Record, write_records_file

Cli = Callable[..., Result]
H200 = device_class("NVIDIA H200")


@pytest.fixture
def records_file(tmp_path: Path) -> Path:
    """Ten matmul shapes on the H200: TORCH wins small M, CUDNN large M."""
    records = []
    for m in (1, 2, 4, 8, 16):
        times = {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.3}
        records.append(Record(problem_of(half_matmul(m)), H200, times, source=f"m{m}"))
    for m in (1024, 2048, 4096, 8192, 16384):
        times = {"TORCH_ENGINE": 1.3, "CUDNN_ENGINE": 1.0}
        records.append(Record(problem_of(half_matmul(m)), H200, times, source=f"m{m}"))
    return write_records_file(records, tmp_path / "history" / "records.json")


def test_train_on_two_devices_prints_each_devices_scores(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    """Records of an H200 and an H100: a table per device; one device prints none."""
    h100 = device_class("NVIDIA H100 80GB HBM3")
    records = []
    for m, torch_ms in ((1, 1.0), (2, 1.0), (4, 1.0), (4096, 1.3), (8192, 1.3), (16384, 1.3)):
        times = {"TORCH_ENGINE": torch_ms, "CUDNN_ENGINE": 1.15}
        records.append(Record(problem_of(half_matmul(m)), h100, times, source=f"h100 m{m}"))
    other = write_records_file(records, tmp_path / "h100.json")
    res = cli("heuristics", "train", str(records_file), str(other), "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 0, res.output
    assert "by device (held-out)" in res.output
    assert "nvidia-h100-80gb-hbm3" in res.output and "nvidia-h200" in res.output
    one = cli("heuristics", "train", str(records_file), "-o", str(tmp_path / "one.json"))
    assert one.exit_code == 0 and "by device" not in one.output


def test_train_prints_an_honest_evaluation_and_writes_the_model(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model.json"
    cases = tmp_path / "cases.json"
    res = cli(
        "heuristics",
        "train",
        str(records_file),
        "-o",
        str(model),
        "--folds",
        "3",
        "--json",
        str(cases),
    )
    assert res.exit_code == 0, res.output
    assert "10 problem(s)" in res.output
    assert "grouped K-fold by shape" in res.output and "3 folds" in res.output
    assert "A (static order)" in res.output and "B (learned)" in res.output
    assert "top-1" in res.output and "regret geomean" in res.output
    # top-1 over the problems whose two fastest engines are >= 2 % apart, with their count
    assert "top-1 clear" in res.output and "two fastest engines differ" in res.output
    clear = json.loads(cases.read_text())["B"]
    assert f"of {clear['n_clear']}" in res.output
    loaded = load_model(model)
    assert loaded.point_count == 10 and loaded.evaluation is not None
    detail = json.loads(cases.read_text())
    assert len(detail["cases"]) == 10 and detail["A"]["n"] == 10


def test_train_with_fixed_parameters_and_a_folder(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    model = tmp_path / "m.json"
    res = cli(
        "heuristics",
        "train",
        str(records_file.parent),
        "-o",
        str(model),
        "--k",
        "1",
        "--radius",
        "5",
        "--folds",
        "2",
    )
    assert res.exit_code == 0, res.output
    assert "k and radius chosen" not in res.output
    assert (load_model(model).params.k, load_model(model).params.radius) == (1, 5.0)
    # fixed parameters train with both vote rules on, and the model line and show say so
    assert "consensus=3 far_gain=3" in res.output
    shown = cli("heuristics", "show", str(model))
    assert shown.exit_code == 0, shown.output
    assert "consensus=3 far_gain=3" in shown.output


def test_train_without_records_fails_cleanly(cli: Cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli("heuristics", "train", str(empty), "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 1
    assert "no training records" in res.output
    assert "pass `dnntune bench -o` results, `dnntune tune --report` reports" in res.output
    assert not (tmp_path / "m.json").exists()
    res = cli("heuristics", "train", str(tmp_path / "nope.json"))
    assert res.exit_code == 2
    res = cli("heuristics", "train", "-o", str(tmp_path / "m.json"))  # nothing by default
    assert res.exit_code == 1 and "no tuning history" in res.output


def test_train_defaults_to_the_override_file(cli: Cli, tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.json"
    entry = {
        "op": "matmul",
        "engine_name": "TORCH_ENGINE",
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [8, 1024], "stride": [1024, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [1024, 1024], "stride": [1, 1024]},
        ],
        "autotune_metadata": {"device": "NVIDIA H200"},
    }
    overrides.write_text(json.dumps({"version": 2, "engine_overrides": [entry]}))
    model = tmp_path / "m.json"
    res = cli(
        "heuristics", "train", "-o", str(model), env={"DNNTUNE_HEUR_CONFIG_PATH": str(overrides)}
    )
    assert res.exit_code == 0, res.output
    assert "1 winner/order only" in res.output
    assert "no held-out problem could be scored" in res.output
    # why: winner-only records, not "too little data" (new-user audit, session 56)
    assert "name each problem's winner only" in " ".join(res.output.split())
    assert load_model(model).point_count == 1


def test_show_lists_parameters_groups_and_points(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model.json"
    assert cli("heuristics", "train", str(records_file), "-o", str(model)).exit_code == 0
    res = cli("heuristics", "show", str(model), "--points")
    assert res.exit_code == 0, res.output
    assert "nvidia-h200" in res.output and "matmul" in res.output
    assert "TORCH_ENGINE 5" in res.output and "CUDNN_ENGINE 5" in res.output
    assert "trained problems" in res.output and "m=16384" in res.output
    assert "B (learned)" in res.output  # the evaluation the model carries


def test_show_a_corrupt_model_says_what_to_do(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dnntune-heuristics-model", "format_version": 99}')
    res = cli("heuristics", "show", str(bad))
    assert res.exit_code == 1
    assert "format_version 99 is not supported" in res.output
    assert "dnntune heuristics train" in res.output


@pytest.mark.parametrize("command", ["show", "predict"])
def test_a_file_that_is_no_model_gets_command_line_advice(
    cli: Cli, tmp_path: Path, command: str
) -> None:
    """The library's advice is for a run (point DNNTUNE_HEUR_MODEL_PATH at a model, B falls
    back to A meanwhile); given on the command line, the file wants the command's advice."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"schema_version": 1, "tool": "dnntune bench"}))
    graph = tmp_path / "g.json"
    half_matmul(3).save(graph)
    extra = ["-g", str(graph), "--device-name", "NVIDIA H200"] if command == "predict" else []
    res = cli("heuristics", command, str(results), *extra)
    assert res.exit_code == 1
    said = " ".join(res.stderr.split())
    assert "not a dnntune-heuristics-model file" in said
    assert "DNNTUNE_HEUR_MODEL_PATH" not in said and "meanwhile" not in said
    assert "the one dnntune ships:" in said and "default_model.json" in said


@pytest.mark.parametrize(
    ("doc", "said", "reader"),
    [
        (
            {"version": 2, "engine_overrides": []},
            "an engine-override file (what `dnntune tune` writes)",
            "`dnntune overrides show FILE` checks it",
        ),
        (
            [{"graph": "mm", "source": "mm.json", "winner": None, "ok": False}],
            "a `dnntune tune --report` file",
            "its `source` fields name the graphs it tuned",
        ),
    ],
    ids=["overrides", "tune-report"],
)
def test_show_names_another_dnntune_file(
    cli: Cli, tmp_path: Path, doc: object, said: str, reader: str
) -> None:
    """``heuristics show overrides.json`` said only that it is no model: it names the file's
    kind and what reads it, then what to give instead."""
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    res = cli("heuristics", "show", str(path))
    assert res.exit_code == 1
    text = " ".join(res.stderr.split())
    assert f"{said}, not a dnntune-heuristics-model file; {reader}" in text
    assert "give a model that `dnntune heuristics train ... -o FILE` wrote" in text


def test_predict_one_graph(cli: Cli, records_file: Path, tmp_path: Path) -> None:
    model = tmp_path / "model.json"
    assert cli("heuristics", "train", str(records_file), "-o", str(model)).exit_code == 0
    graph = tmp_path / "g.json"
    half_matmul(3).save(graph)
    res = cli("heuristics", "predict", str(model), "-g", str(graph), "--device-name", "NVIDIA H200")
    assert res.exit_code == 0, res.output
    assert "learned order (B): TORCH_ENGINE" in res.output
    res = cli("heuristics", "predict", str(model), "-g", str(graph), "--device-name", "A100")
    assert res.exit_code == 0 and "declined" in res.output


def test_an_output_that_cannot_be_written_is_a_usage_error(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = cli("heuristics", "train", str(records_file), "-o", str(blocker / "model.json"))
    assert res.exit_code == 2


def test_train_never_replaces_a_file_that_is_not_a_model(
    cli: Cli, records_file: Path, tmp_path: Path
) -> None:
    """Following an error's advice (`train ... -o overrides.json`) replaced the override file
    with a model, its tuned entries lost (new-user audit, session 15)."""
    overrides = tmp_path / "overrides.json"
    text = json.dumps({"version": 2, "engine_overrides": []})
    overrides.write_text(text)
    res = cli("heuristics", "train", str(records_file), "-o", str(overrides))
    assert res.exit_code == 2
    assert "is not a dnntune heuristics model" in res.output
    assert overrides.read_text() == text
    model = tmp_path / "m.json"
    assert cli("heuristics", "train", str(records_file), "-o", str(model)).exit_code == 0
    assert cli("heuristics", "train", str(records_file), "-o", str(model)).exit_code == 0
    res = cli("heuristics", "show", str(overrides))
    assert res.exit_code == 1 and f"-o {overrides}" not in res.output


def test_train_skips_malformed_records_with_a_warning(cli: Cli, tmp_path: Path) -> None:
    """A bench row whose "engine" is a string, a tune report whose winner's engine_name is
    a list: "internal error: AttributeError/TypeError" (audit, session 18). Now each is a
    warning naming the file, and training goes on with the rest."""
    (tmp_path / "graphs").mkdir()
    half_matmul(8).save(tmp_path / "graphs" / "mm.json")
    row = {"provider": "dnntune", "engine": "TORCH_ENGINE", "status": "success"}
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "environment": {"device": {"name": "NVIDIA H200"}},
                "graphs": [
                    {
                        "graph_path": "mm.json",
                        "status": "ok",
                        "results": [{**row, "verdict": "passed", "kernel": {"median_ms": 1}}],
                    }
                ],
            }
        )
    )
    report = tmp_path / "report.json"
    winner = {"engine_name": ["a"], "median_time_ms": 0.05}
    report.write_text(
        json.dumps([{"graph_key": "k", "ok": True, "source": "mm.json", "winner": winner}])
    )
    res = cli(
        "heuristics", "train", str(bench), str(report), "--graphs", str(tmp_path / "graphs"),
        "--device-name", "NVIDIA H200", "-o", str(tmp_path / "m.json"),
    )  # fmt: skip
    assert "internal error" not in res.output
    assert res.exit_code == 1  # nothing usable was left: no training records
    flat = " ".join(res.output.split())
    assert f"{bench}: graphs[0]: a result row whose engine or kernel is malformed" in flat
    assert f"{report}: [0]: winner's engine_name is malformed" in flat


@pytest.mark.parametrize(
    ("field", "value"), [("evaluation", {"problems": 3}), ("training", {"sources": 5})]
)
def test_show_a_model_with_a_malformed_block_shows_the_rest(
    cli: Cli, records_file: Path, tmp_path: Path, field: str, value: object
) -> None:
    """A model file load_model accepts, whose evaluation or training block has another
    shape: show crashed with an internal error (audit, session 18)."""
    model = tmp_path / "model.json"
    assert cli("heuristics", "train", str(records_file), "-o", str(model)).exit_code == 0
    doc = json.loads(model.read_text())
    doc[field] = value
    model.write_text(json.dumps(doc))
    res = cli("heuristics", "show", str(model))
    assert res.exit_code == 0, res.output
    assert "internal error" not in res.output
    assert "groups" in res.output and "nvidia-h200" in res.output
    if field == "evaluation":
        assert "the stored evaluation is malformed" in " ".join(res.output.split())
    else:
        assert "from ? file(s)" in res.output
