"""Mistakes in the selection variables are not silent.

- ``DNNTUNE_HEUR_POLICY_ORDER`` accepts the policies' short names (``Config``, ``Learned``,
  ``StaticOrdering``, any case) besides their full names and ids, and warns once, listing the
  known names, about a name that is no policy (it used to be dropped silently, so
  ``Config,StaticOrdering`` never read the override file).
- A JSON object without ``engine_overrides`` (a graph, a heuristics model) is not an override
  file: readers refuse it naming the file (it used to read as an empty legacy v1 file), while
  ``{"version": 2, "engine_overrides": []}`` stays a valid empty file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from overrides_helpers import FakeEngine, conv_graph, matmul_graph, write_winner
from typer.testing import CliRunner

from dnntune import testing
from dnntune.backend import heuristics
from dnntune.backend.engine import engine_id
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import (
    CONFIG_POLICY,
    LEARNED_POLICY,
    STATIC_POLICY,
    HeuristicMode,
    order_engines,
)
from dnntune.cli.app import app
from dnntune.cli.overrides_cmd import app as overrides_app
from dnntune.errors import ConfigFileError
from dnntune.overrides.format import load_file, parse_document
from dnntune.overrides.merge import describe_file

REPO = Path(__file__).resolve().parents[2]
GRAPH_FILE = REPO / "examples" / "graphs" / "bert_base_layernorm.json"
MODEL_FILE = REPO / "src" / "dnntune" / "backend" / "learned" / "default_model.json"


@pytest.fixture(autouse=True)
def _fresh_warn_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no unknown policy name warned about yet."""
    monkeypatch.setattr(heuristics, "_UNKNOWN_REPORTED", set(), raising=False)


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def _chain(monkeypatch: pytest.MonkeyPatch, value: str) -> list[str]:
    monkeypatch.setenv("DNNTUNE_HEUR_POLICY_ORDER", value)
    return [p.name for p in heuristics._resolve_order()]


# ---- DNNTUNE_HEUR_POLICY_ORDER ----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "Config,StaticOrdering",
        "config, staticordering",
        "SelectionHeuristic::Config,SelectionHeuristic::StaticOrdering",
        f"{engine_id(CONFIG_POLICY)},{engine_id(STATIC_POLICY)}",
        "CONFIG,SelectionHeuristic::StaticOrdering,Config",
        "config,static",  # the labels `dnntune run` prints
    ],
)
def test_policy_order_takes_full_and_short_names_and_ids(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert _chain(monkeypatch, value) == [CONFIG_POLICY, STATIC_POLICY]
    assert caplog.records == []


def test_short_policy_names_use_the_override_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    path = tmp_path / "o.json"
    write_winner(matmul_graph(), path, "FAKE_C")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    monkeypatch.setenv("DNNTUNE_HEUR_POLICY_ORDER", "Config,StaticOrdering")
    decision = order_engines(matmul_graph(), handle, cands, HeuristicMode.A)
    assert decision.policy == CONFIG_POLICY
    assert decision.engines[0].name == "FAKE_C"


def test_an_unknown_policy_name_is_warned_about_once_naming_the_known_ones(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        for _ in range(3):  # the order is resolved on every heuristic query
            assert _chain(monkeypatch, "Confg,StaticOrdering") == [STATIC_POLICY]
    warned = [r for r in caplog.records if "'Confg'" in r.getMessage()]
    assert len(warned) == 1
    message = warned[0].getMessage()
    assert "DNNTUNE_HEUR_POLICY_ORDER" in message and "not a heuristic policy" in message
    for name in (CONFIG_POLICY, LEARNED_POLICY, STATIC_POLICY):
        assert name in message


def test_cli_run_with_short_policy_names_is_chosen_by_config(
    runner: CliRunner, tmp_path: Path
) -> None:
    overrides = tmp_path / "overrides.json"
    write_winner(conv_graph(), overrides, testing.FAKE_ENGINE_C)
    graph = tmp_path / "conv.json"
    conv_graph().save(graph)
    report = tmp_path / "run.json"
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    args = ["run", "-g", str(graph), "--iters", "1", "--warmup", "0", "--no-verify"]
    env = {
        "DNNTUNE_HEUR_CONFIG_PATH": str(overrides),
        "DNNTUNE_HEUR_POLICY_ORDER": "Config,StaticOrdering",
        "COLUMNS": "200",
    }
    with testing.fake_engines(names=names):
        res = runner.invoke(app, [*args, "--json", str(report)], env=env)
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(report.read_text())
    assert (rec["plan"], rec["policy"]) == (testing.FAKE_ENGINE_C, CONFIG_POLICY)


# ---- a document without engine_overrides ----------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({}, "empty object"),
        ({"version": 2}, "keys: version"),
        ({"name": "g", "tensors": [], "nodes": []}, "looks like a graph file"),
        ({"format": "dnntune-heuristics-model", "groups": []}, "dnntune-heuristics-model"),
    ],
)
def test_a_document_without_engine_overrides_is_not_an_override_file(
    doc: object, fragment: str
) -> None:
    with pytest.raises(ConfigFileError, match=r"f\.json: not an engine-override file") as info:
        parse_document(doc, "f.json")
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([{"graph": "g", "winner": "E"}], "it looks like a tune report"),
        ([1, 2], "it is a JSON list"),
        ("text", "top level"),
    ],
)
def test_a_json_list_or_value_is_not_an_override_file_and_a_tune_report_is_named(
    doc: object, fragment: str
) -> None:
    """A tune report given where the override file goes read "expected a JSON object at the
    top level" (new-user audit, session 56)."""
    with pytest.raises(ConfigFileError, match=r"f\.json: expected a JSON object") as info:
        parse_document(doc, "f.json")
    assert fragment in str(info.value)


@pytest.mark.parametrize("path", [GRAPH_FILE, MODEL_FILE], ids=["graph", "model"])
def test_a_graph_or_model_file_is_refused_naming_it(path: Path, runner: CliRunner) -> None:
    with pytest.raises(ConfigFileError, match="not an engine-override file"):
        load_file(path)
    with pytest.raises(ConfigFileError, match="not an engine-override file"):
        describe_file(path)
    res = runner.invoke(overrides_app, ["show", str(path)])
    assert res.exit_code == 1
    assert "not an engine-override file" in res.output and path.name in res.output
    assert "legacy v1" not in res.output


def test_an_empty_valid_file_is_still_an_override_file(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": []}))
    config = load_file(path)
    assert (config.version, config.entries, config.has_version) == (2, [], True)
    res = runner.invoke(overrides_app, ["show", str(path)])
    assert res.exit_code == 0, res.output
    assert "version 2, 0 entries" in " ".join(res.output.split())  # the title may wrap
    write_winner(conv_graph(), path, "FAKE_A")  # the writer appends to it as before
    assert [e.engine_name for e in load_file(path).entries] == ["FAKE_A"]


def test_the_config_policy_declines_a_graph_file_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(GRAPH_FILE))
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        for _ in range(3):
            decision = order_engines(conv_graph(), handle, cands, HeuristicMode.A)
            assert decision.policy == STATIC_POLICY
    warned = [r for r in caplog.records if "not an engine-override file" in r.getMessage()]
    assert len(warned) == 1
    assert str(GRAPH_FILE) in warned[0].getMessage()


def test_cli_run_with_a_graph_as_override_file_warns(runner: CliRunner, tmp_path: Path) -> None:
    graph = tmp_path / "conv.json"
    conv_graph().save(graph)
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B]
    args = ["run", "-g", str(graph), "--iters", "1", "--warmup", "0", "--no-verify"]
    with testing.fake_engines(names=names):
        res = runner.invoke(
            app, args, env={"DNNTUNE_HEUR_CONFIG_PATH": str(graph), "COLUMNS": "200"}
        )
    assert res.exit_code == 0, res.output
    assert "not an engine-override file" in res.output


# ---- a DNNTUNE_HEUR_CONFIG_PATH file that cannot be used says what to try --------------------
def _run_warning(runner: CliRunner, tmp_path: Path, config: Path) -> str:
    graph = tmp_path / "conv.json"
    conv_graph().save(graph)
    args = ["run", "-g", str(graph), "--iters", "1", "--warmup", "0", "--no-verify"]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B]):
        res = runner.invoke(
            app, args, env={"DNNTUNE_HEUR_CONFIG_PATH": str(config), "COLUMNS": "250"}
        )
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())  # the log handler wraps long lines
    assert said.count("DNNTUNE_HEUR_CONFIG_PATH file unusable") == 1, res.stderr
    assert str(config) in said
    return said


def test_a_missing_config_file_says_what_to_try(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    said = _run_warning(runner, tmp_path, missing)
    assert "No such file or directory" in said
    assert "fix the path" in said
    assert f"dnntune tune GRAPH... -o {missing}" in said
    assert "unset DNNTUNE_HEUR_CONFIG_PATH" in said
    assert not said.rstrip().endswith("declining")


def test_a_folder_as_config_file_says_what_to_try(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "tuned"
    folder.mkdir()
    said = _run_warning(runner, tmp_path, folder)
    assert "is a directory" in said.lower()
    assert f"-o {folder / 'overrides.json'}" in said
    assert "unset DNNTUNE_HEUR_CONFIG_PATH" in said


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{oops", "invalid JSON"),
        (b'{"version": 2, "engine_overrides": "x"}', "engine_overrides: expected a list"),
        (b"\xff\xfe not utf-8", "not UTF-8 text (byte 0xff at offset 0)"),
    ],
    ids=["invalid-json", "malformed", "not-utf8"],
)
def test_an_invalid_config_file_says_what_to_try(
    runner: CliRunner, tmp_path: Path, content: bytes, problem: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    said = _run_warning(runner, tmp_path, bad)
    assert problem in said
    assert "fix the file" in said
    assert "dnntune tune GRAPH... -o NEW.json" in said
    assert "unset DNNTUNE_HEUR_CONFIG_PATH" in said
