"""``run`` with an override file tuned on another device says so in one line: its entries name
that device (``autotune_metadata.device``), none applied here, and what to do. Every row said
``chosen by static``, exit 0, and nothing told the user that the file was an H200's (audit,
session 27). Nothing new is said when the file did choose a plan, or was tuned here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

import dnntune as dt
from dnntune import testing
from dnntune.cli import _config_devices

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")
H200 = "NVIDIA H200"
HERE = str(dt.create_handle("cpu").device_signature()["name"])


@pytest.fixture
def tuned(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> Path:
    """An override file with one entry, for the matmul graph, tuned here (FAKE_ENGINE_C)."""
    out = tmp_path / "overrides.json"
    result = cli("tune", "-g", str(graph_dir / "a_mm_bias_relu.json"), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output
    return out


def _set_devices(path: Path, *devices: str) -> None:
    """The file's one entry, once per device named, each saying it was tuned there."""
    doc = json.loads(path.read_text())
    (entry,) = doc["engine_overrides"]
    doc["engine_overrides"] = [
        {**entry, "autotune_metadata": {**entry["autotune_metadata"], "device": d}} for d in devices
    ]
    path.write_text(json.dumps(doc))


def _run(cli: Callable[..., Result], graph: Path, config: Path) -> Result:
    result = cli(
        "run", "-g", str(graph), "--device", "cpu", env={"DNNTUNE_HEUR_CONFIG_PATH": str(config)}
    )
    assert result.exit_code == 0, result.output
    assert "WARNING" not in result.stderr and "Traceback" not in result.output
    return result


def _notes(result: Result) -> list[str]:
    return [line for line in result.stdout.splitlines() if " holds " in line]


def test_a_file_of_another_device_is_named_when_none_of_it_applied(
    cli: Callable[..., Result], graph_dir: Path, tuned: Path
) -> None:
    _set_devices(tuned, H200)
    result = _run(cli, graph_dir / "b_pw_mul.json", tuned)
    assert "static" in result.stdout
    (note,) = _notes(result)  # one line, on stdout: a result, not a warning
    assert note == (
        f"{tuned} holds 1 entry, none for this device ({HERE}, cpu): all were tuned on {H200}; "
        "none applied here: tune on this device for entries of its own (dnntune tune -g "
        f"<graphs> -o {_config_devices.device_file_name(tuned, HERE)})"
    )


def test_a_file_tuned_on_several_devices_names_each_and_this_ones_share(
    cli: Callable[..., Result], graph_dir: Path, tuned: Path
) -> None:
    _set_devices(tuned, H200, HERE, H200, "NVIDIA A100")
    (note,) = _notes(_run(cli, graph_dir / "b_pw_mul.json", tuned))
    assert f"holds 4 entries, only 1 for this device ({HERE}, cpu)" in note
    assert f"the other 3 tuned on {H200} (2), NVIDIA A100 (1); none applied here" in note


def test_the_device_it_was_tuned_on_is_named_as_an_option_when_this_machine_has_it(
    cli: Callable[..., Result],
    graph_dir: Path,
    tuned: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set_devices(tuned, H200)
    monkeypatch.setattr(_config_devices, "_local_devices", lambda: {HERE: "cpu", H200: "cuda"})
    (note,) = _notes(_run(cli, graph_dir / "b_pw_mul.json", tuned))
    assert "none applied here: run with --device cuda to use them, or tune on this device" in note


@pytest.mark.parametrize(
    ("devices", "graph"),
    [
        ((HERE,), "b_pw_mul.json"),  # tuned here: matching nothing is no news
        ((), "b_pw_mul.json"),  # names no device (hand-written): for any device
        ((H200,), "a_mm_bias_relu.json"),  # another device's entry that did choose the plan
    ],
    ids=["this-device", "no-device", "applied"],
)
def test_nothing_is_said_when_the_file_is_this_devices_or_chose_a_plan(
    cli: Callable[..., Result],
    graph_dir: Path,
    tuned: Path,
    devices: tuple[str, ...],
    graph: str,
) -> None:
    doc: dict[str, Any] = json.loads(tuned.read_text())
    if devices:
        _set_devices(tuned, *devices)
    else:
        del doc["engine_overrides"][0]["autotune_metadata"]["device"]
        tuned.write_text(json.dumps(doc))
    result = _run(cli, graph_dir / graph, tuned)
    assert _notes(result) == []
    assert ("config" in result.stdout) == (graph == "a_mm_bias_relu.json")


def test_no_file_no_note(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path
) -> None:
    result = cli(
        "run", "-g", str(graph_dir), "--device", "cpu", env={"DNNTUNE_HEUR_CONFIG_PATH": None}
    )
    assert result.exit_code == 0, result.output
    assert _notes(result) == []
