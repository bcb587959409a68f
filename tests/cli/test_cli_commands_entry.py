"""Every command through ``python -m dnntune`` in a subprocess: one success and one usage error.

typer's CliRunner calls the app in-process, past ``__main__``, the console script's startup
guards, its signal handlers and the mapping of outcomes to exit codes (``app.main``); a command
whose only tests go through the runner could exit with another code, or print a traceback, when
a user types it. Each case here is a real process, checked for its exit code and a line of its
output. The two processes of a command run side by side (each spends seconds importing torch).

``validate`` and the root options have their own subprocess tests (test_cli_entry.py,
test_cli_closed_stdout.py).
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import PYTHON, pointwise_mul, subprocess_env
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app

EPYC = "AMD EPYC 7763"
#: the fewest timed runs each command takes, on the one engine every CPU has
QUICK_RUN = ["--device", "cpu", "--warmup", "0", "--iters", "1"]
QUICK_TUNE = ["--device", "cpu", "--engine", "TORCH_ENGINE", "--warmup", "0"]
QUICK_TUNE += ["--strategy", "fixed_average", "--iters", "1"]
PREDICT = ["heuristics", "predict", "{dir}/model.json", "-g", "{dir}/g.json"]
QUICK_BENCH = ["--engine", "TORCH_ENGINE", "--warmup", "0", "--iters", "3"]


@dataclass(frozen=True)
class Case:
    """``dnntune ARGS`` (``{dir}`` is the test's folder) and what it must exit with and say."""

    args: tuple[str, ...]
    code: int
    says: str  # on stdout for a success, on stderr for an error

    def expand(self, folder: Path) -> list[str]:
        return [a.format(dir=folder) for a in self.args]


def ok(*args: str, says: str) -> Case:
    return Case(args, 0, says)


def usage(*args: str, says: str) -> Case:
    return Case(args, 2, says)


def _dnntune(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "dnntune", *args],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=cwd,
        timeout=240,
        check=False,
    )


def _files(folder: Path) -> None:
    """What the commands read: a graph, an override file, a bench results file, a model."""
    pointwise_mul().save(folder / "g.json")
    entry = {
        "op": "matmul",
        "engine_name": "TORCH_ENGINE",
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [1, 8, 16], "stride": [128, 16, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [1, 16, 8], "stride": [128, 8, 1]},
        ],
        "autotune_metadata": {"device": EPYC},
    }
    doc = {"version": 2, "engine_overrides": [entry]}
    (folder / "ov.json").write_text(json.dumps(doc))
    runner = CliRunner()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        args = ["bench", "-g", str(folder / "g.json"), "--warmup", "1", "--iters", "3"]
        done = runner.invoke(app, [*args, "-o", str(folder / "res.json")])
    assert done.exit_code == 0, done.output
    model = ["heuristics", "train", str(folder / "ov.json"), "-o", str(folder / "model.json")]
    done = runner.invoke(app, model)
    assert done.exit_code == 0, done.output


#: command -> (a success, a usage error), each run as ``python -m dnntune ARGS``
COMMANDS: dict[str, tuple[Case, Case]] = {
    "run": (
        ok("run", "-g", "{dir}/g.json", *QUICK_RUN, says="1 of 1 graph ran and matched"),
        usage("run", "-g", "{dir}/g.json", "--iters", "0", says="Invalid value for '--iters'"),
    ),
    "tune": (
        ok("tune", "-g", "{dir}/g.json", "-o", "{dir}/t.json", *QUICK_TUNE, says="tuned 1 of 1"),
        usage("tune", "-g", "{dir}/g.json", "--strategy", "x", says="for '--strategy'"),
    ),
    "bench": (
        ok("bench", "-g", "{dir}/g.json", "-o", "{dir}/b.json", *QUICK_BENCH, says="Summary: 1"),
        usage("bench", "-g", "{dir}/g.json", "--cache-mode", "hot", says="must be warm or cold"),
    ),
    "engines": (
        ok("engines", "--device", "cpu", says="TORCH_ENGINE"),
        usage("engines", "--device", "tpu", says="bad device 'tpu'"),
    ),
    "bench compare": (
        ok("bench", "compare", "{dir}/res.json", "{dir}/res.json", says="1 within noise"),
        usage("bench", "compare", "{dir}/res.json", says="Missing argument 'B'"),
    ),
    "overrides show": (
        ok("overrides", "show", "{dir}/ov.json", says="version 2, 1 entr"),
        usage("overrides", "show", "{dir}/none.json", says="does not exist"),
    ),
    "overrides merge": (
        ok("overrides", "merge", "{dir}/ov.json", "-o", "{dir}/m.json", says="wrote 1 entr"),
        usage("overrides", "merge", "{dir}/ov.json", says="Missing option '-o' / '--output'"),
    ),
    "overrides generalize": (
        ok("overrides", "generalize", "{dir}/ov.json", "-o", "{dir}/w.json", says="wrote 1 entr"),
        usage("overrides", "generalize", "{dir}/ov.json", "--wildcard", "x", says="--wildcard"),
    ),
    "heuristics train": (
        ok("heuristics", "train", "{dir}/ov.json", "-o", "{dir}/m2.json", says="1 record(s)"),
        usage("heuristics", "train", "{dir}/ov.json", "--k", "0", says="Invalid value for '--k'"),
    ),
    "heuristics show": (
        ok("heuristics", "show", "{dir}/model.json", says="trained on 1 record(s)"),
        usage("heuristics", "show", says="Missing argument 'MODEL'"),
    ),
    "heuristics predict": (
        ok(*PREDICT, "--device-name", EPYC, says="static order (A): TORCH_ENGINE"),
        usage(*PREDICT, says="Missing option '--device-name'"),
    ),
    "cache show": (
        ok("cache", "show", says="cache folder:"),
        usage("cache", "show", "--bogus", says="No such option: --bogus"),
    ),
    "cache clear": (
        ok("cache", "clear", says="nothing to clear"),
        usage("cache", "clear", "--other-version", says="Possible options: --other-versions"),
    ),
}

#: the commands that load every provider (triton's import) or time a real engine: seconds more
SLOW = {"run", "tune", "bench", "engines"}


def _check(case: Case, done: subprocess.CompletedProcess[str]) -> None:
    said = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == case.code, said
    assert "Traceback" not in done.stderr, said
    stream = done.stdout if case.code == 0 else done.stderr
    assert case.says in " ".join(stream.split()), said


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    _files(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in COMMANDS],
)
def test_a_command_through_python_dash_m(command: str, folder: Path) -> None:
    cases = COMMANDS[command]

    def run(case: Case) -> subprocess.CompletedProcess[str]:
        return _dnntune(case.expand(folder), folder)

    with ThreadPoolExecutor(len(cases)) as pool:
        outcomes = list(pool.map(run, cases))
    for case, done in zip(cases, outcomes, strict=True):
        _check(case, done)
