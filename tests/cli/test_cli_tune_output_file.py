"""``dnntune tune -o FILE``: the output checked before tuning, links, refusals, lock, messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import REPO
from typer.testing import Result

import dnntune.workflows.tuning
from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


@pytest.fixture
def tuned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources ``tune_graph`` was called for (empty: no tuning started)."""
    real = dnntune.workflows.tuning.tune_graph
    calls: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> dnntune.workflows.tuning.GraphTuneReport:
        calls.append(kwargs.get("source", ""))
        return real(*args, **kwargs)

    monkeypatch.setattr(dnntune.workflows.tuning, "tune_graph", counting)
    return calls


def said(result: Result) -> str:
    """stderr as one line: rich wraps messages and draws a box around usage errors."""
    return " ".join(result.stderr.replace("\u2502", " ").split())


def ops(path: Path) -> list[str]:
    return [e["op"] for e in json.loads(path.read_text())["engine_overrides"]]


# ---- item 1: a symbolic link is written through --------------------------------------------


def test_output_link_is_written_through_to_its_target(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "shared" / "overrides.json"
    target.parent.mkdir()
    link = tmp_path / "o.json"
    link.symlink_to(target)
    first = cli("tune", "-g", str(graph_dir / "a_mm_bias_relu.json"), "-o", str(link), *FAST)
    assert first.exit_code == 0, first.output
    second = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(link), *FAST)
    assert second.exit_code == 0, second.output
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert ops(target) == ["matmul", "pointwise"]


# ---- item 4: the output path is checked before any tuning ----------------------------------


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    return tmp_path / "loop_a"


def _dir(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("")
    return tmp_path / "plain" / "o.json"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_dir, "is a directory"),
        (_under_a_file, "plain is not a directory"),
        (_loop, "Too many levels of symbolic links"),
    ],
)
def test_unwritable_output_is_a_usage_error_before_tuning(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    tuned: list[str],
    make: Callable[[Path], Path],
    reason: str,
) -> None:
    out = make(tmp_path)
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 2, result.output
    assert reason in said(result)
    assert "cannot read" not in result.stderr
    assert tuned == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_output_in_a_read_only_folder_is_a_usage_error_before_tuning(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    tuned: list[str],
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        result = cli("tune", "-g", str(graph_dir), "-o", str(folder / "o.json"), *FAST)
    finally:
        folder.chmod(0o700)
    assert result.exit_code == 2, result.output
    assert "Permission denied" in said(result)
    assert tuned == []


# ---- items 2, 3 and 12: a file the writer would refuse is refused before tuning -----------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"version": 2, "engine_overrides": [{"op": "matmul"}]}',
            "engine_overrides[0].engine_name: expected a name or an id",
        ),
        (
            '{"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "E", '
            '"tensors": [], "autotune_metadata": {"min_time_ms": NaN}}]}',
            "engine_overrides[0].autotune_metadata.min_time_ms: not a finite number",
        ),
        (
            '{"version": 2, "engine_overrides": {"op": "matmul"}}',
            "engine_overrides: expected a list of entries, got an object",
        ),
        # a newer dnntune's file is no legacy file (the refusal called it one: audit)
        ('{"version": 3, "engine_overrides": []}', "version 3 file, written by a newer dnntune"),
        # a hand-edited file with a typo (or one cut short): refused, not moved aside after
        ('{"version": 2, "engine_overrides": [', "it is not valid JSON (Expecting value"),
        (b"\xff\xfe{}".decode("latin-1"), "it is not valid JSON"),
    ],
)
def test_append_into_a_file_the_writer_refuses_fails_before_tuning(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    tuned: list[str],
    content: str,
    expected: str,
) -> None:
    out = tmp_path / "o.json"
    out.write_text(content)
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 1, result.output
    message = said(result)
    assert expected in message
    assert "--overwrite" in message  # the CLI's way to replace it, not the Python API's
    assert "delete_all_existing_file_content" not in message
    if "version 3" not in expected:
        assert "version 2 file" not in message
    assert "legacy" not in message
    assert "Traceback" not in result.output
    assert out.read_text() == content
    assert tuned == []

    replaced = cli("tune", "-g", str(graph_dir), "-o", str(out), "--overwrite", *FAST)
    assert replaced.exit_code == 0, replaced.output
    assert ops(out) == ["matmul", "pointwise"]


def test_the_reader_rejects_the_same_files_naming_the_path(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """Reader and writer agree: `overrides show` (the reader) refuses a NaN file by JSON path."""
    out = tmp_path / "o.json"
    out.write_text(
        '{"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "E", '
        '"tensors": [], "autotune_metadata": {"stddev_ms": Infinity}}]}'
    )
    result = cli("overrides", "show", str(out))
    assert result.exit_code == 1
    assert "engine_overrides[0].autotune_metadata.stddev_ms: not a finite number" in said(result)


# ---- item 12: messages ---------------------------------------------------------------------


def test_ctrl_c_before_any_graph_is_tuned_claims_no_file(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> dnntune.workflows.tuning.GraphTuneReport:
        raise KeyboardInterrupt

    monkeypatch.setattr(dnntune.workflows.tuning, "tune_graph", interrupted)
    out = tmp_path / "a.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 130
    assert not out.exists()
    assert "tuned so far are in" not in result.output
    assert f"interrupted before any graph was tuned; {out} was not created" in said(result)

    out.write_text('{"version": 2, "engine_overrides": []}')
    again = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert again.exit_code == 130
    assert f"{out} is unchanged" in said(again)

    # an existing --report is kept too (it was replaced by "[]"; new-user audit, session 56),
    # and none is created
    report, kept = tmp_path / "r.json", '[{"graph": "earlier", "winner": "E"}]\n'
    report.write_text(kept)
    third = cli("tune", "-g", str(graph_dir), "-o", str(out), "--report", str(report), *FAST)
    assert third.exit_code == 130, third.stderr
    assert report.read_text() == kept
    assert f"--report {report} was not written: no graph finished (the file is as it was)" in said(
        third
    )
    fresh = tmp_path / "new_report.json"
    cli("tune", "-g", str(graph_dir), "-o", str(out), "--report", str(fresh), *FAST)
    assert not fresh.exists()


def test_ctrl_c_right_after_a_graph_is_written_says_the_file_changed(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C after a graph's entry is written but before its report reaches the table: the
    file is not "unchanged" nor "not created" (it said so of a file that held the entry)."""
    real = dnntune.workflows.tuning.tune_graph

    def written_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(dnntune.workflows.tuning, "tune_graph", written_then_interrupted)
    out = tmp_path / "a.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 130
    assert ops(out) == ["matmul"]
    message = said(result)
    assert "was not created" not in message and "is unchanged" not in message
    assert f"interrupted before any graph was tuned; {out} has changed since the run began" in (
        message
    )


@pytest.mark.parametrize(
    "command", [[], ["tune"], ["run"], ["validate"], ["engines"], ["bench"], ["overrides", "merge"]]
)
def test_help_shows_no_type_after_flags(cli: Callable[..., Result], command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "--help" in result.stdout
    assert "<bool>" not in result.stdout
    if not command:
        assert "<int>" not in result.stdout  # -v is a counter: it takes no value either
        assert "[default: 0]" not in result.stdout  # nor a default worth showing


def test_help_flags_still_parse(cli: Callable[..., Result]) -> None:
    result = cli("tune", "--details=yes")
    assert result.exit_code == 2
    assert "does not take a value" in result.output


def test_cuda_only_engine_on_cpu_says_it_needs_cuda(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, tuned: list[str]
) -> None:
    out = tmp_path / "o.json"
    result = cli(
        "tune", "-g", str(graph_dir), "-o", str(out), "--engine", "CUDNN_ENGINE", "--device", "cpu"
    )
    assert result.exit_code == 2, result.output
    message = said(result)
    assert "CUDNN_ENGINE needs cuda, and this run is on cpu" in message
    assert "engineIdFilter" not in result.output
    assert tuned == []


def test_cuda_only_engine_beside_a_cpu_engine_is_left_out_with_a_warning(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    graph = str(graph_dir / "b_pw_mul.json")
    result = cli(
        "tune",
        "-g",
        graph,
        "-o",
        str(out),
        "--engine",
        "CUDNN_ENGINE,TORCH_ENGINE",
        "--device",
        "cpu",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    assert "CUDNN_ENGINE needs cuda" in said(result)
    assert ops(out) == ["pointwise"]


# ---- item 14: the lock file is one the shipped .gitignore covers ---------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_readme_command_leaves_git_status_clean(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "clone"
    repo.mkdir()
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    git("init", "-q")
    git("add", ".gitignore")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    out = repo / "overrides.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output
    assert (repo / ".overrides.json.lock").exists()  # kept: deleting it would break locking
    assert git("status", "--porcelain", "--untracked-files=all") == ""


def test_ctrl_c_after_one_graph_names_it_in_the_singular(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It read "the 1 graph(s) tuned so far are in FILE"."""
    real = dnntune.workflows.tuning.tune_graph
    calls: list[int] = []

    def second_interrupted(*args: Any, **kwargs: Any) -> dnntune.workflows.tuning.GraphTuneReport:
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dnntune.workflows.tuning, "tune_graph", second_interrupted)
    out = tmp_path / "a.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 130
    assert out.exists()
    assert f"interrupted: the graph tuned so far is in {out}" in " ".join(result.output.split())


# ---- a file tuned on another device ----------------------------------------------------------


@pytest.mark.parametrize("distributed", [False, True])
def test_appending_to_another_devices_file_is_refused_before_tuning(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    tuned: list[str],
    distributed: bool,
) -> None:
    """A match key names no device: tuning the H200's file on the CPU replaced the H200's
    entry for the same problem with the CPU's, silently (exit 0)."""
    out = tmp_path / "o.json"
    graph = str(graph_dir / "a_mm_bias_relu.json")
    assert cli("tune", "-g", graph, "-o", str(out), *FAST).exit_code == 0
    doc = json.loads(out.read_text())
    doc["engine_overrides"][0]["autotune_metadata"]["device"] = "NVIDIA H200"
    out.write_text(json.dumps(doc))
    before = out.read_text()
    tuned.clear()

    extra = ("--distributed",) if distributed else ()
    result = cli("tune", "-g", graph, "-o", str(out), *FAST, *extra)
    assert result.exit_code == 1, result.output
    message = said(result)
    assert "1 entry on NVIDIA H200" in message and "--overwrite" in message
    assert "Traceback" not in result.output
    assert out.read_text() == before
    assert tuned == []

    replaced = cli("tune", "-g", graph, "-o", str(out), *FAST, "--overwrite", *extra)
    assert replaced.exit_code == 0, replaced.output
    assert "NVIDIA H200" not in out.read_text()
    again = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST, *extra)
    assert again.exit_code == 0, again.output  # this device's own file: appended to
    assert ops(out) == ["matmul", "pointwise"]


def test_entries_that_name_no_device_do_not_stop_an_append(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    assert (
        cli("tune", "-g", str(graph_dir / "a_mm_bias_relu.json"), "-o", str(out), *FAST).exit_code
        == 0
    )
    doc = json.loads(out.read_text())
    del doc["engine_overrides"][0]["autotune_metadata"]["device"]  # hand-written, or older
    out.write_text(json.dumps(doc))
    result = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output
    assert ops(out) == ["matmul", "pointwise"]
