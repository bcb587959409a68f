"""benchmarks/models_table.py through its real entry point: runs merged into one table (each row
whole from one run, the later run winning), the targets over the merged rows, the sources
listed, and the refusals (another device, a foreign or unreadable file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "models_table.py"


def _cell(ms: float, eager_ms: float, **extra: Any) -> dict[str, Any]:
    return (
        {"status": "ok", "median_ms": ms, "speedup": eager_ms / ms, "pass": True}
        | {"max_abs_err": 0.01}
        | extra
    )


def _row(
    model: str, eager: float, graph: float, auto: float, ma: float | None = None, ma_s: float = 300
) -> Any:
    variants = {
        "eager": {"status": "ok", "median_ms": eager, "pass": True, "max_abs_err": 0.0},
        "eager_graph": _cell(graph, eager),
        "dnntune_auto": _cell(auto, eager, tune_s=15.0, choice="dnntune+cuda_graph"),
    }
    if ma is not None:
        variants["max_autotune"] = _cell(ma, eager, compile_s=ma_s)
    return {"model": model, "status": "ok", "variants": variants}


def _run_file(tmp: Path, name: str, device: str, rows: list[Any]) -> Path:
    folder = tmp / name
    folder.mkdir()
    doc = {
        "benchmark": "models",
        "versions": {"device": device, "torch": "2.11", "dnntune_commit": name},
        "models": rows,
    }
    (folder / "models.json").write_text(json.dumps(doc))
    return folder


def _table(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_runs_merge_into_one_table_with_its_targets(tmp_path: Path) -> None:
    first = _run_file(
        tmp_path,
        "a",
        "NVIDIA H200",
        [_row("resnet50", 4.0, 2.0, 1.0, ma=1.2), _row("swin_t", 8.0, 5.0, 4.0)],
    )
    # the second run timed Swin-T again, with max-autotune: its row replaces the first's whole
    second = _run_file(
        tmp_path, "b", "NVIDIA H200", [_row("swin_t", 8.0, 5.2, 2.8, ma=3.0, ma_s=100.0)]
    )
    out = tmp_path / "table"
    done = _table("--device", "H200", "--out", out, first, second / "models.json")
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "models.json").read_text())
    assert doc["benchmark"] == "models_table"
    assert [r["model"] for r in doc["models"]] == ["resnet50", "swin_t"]
    swin = doc["models"][1]
    assert swin["source"] == 1 and swin["variants"]["dnntune_auto"]["median_ms"] == 2.8
    auto = doc["summary"][0]
    assert auto["variant"] == "dnntune_auto" and auto["models"] == 2
    assert auto["geomean_over_eager_graph"] == pytest.approx((2.0 / 1.0 * 5.2 / 2.8) ** 0.5)
    assert auto["at_least_best_of_eager_and_graph"] == 2
    # resnet50: faster, in 15 s <= 0.1x of 300; swin_t faster, but 15 s > 0.1x of 100
    assert auto["beat_max_autotune_at_tenth_compile_time"] == ["resnet50"]
    assert auto["models_with_max_autotune"] == 2
    text = (out / "models.md").read_text()
    assert "| resnet50 |" in text and "| swin_t |" in text
    assert "geomean over eager_graph" in text
    assert "[0]" in text and "rows: resnet50" in text and "rows: swin_t" in text
    assert text in done.stdout


@pytest.mark.parametrize(
    ("devices", "flags", "message"),
    [
        (("NVIDIA H200", "NVIDIA H100 80GB HBM3"), (), "runs on different devices"),
        (("NVIDIA H100 80GB HBM3",), ("--device", "H200"), "not on a H200"),
    ],
    ids=["mixed", "not_the_device_asked"],
)
def test_runs_of_other_devices_are_refused(
    tmp_path: Path, devices: tuple[str, ...], flags: tuple[str, ...], message: str
) -> None:
    runs = [
        _run_file(tmp_path, f"r{i}", d, [_row(f"m{i}", 2.0, 1.0, 0.5)])
        for i, d in enumerate(devices)
    ]
    done = _table(*flags, "--out", tmp_path / "t", *runs)
    assert done.returncode == 2
    assert message in done.stderr and str(runs[-1]) in done.stderr
    assert not (tmp_path / "t" / "models.json").exists()


def test_mixed_devices_when_asked_for(tmp_path: Path) -> None:
    a = _run_file(tmp_path, "a", "NVIDIA H200", [_row("m0", 2.0, 1.0, 0.5)])
    b = _run_file(tmp_path, "b", "NVIDIA H100 80GB HBM3", [_row("m1", 2.0, 1.0, 0.5)])
    done = _table("--allow-mixed-devices", "--out", tmp_path / "t", a, b)
    assert done.returncode == 0, done.stderr
    assert "NVIDIA H100 80GB HBM3" in (tmp_path / "t" / "models.md").read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a readable JSON file"),
        (json.dumps({"benchmark": "generate"}), "not benchmarks/models.py's output"),
        (json.dumps({"benchmark": "models", "models": 3}), "has no list of models"),
    ],
    ids=["corrupt", "foreign", "no_models"],
)
def test_an_input_that_is_not_a_models_run_is_refused(
    tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "models.json"
    bad.write_text(content)
    done = _table("--out", tmp_path / "t", bad)
    assert done.returncode == 2
    assert message in done.stderr and str(bad) in done.stderr


def test_a_missing_run_says_what_to_give(tmp_path: Path) -> None:
    done = _table("--out", tmp_path / "t", tmp_path / "nowhere")
    assert done.returncode == 2
    assert "no such file (give a models.json or its folder)" in done.stderr
