"""``dnntune overrides merge`` refuses to mix devices, as ``dnntune tune -o`` refuses to add to
a file of another device: a match key names no device, so a later file's entry replaced
another device's entry for the same problem, silently (audit, session 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from overrides_helpers import conv_graph, matmul_graph, write_winner
from typer.testing import CliRunner

from dnntune.cli.app import app


def _tuned_on(path: Path, device: str) -> None:
    """Stamp every entry of ``path`` as tuned on ``device`` (what tune's writer records)."""
    doc = json.loads(path.read_text())
    for entry in doc["engine_overrides"]:
        entry.setdefault("autotune_metadata", {})["device"] = device
    path.write_text(json.dumps(doc, indent=2))


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def test_merge_of_two_devices_files_is_refused_and_writes_nothing(
    runner: CliRunner, tmp_path: Path
) -> None:
    cpu, gpu, out = tmp_path / "cpu.json", tmp_path / "h200.json", tmp_path / "merged.json"
    write_winner(conv_graph(), cpu, "CPU_PICK")
    write_winner(conv_graph(), gpu, "GPU_PICK")  # the same problem, tuned on an H200
    _tuned_on(cpu, "AMD EPYC")
    _tuned_on(gpu, "NVIDIA H200")
    res = runner.invoke(app, ["overrides", "merge", str(cpu), str(gpu), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    message = " ".join(res.output.split())
    assert "different devices" in message
    assert "1 entry on AMD EPYC" in message and "1 entry on NVIDIA H200" in message
    assert "an output of its own" in message
    assert not out.exists()


def test_merge_into_an_existing_output_of_another_device_is_refused(
    runner: CliRunner, tmp_path: Path
) -> None:
    cpu, out = tmp_path / "cpu.json", tmp_path / "h200.json"
    write_winner(conv_graph(), cpu, "CPU_PICK")
    write_winner(conv_graph(), out, "GPU_PICK")
    _tuned_on(cpu, "AMD EPYC")
    _tuned_on(out, "NVIDIA H200")
    before = out.read_text()
    res = runner.invoke(app, ["overrides", "merge", str(cpu), "-o", str(out)])
    assert res.exit_code == 1, res.output
    message = " ".join(res.output.split())
    assert "(the existing output)" in message and "--overwrite" in message
    assert out.read_text() == before
    # --overwrite replaces the output instead of merging into it: nothing of two devices meets
    res = runner.invoke(app, ["overrides", "merge", str(cpu), "-o", str(out), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert [e["engine_name"] for e in json.loads(out.read_text())["engine_overrides"]] == [
        "CPU_PICK"
    ]


def test_merge_of_one_device_and_of_unstamped_entries_goes_on(
    runner: CliRunner, tmp_path: Path
) -> None:
    a, b, c, out = (tmp_path / n for n in ("a.json", "b.json", "c.json", "o.json"))
    write_winner(conv_graph(), a, "A")
    write_winner(matmul_graph(), b, "B")
    write_winner(conv_graph(n=4), c, "C")  # names no device (hand-written or a library call)
    _tuned_on(a, "NVIDIA H200")
    _tuned_on(b, "NVIDIA H200")
    res = runner.invoke(app, ["overrides", "merge", str(a), str(b), str(c), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert len(json.loads(out.read_text())["engine_overrides"]) == 3
