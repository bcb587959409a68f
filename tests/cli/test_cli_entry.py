"""The real entry points: the console script, ``python -m dnntune``, global options, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_helpers import PYTHON, subprocess_env

import dnntune as dt


def test_version_option(cli) -> None:
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dnntune {dt.__version__}"


def test_help_lists_every_command(cli) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    for command in ("validate", "engines", "run", "tune"):
        assert command in result.stdout


def test_no_arguments_shows_help_as_usage_error(cli) -> None:
    result = cli()
    assert result.exit_code == 2
    assert "Usage" in result.output


def test_unknown_command_is_usage_error(cli) -> None:
    result = cli("frobnicate")
    assert result.exit_code == 2


def test_bad_option_is_usage_error(cli, graph_dir: Path) -> None:
    result = cli("validate", "--no-such-option", "-g", str(graph_dir))
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_verbose_and_quiet_are_accepted(cli, graph_dir: Path) -> None:
    assert cli("-v", "validate", "-g", str(graph_dir)).exit_code == 0
    assert cli("-vv", "validate", "-g", str(graph_dir)).exit_code == 0
    assert cli("-q", "validate", "-g", str(graph_dir)).exit_code == 0


def test_console_script_version() -> None:
    script = Path(PYTHON).parent / "dnntune"
    assert script.exists(), "the dnntune console script is not installed in this environment"
    proc = subprocess.run(
        [str(script), "--version"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"dnntune {dt.__version__}"


def test_python_dash_m_validate(graph_dir: Path, bad_graph: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "dnntune", "validate", "-g", str(graph_dir)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "2 valid, 0 invalid" in ok.stdout

    bad = subprocess.run(
        [sys.executable, "-m", "dnntune", "validate", "-g", str(bad_graph)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1
    assert "nodes[1].inputs.in_1_tensor_uid" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_broken_sub_app_costs_only_its_command(monkeypatch) -> None:
    import importlib

    import typer

    import dnntune.cli.app as app_module

    real_import = importlib.import_module

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name == "dnntune.cli.no_such_cmd":
            raise ModuleNotFoundError(name)
        if name == "dnntune.cli.broken_cmd":
            raise RuntimeError("boom at import")
        return real_import(name, *args, **kwargs)

    before = len(app_module.app.registered_groups)
    monkeypatch.setattr(importlib, "import_module", fake_import)
    app_module._mount_optional("missing", "dnntune.cli.no_such_cmd")
    app_module._mount_optional("broken", "dnntune.cli.broken_cmd")
    assert len(app_module.app.registered_groups) == before
    assert isinstance(app_module.app, typer.Typer)


def test_sub_apps_are_mounted(cli) -> None:
    result = cli("--help")
    assert "overrides" in result.stdout
    assert "bench" in result.stdout
