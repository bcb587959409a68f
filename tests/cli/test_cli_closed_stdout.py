"""A reader that stops reading (``dnntune tune -g graphs -o F | head -1``): the command finishes
its work and every file it writes, prints no traceback, and exits 141 (128 + SIGPIPE, what the
shell says of git or ls killed by SIGPIPE), unless it failed on its own (that code is kept).
rich exited 1 at the first line that did not go through, silently, so ``tune --report`` and
``run --json`` (written after their table) were lost, and the code said a graph had failed.

Each test runs the real entry point in a subprocess whose stdout is a pipe with no reader left
(closed before the process starts: every write fails, no timing involved).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from cli_helpers import PYTHON, bad_uid_document, subprocess_env

#: ``python DRIVER dnntune-args...``: the console script's entry point with the fake engines
_DRIVER = r"""
import sys
from dnntune import testing

names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.2}):
    import _dnntune_cli

    sys.argv = ["dnntune", *sys.argv[1:]]
    _dnntune_cli.main()
"""


def _closed_stdout(
    args: Sequence[str], cwd: Path, *, stderr_too: bool = False, buffered: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with stdout (and with ``stderr_too`` stderr) a pipe whose reader is gone."""
    env = subprocess_env()
    if buffered:  # as a terminal user has it: stdout buffered when it is a pipe
        env.pop("PYTHONUNBUFFERED", None)
    else:  # every write reaches the pipe at once (CI logs often set it)
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            args,
            stdout=write_end,
            stderr=write_end if stderr_too else subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            timeout=300,
        )
    finally:
        os.close(write_end)
    return done


def _with_fakes(tmp_path: Path, *args: str, **kwargs: bool) -> subprocess.CompletedProcess[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    return _closed_stdout([sys.executable, str(driver), *args], tmp_path, **kwargs)


def _quiet(done: subprocess.CompletedProcess[str]) -> None:
    said = done.stderr or ""
    assert "Traceback" not in said and "internal error" not in said, said
    assert "Broken pipe" not in said and "BrokenPipeError" not in said, said


@pytest.mark.parametrize("buffered", [False, True], ids=["unbuffered", "buffered"])
def test_tune_finishes_and_writes_its_files(
    graph_dir: Path, tmp_path: Path, buffered: bool
) -> None:
    out, report = tmp_path / "overrides.json", tmp_path / "report.json"
    done = _with_fakes(
        tmp_path, "tune", "-g", str(graph_dir), "-o", str(out), "--report", str(report),
        buffered=buffered,
    )  # fmt: skip
    _quiet(done)
    assert done.returncode == 141, done.stderr
    entries = json.loads(out.read_text())["engine_overrides"]
    assert sorted(e["op"] for e in entries) == ["matmul", "pointwise"]
    assert [r["graph"] for r in json.loads(report.read_text())] == ["mm_bias_relu", "pw_mul"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_tune_with_stderr_closed_too(graph_dir: Path, tmp_path: Path) -> None:
    """``2>&1 | head -1``: the progress lines and the table both hit the closed pipe."""
    out = tmp_path / "overrides.json"
    done = _with_fakes(tmp_path, "tune", "-g", str(graph_dir), "-o", str(out), stderr_too=True)
    assert done.returncode == 141
    assert len(json.loads(out.read_text())["engine_overrides"]) == 2


def test_run_writes_its_json(graph_dir: Path, tmp_path: Path) -> None:
    results = tmp_path / "run.json"
    done = _with_fakes(tmp_path, "run", "-g", str(graph_dir), "--json", str(results))
    _quiet(done)
    assert done.returncode == 141, done.stderr
    assert [r["graph"] for r in json.loads(results.read_text())] == ["mm_bias_relu", "pw_mul"]


def test_bench_writes_complete_results(graph_dir: Path, tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    done = _with_fakes(tmp_path, "bench", "-g", str(graph_dir), "-o", str(results))
    _quiet(done)
    assert done.returncode == 141, done.stderr
    doc = json.loads(results.read_text())
    assert doc["run"]["complete"] is True
    assert [g["graph_name"] for g in doc["graphs"]] == ["mm_bias_relu", "pw_mul"]


def test_a_failure_of_the_command_keeps_its_code(graph_dir: Path, tmp_path: Path) -> None:
    """A graph that failed says more than the closed pipe: exit 1, its error on stderr."""
    bad = tmp_path / "bad_graph.json"
    bad.write_text(json.dumps(bad_uid_document()))
    done = _closed_stdout(
        [PYTHON, "-m", "dnntune", "validate", "-g", str(graph_dir), str(bad)], tmp_path
    )
    _quiet(done)
    assert done.returncode == 1
    assert "tensor uid 777 not defined" in done.stderr


@pytest.mark.parametrize(
    "args",
    [["--version"], ["-h"], ["tune", "-h"], ["validate", "-g", "{graphs}"]],
    ids=["version", "help", "command-help", "validate"],
)
def test_every_command_exits_141_quietly(graph_dir: Path, tmp_path: Path, args: list[str]) -> None:
    """The console script itself, on output that goes through typer (its help) as well."""
    script = str(Path(PYTHON).parent / "dnntune")
    done = _closed_stdout([script, *(a.format(graphs=graph_dir) for a in args)], tmp_path)
    _quiet(done)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(
    "args",
    [["--bogus"], ["validate", "--bogus"], ["validate", "-g", "no_such_graph.json"]],
    ids=["root-option", "command-option", "bad-value"],
)
def test_a_usage_error_keeps_its_code_when_its_message_cannot_be_written(
    tmp_path: Path, args: list[str]
) -> None:
    """``python -m dnntune --bogus 2>&1 | head -0``: rich's handler of the closed stream exited
    1 in place of the usage error's 2, which read as 141."""
    done = _closed_stdout([PYTHON, "-m", "dnntune", *args], tmp_path, stderr_too=True)
    assert done.returncode == 2
    readable = _closed_stdout([PYTHON, "-m", "dnntune", *args], tmp_path)  # stderr readable
    assert readable.returncode == 2
    assert "Usage: dnntune" in readable.stderr and "Traceback" not in readable.stderr
