"""Ctrl-C while the CLI starts (``import torch`` and the rest take seconds) ends it with one line
on stderr and exit code 130, as a command interrupted mid-run does: it printed a page of
KeyboardInterrupt traceback, since the console script's entry point lay inside the ``dnntune``
package and nothing guarded its imports (audit, session 27). ``python -m dnntune`` still did,
while Python imported the package itself, before its ``__main__`` runs: ``dnntune._startup``
guards that import now."""

from __future__ import annotations

import importlib.abc
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from cli_helpers import PYTHON, subprocess_env

import dnntune.cli.app as app_module

#: the two ways to start the CLI: the console script, and ``python -m dnntune`` (Python imports
#: the ``dnntune`` package, torch and all, before ``dnntune/__main__.py`` runs)
_ENTRIES = {
    "console-script": [str(Path(PYTHON).parent / "dnntune")],
    "python-m": [PYTHON, "-m", "dnntune"],
}


@pytest.mark.parametrize("entry", list(_ENTRIES))
def test_ctrl_c_while_the_cli_imports_torch(graph_dir: Path, entry: str) -> None:
    """A real SIGINT, sent once the process is seen importing torch (the import-time log of
    ``PYTHONPROFILEIMPORTTIME`` says so): no traceback, one line, 130."""
    env = {**subprocess_env(), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.Popen(
        [*_ENTRIES[entry], "validate", "-g", str(graph_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # a test runner's worker may ignore SIGINT, and the child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("import time:") and "torch" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert any("torch" in line for line in seen), "the script never imported torch"
    said = [line for line in [*seen, *rest.splitlines(True)] if not line.startswith("import time:")]
    assert said == ["interrupted\n"], "".join(said)
    assert proc.returncode == 130
    assert out == ""


#: a stand-in for torch, first on the path: its import signals the process itself, so the signal
#: lands while Python imports the ``dnntune`` package, every time (no timing involved)
_SIGNALLING_TORCH = """
import os, signal, time
os.kill(os.getpid(), signal.{name})
time.sleep(60)  # the handler runs at once; this only waits for it
raise SystemExit("the signal was not answered")
"""


def _signal_while_importing_dnntune(
    tmp_path: Path, signum: signal.Signals, *args: str
) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "signalling_torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(_SIGNALLING_TORCH.format(name=signum.name))
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [PYTHON, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        # a test runner's worker may ignore SIGINT, and the child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"]
)
def test_a_signal_while_python_dash_m_imports_the_package(
    graph_dir: Path, tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    """``python -m dnntune`` imports the package before its ``__main__`` (and the guard there)
    runs: Ctrl-C in that import printed a page of KeyboardInterrupt traceback and ended the
    process by the signal. Now one line and 130, and SIGTERM as in a command: 143."""
    done = _signal_while_importing_dnntune(
        tmp_path, signum, "-m", "dnntune", "validate", "-g", str(graph_dir)
    )
    assert done.stderr == "interrupted\n"
    assert done.returncode == code
    assert done.stdout == ""


def test_a_program_that_imports_dnntune_keeps_pythons_handlers(tmp_path: Path) -> None:
    """The guard is the CLI's alone: ``import dnntune`` in a user's program (``python -c``, or
    ``python -m`` of another module) is interrupted as Python interrupts any import."""
    done = _signal_while_importing_dnntune(tmp_path, signal.SIGINT, "-c", "import dnntune")
    assert "KeyboardInterrupt" in done.stderr
    assert done.returncode == -signal.SIGINT


def _exit_code(entry: Callable[[], object]) -> object:
    """The code ``entry`` exits with; a KeyboardInterrupt that escapes it fails the test (and
    only the test: pytest would take it for the user's Ctrl-C and stop the session)."""
    try:
        entry()
    except SystemExit as done:
        return done.code
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped the entry point (a traceback for the user)")
    pytest.fail("the entry point returned without exiting")


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C while ``name`` is imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname == self.name:
            raise KeyboardInterrupt


def test_ctrl_c_while_python_dash_m_imports_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m dnntune`` (Python has imported the package): the CLI's own imports (typer,
    rich, the commands, the providers) are guarded too."""
    monkeypatch.delitem(sys.modules, "dnntune.cli.app")
    monkeypatch.delitem(sys.modules, "dnntune.__main__", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport("dnntune.cli.app"), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["dnntune", "--version"])
    assert (
        _exit_code(lambda: runpy.run_module("dnntune", run_name="__main__", alter_sys=True)) == 130
    )
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_outside_a_command_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the imports, before a command's own guard (typer building its commands)."""

    def interrupted(**kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(app_module, "app", interrupted)
    assert _exit_code(app_module.main) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
