"""``--device cuda`` without a GPU: the CLI says ``--device cpu``, not the Python API's
``device='cpu'`` (audit, session 18; fails before its fix)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import Result

from dnntune import testing


def said(result: Result) -> str:
    return " ".join(result.stderr.replace("\u2502", " ").split())


@pytest.mark.parametrize("command", ["run", "engines", "tune"])
def test_cuda_without_a_gpu_says_the_cli_option(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = [command, "--device", "cuda"]
    if command != "engines":
        args += ["-g", str(graph_dir / "b_pw_mul.json")]
    if command == "tune":
        args += ["-o", str(tmp_path / "o.json")]
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert "use --device cpu" in said(result)
    assert "device='cpu'" not in said(result) and "create_handle" not in said(result)


@pytest.mark.parametrize("command", ["run", "engines", "tune"])
def test_an_unknown_device_names_the_devices_dnntune_runs_on(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, command: str
) -> None:
    """``--device tpu`` printed PyTorch's list of twenty device types (mps, xla, ...), which
    dnntune then refuses; the message names cpu and cuda only."""
    args = [command, "--device", "tpu"]
    if command != "engines":
        args += ["-g", str(graph_dir / "b_pw_mul.json")]
    if command == "tune":
        args += ["-o", str(tmp_path / "o.json")]
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert "bad device 'tpu': dnntune runs on 'cpu' and 'cuda'" in said(result)
    assert "mps" not in said(result) and "create_handle" not in said(result)
