"""``dnntune heuristics``: usage errors (exit 2) and failures reported in one line, never a
traceback; outputs that would overwrite an input or each other are refused before any work."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import half_matmul
from typer.testing import Result

from dnntune.backend.learned import device_class, load_model, problem_of
from dnntune.learning import Record, write_records_file

Cli = Callable[..., Result]
H200 = device_class("NVIDIA H200")
EPYC = "AMD EPYC 7763"

#: nested deeper than Python's JSON decoder goes (it raises RecursionError, not a decode error)
DEEP = '{"format":"dnntune-heuristics-model","x":' + "[" * 100000 + "]" * 100000 + "}"


def _entry(m: int) -> dict[str, object]:
    return {
        "op": "matmul",
        "engine_name": "TORCH_ENGINE",
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [1, m, 16], "stride": [16 * m, 16, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [1, 16, 8], "stride": [128, 8, 1]},
        ],
        "autotune_metadata": {"device": EPYC},
    }


@pytest.fixture
def overrides(tmp_path: Path) -> Path:
    """An override file as ``dnntune tune -o`` writes it on a CPU: two winners."""
    path = tmp_path / "o1.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": [_entry(8), _entry(64)]}))
    return path


def _usage_error(res: Result, *words: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, ValueError)
    for word in words:
        assert word in res.output, res.output


# ---- outputs: distinct from each other and from every input ------------------------------------
def test_train_refuses_to_write_the_model_over_its_input(
    cli: Cli, overrides: Path, tmp_path: Path
) -> None:
    before = overrides.read_text()
    res = cli("heuristics", "train", str(overrides), "-o", str(overrides))
    _usage_error(res, "is one of the inputs", "write it elsewhere")
    link = tmp_path / "link.json"  # the same file under another name
    link.symlink_to(overrides)
    _usage_error(cli("heuristics", "train", str(overrides), "-o", str(link)), "one of the inputs")
    os.link(overrides, tmp_path / "hard.json")
    res = cli("heuristics", "train", str(overrides), "--json", str(tmp_path / "hard.json"))
    _usage_error(res, "--json", "one of the inputs")
    assert overrides.read_text() == before  # untouched


def test_train_refuses_the_default_override_file_and_a_graph_as_output(
    cli: Cli, overrides: Path, tmp_path: Path
) -> None:
    before = overrides.read_text()
    env = {"DNNTUNE_HEUR_CONFIG_PATH": str(overrides)}
    res = cli("heuristics", "train", "-o", str(overrides), env=env)
    _usage_error(res, "is one of the inputs")
    graph = tmp_path / "g.json"
    half_matmul(8).save(graph)
    res = cli("heuristics", "train", str(overrides), "--graphs", str(graph), "-o", str(graph))
    _usage_error(res, "is one of the inputs")
    assert overrides.read_text() == before


@pytest.mark.parametrize("option", ["--json", "--records-out"])
def test_train_never_replaces_another_kind_of_file_with_json_or_records(
    cli: Cli, overrides: Path, tmp_path: Path, option: str
) -> None:
    """--json and --records-out replaced an override file or a graph silently, while -o
    refused (audit, session 18); a file of their own kind, or an empty one, they replace."""
    other = tmp_path / "other_overrides.json"
    text = json.dumps({"version": 2, "engine_overrides": []})
    other.write_text(text)
    graph = tmp_path / "g.json"
    half_matmul(8).save(graph)
    before = graph.read_text()
    model = tmp_path / "m.json"
    for target in (other, graph):
        res = cli("heuristics", "train", str(overrides), "-o", str(model), option, str(target))
        _usage_error(res, option, "exists and is not a", "remove it first")
    assert other.read_text() == text and graph.read_text() == before
    assert not model.exists()  # refused before any work
    mine = tmp_path / "mine.json"
    args = ["heuristics", "train", str(overrides), "-o", str(model), option, str(mine)]
    assert cli(*args).exit_code == 0
    assert cli(*args).exit_code == 0  # its own file again: replaced
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert cli(*args[:-1], str(empty)).exit_code == 0
    if option == "--json":  # an evaluation written before it was marked with a format
        old = tmp_path / "old_evaluation.json"
        old.write_text(json.dumps({"method": "grouped K-fold by shape", "cases": []}))
        assert cli(*args[:-1], str(old)).exit_code == 0
        assert json.loads(old.read_text())["format"] == "dnntune-heuristics-evaluation"


@pytest.mark.parametrize(
    ("first", "second"), [("-o", "--json"), ("-o", "--records-out"), ("--records-out", "--json")]
)
def test_train_refuses_two_outputs_on_one_file(
    cli: Cli, overrides: Path, tmp_path: Path, first: str, second: str
) -> None:
    out = tmp_path / "m.json"
    args = ["-o", str(tmp_path / "model.json"), first, str(out), second, str(out)]
    res = cli("heuristics", "train", str(overrides), *args)
    _usage_error(res, f"is also the {first} file", "its own name")
    assert not out.exists() and not (tmp_path / "model.json").exists()


def test_train_refuses_an_output_that_is_training_data_in_a_folder_given(
    cli: Cli, overrides: Path, tmp_path: Path
) -> None:
    before = overrides.read_text()
    res = cli("heuristics", "train", str(tmp_path), "-o", str(overrides))
    # refused as a file that is no model (before session 15: as training data in the folder)
    _usage_error(res, "is not a dnntune heuristics model")
    assert overrides.read_text() == before
    # a model beside the data is no training data: retraining into it is fine
    model = tmp_path / "model.json"
    assert cli("heuristics", "train", str(tmp_path), "-o", str(model)).exit_code == 0
    res = cli("heuristics", "train", str(tmp_path), "-o", str(model))
    assert res.exit_code == 0, res.output
    assert load_model(model).point_count == 2


@pytest.mark.parametrize(
    ("option", "name"),
    [("-o", "heuristics_model.json"), ("--json", "evaluation.json"), ("--records-out", "records")],
)
def test_an_output_that_is_a_directory_suggests_a_file_of_its_kind(
    cli: Cli, overrides: Path, tmp_path: Path, option: str, name: str
) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    args = ["-o", str(tmp_path / "m.json"), option, str(folder)]
    res = cli("heuristics", "train", str(overrides), *args)
    _usage_error(res, "is a directory", name)
    assert "overrides.json" not in res.output


# ---- numbers, paths, environment ---------------------------------------------------------------
@pytest.mark.parametrize("radius", ["inf", "-inf", "nan", "-1"])
def test_a_radius_that_is_not_a_finite_number_is_a_usage_error(
    cli: Cli, overrides: Path, tmp_path: Path, radius: str
) -> None:
    model = tmp_path / "m.json"
    res = cli("heuristics", "train", str(overrides), "-o", str(model), "--radius", radius)
    _usage_error(res, "--radius", "expected a finite number >= 0")
    assert not model.exists()


def test_graphs_that_do_not_exist_are_a_usage_error(
    cli: Cli, overrides: Path, tmp_path: Path
) -> None:
    model = tmp_path / "m.json"
    res = cli("heuristics", "train", str(overrides), "-o", str(model), "--graphs", "/no/such/dir")
    _usage_error(res, "--graphs", "/no/such/dir", "does not exist")
    assert not model.exists()


@pytest.mark.parametrize("name", ["", "   ", "--"])
def test_a_device_name_without_letters_or_digits_is_a_usage_error(
    cli: Cli, overrides: Path, tmp_path: Path, name: str
) -> None:
    """A blank --device-name keyed every record to device class "unknown", which no device
    has: train wrote a model that never answers, exit 0 (audit, session 19)."""
    model = tmp_path / "m.json"
    res = cli("heuristics", "train", str(overrides), "-o", str(model), "--device-name", name)
    _usage_error(res, "--device-name", "expected a device model name")
    assert not model.exists()
    graph = tmp_path / "g.json"
    half_matmul(3).save(graph)
    shipped = str(Path(__file__).parents[2] / "src/dnntune/backend/learned/default_model.json")
    res = cli("heuristics", "predict", shipped, "-g", str(graph), "--device-name", name)
    _usage_error(res, "--device-name", "expected a device model name")


def test_a_configured_override_file_that_does_not_exist_is_named(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    env = {"DNNTUNE_HEUR_CONFIG_PATH": str(missing)}
    res = cli("heuristics", "train", "-o", str(tmp_path / "m.json"), env=env)
    assert res.exit_code == 1
    assert f"DNNTUNE_HEUR_CONFIG_PATH names {missing}, which does not exist" in res.output
    assert "unset" not in res.output
    # with an exact-match cache to read, the missing file is a warning
    cache = tmp_path / "cache"
    (cache / "autotune-rankings").mkdir(parents=True)
    env["DNNTUNE_CACHE_DIR"] = str(cache)
    res = cli("heuristics", "train", "-o", str(tmp_path / "m.json"), env=env)
    assert "warning" in res.output and f"names {missing}, which does not exist" in res.output
    # unset, it says so
    res = cli("heuristics", "train", "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 1 and "DNNTUNE_HEUR_CONFIG_PATH unset" in res.output


def test_a_cache_setting_that_names_a_file_is_said_so(cli: Cli, tmp_path: Path) -> None:
    """With DNNTUNE_CACHE_DIR naming a file, train said "no exact-match cache at
    FILE/autotune-rankings" and nothing of the setting being wrong (audit, session 61)."""
    a_file = tmp_path / "cache.txt"
    a_file.write_text("not a folder")
    for root in (a_file, a_file / "below"):
        env = {"DNNTUNE_CACHE_DIR": str(root)}
        res = cli("heuristics", "train", "-o", str(tmp_path / "m.json"), env=env)
        assert res.exit_code == 1
        flat = " ".join(res.output.split())
        assert f"DNNTUNE_CACHE_DIR names {root}" in flat and "set it to a folder" in flat


# ---- unreadable files and bugs: one line, no traceback -----------------------------------------
def test_a_file_nested_too_deeply_is_invalid_json(cli: Cli, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    res = cli("heuristics", "show", str(deep))
    assert res.exit_code == 1 and not isinstance(res.exception, RecursionError)
    assert f"{deep}: not valid JSON (nested too deeply)" in res.output
    res = cli("heuristics", "train", str(deep), "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 1 and not isinstance(res.exception, RecursionError)
    assert f"{deep}: not readable JSON (invalid JSON: nested too deeply)" in res.output
    assert "no training records" in res.output


def test_an_unexpected_error_is_one_line_not_a_traceback(
    cli: Cli, overrides: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("dnntune.cli.heuristics_cmd.train_and_evaluate", boom)
    res = cli("heuristics", "train", str(overrides), "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert "internal error: RuntimeError: boom" in res.output
    assert "run with -v for the traceback" in res.output
    res = cli("-v", "heuristics", "train", str(overrides), "-o", str(tmp_path / "m.json"))
    assert res.exit_code == 1 and "Traceback" in res.output  # asked for
    monkeypatch.setattr("dnntune.cli.heuristics_cmd.load_model", boom)
    res = cli("heuristics", "show", str(overrides))
    assert res.exit_code == 1 and "internal error: RuntimeError: boom" in res.output

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dnntune.cli.heuristics_cmd.load_model", interrupt)
    res = cli("heuristics", "show", str(overrides))
    assert res.exit_code == 130 and "interrupted" in res.output


# ---- predict: the static order of the device given ---------------------------------------------
def test_predict_for_a_cpu_uses_the_cpu_static_order(cli: Cli, tmp_path: Path) -> None:
    cpu = device_class(EPYC)
    records = []
    for m in (1, 2, 4, 8, 16, 1024, 2048, 4096):
        times = {"TORCH_ENGINE": 1.0, "TORCH_COMPILE_ENGINE": 1.5 if m < 1000 else 0.5}
        records.append(Record(problem_of(half_matmul(m)), cpu, times, source=f"cpu{m}"))
        times = {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 2.0}
        records.append(Record(problem_of(half_matmul(m)), H200, times, source=f"gpu{m}"))
    data = write_records_file(records, tmp_path / "records.json")
    model = tmp_path / "model.json"
    assert cli("heuristics", "train", str(data), "-o", str(model)).exit_code == 0
    graph = tmp_path / "g.json"
    half_matmul(3).save(graph)
    res = cli("heuristics", "predict", str(model), "-g", str(graph), "--device-name", EPYC)
    assert res.exit_code == 0, res.output
    assert "static order (A): TORCH_ENGINE, TORCH_COMPILE_ENGINE\n" in res.output
    assert "learned order (B): TORCH_ENGINE, TORCH_COMPILE_ENGINE" in res.output
    assert "CUDNN_ENGINE" not in res.output
    res = cli("heuristics", "predict", str(model), "-g", str(graph), "--device-name", "NVIDIA H200")
    assert res.exit_code == 0, res.output
    assert "static order (A): CUDNN_ENGINE, TORCH_ENGINE" in res.output
