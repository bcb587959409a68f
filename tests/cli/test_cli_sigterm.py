"""SIGTERM (``kill PID``, ``timeout``, a batch scheduler ending the job) stops a command as Ctrl-C
does: what it finished is kept and said, and the exit code is 143. Python's default ended the
process on the spot (exit -15): ``tune`` printed no table and no word of what the file holds, and
``bench`` lost every graph measured since its last periodic write of the results file (audit).

Each test runs the real console-script entry point in a subprocess, with the fake engines, and
holds the command inside one graph (a marker file says when) to send the signal there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import matmul_bias_relu, pointwise_mul, subprocess_env

#: ``python DRIVER MARKER MODULE:ATTR HOLD_AT dnntune-args...``: the fake engines registered,
#: ``MODULE:ATTR`` (a function of one graph) held forever on its ``HOLD_AT``-th call
_DRIVER = r"""
import importlib, pathlib, sys, time
from dnntune import testing

marker, target, hold_at = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
module_name, _, attr = target.partition(":")
owner = importlib.import_module(module_name)
*path, attr = attr.split(".")
for name in path:  # Class.method
    owner = getattr(owner, name)
real = getattr(owner, attr)
calls = []

def held(*args, **kwargs):
    calls.append(1)
    if len(calls) == hold_at:
        marker.write_text("held")
        while True:
            time.sleep(0.05)
    return real(*args, **kwargs)

setattr(owner, attr, held)
names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.2}):
    import _dnntune_cli

    sys.argv = ["dnntune", *sys.argv[4:]]
    _dnntune_cli.main()
"""


def _terminate_when_held(
    tmp_path: Path, target: str, hold_at: int, *args: str
) -> subprocess.CompletedProcess[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    marker = tmp_path / "held"
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(marker), target, str(hold_at), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate(timeout=10)
                pytest.fail(f"the command never reached the held graph:\n{out}\n{err}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def three_graphs(tmp_path: Path) -> Path:
    d = tmp_path / "graphs"
    d.mkdir()
    matmul_bias_relu().save(d / "a_mm_bias_relu.json")
    pointwise_mul().save(d / "b_pw_mul.json")
    pointwise_mul("pw_mul_2", rows=8).save(d / "c_pw_mul.json")
    return d


def test_sigterm_during_tune_shows_what_the_file_holds(graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "overrides.json"
    done = _terminate_when_held(
        tmp_path, "dnntune.workflows.tuning:tune_graph", 2, "tune", "-g", str(graph_dir),
        "-o", str(out),
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 143, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "mm_bias_relu" in done.stdout  # the table of the graph finished
    assert f"interrupted: the graph tuned so far is in {out}" in said
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["op"] == "matmul"


def test_sigterm_during_bench_keeps_every_graph_finished(
    three_graphs: Path, tmp_path: Path
) -> None:
    """The second graph ends within the results file's refresh period after the first, so only
    the stop itself writes it."""
    out = tmp_path / "results.json"
    done = _terminate_when_held(
        tmp_path, "dnntune.bench.runner:BenchRunner.run_graph", 3, "bench", "-g",
        str(three_graphs), "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 143, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "interrupted: the results file holds the graphs finished so far" in done.stderr
    results = json.loads(out.read_text())
    assert results["run"]["complete"] is False
    assert [g["graph_name"] for g in results["graphs"]] == ["mm_bias_relu", "pw_mul"]
