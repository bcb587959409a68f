"""``bench --oracle``: the tuned variant must beat the engine's default plan beyond noise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app

FAST = ["--warmup", "1", "--iters", "3"]


def _bench(tmp_path: Path, timings: dict[str, object] | None = None) -> dict[str, object]:
    g = testing.small_matmul_graph()
    path, out = tmp_path / "mm.json", tmp_path / "r.json"
    g.save(path)
    fakes = testing.FakeTimings()
    for knobs, ms in (timings or {}).items():
        fakes.set(testing.FAKE_ENGINE_A, ms, {"fake.variant": int(knobs)})  # type: ignore[arg-type]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A], timings=fakes):
        result = CliRunner().invoke(
            app, ["bench", "-g", str(path), *FAST, "--oracle", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["graphs"][0]["results"]
    return row  # type: ignore[no-any-return]


def test_a_faster_variant_is_confirmed(tmp_path: Path) -> None:
    row = _bench(tmp_path)  # fake.variant=1 runs 0.7 ms against the default's 1.0 ms
    oracle = row["oracle"]
    assert oracle["decision"] == "confirmed" and oracle["kept_default"] is False
    assert "fake.variant" in oracle["plan_name"]
    assert row["oracle_delta"]["same_plan"] is False
    assert row["oracle_delta"]["speedup"] == pytest.approx(1.0 / 0.7, rel=0.05)


def test_a_variant_that_is_only_lucky_keeps_the_default(tmp_path: Path) -> None:
    # variant 1 reads 0.5 ms in the sweep (verification, warmup, the device clock's one-launch
    # calibration, 3 samples), then 2.0 ms
    row = _bench(tmp_path, {"1": [0.5] * 6 + [2.0] * 10_000})
    oracle = row["oracle"]
    assert oracle["kept_default"] is True and oracle["decision"] == "kept_default_slower"
    assert oracle["plan_name"] == testing.FAKE_ENGINE_A  # the OOTB row's plan
    # one plan timed twice: its speedup is 1.0, whatever the two timings' noise
    assert row["oracle_delta"]["same_plan"] is True and row["oracle_delta"]["speedup"] == 1.0


def test_the_oracle_ranks_on_the_clock_it_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oracle_delta compares kernel (device) times, so the tune ranks and confirms on the device
    clock: on the call-latency clock the H200 run confirmed torch.compile modes whose kernels
    were 2-3x slower than the default's."""
    from dnntune.bench import oracle

    seen: list[str] = []
    real = oracle.run_autotune

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[-1].ranking_metric)
        return real(*args, **kwargs)

    monkeypatch.setattr(oracle, "run_autotune", spy)
    _bench(tmp_path)
    assert seen == ["device"]


def test_a_variant_the_engine_cannot_run_here_is_not_counted(tmp_path: Path) -> None:
    """On the CPU, TORCH_ENGINE's only knob variant (a CUDA graph) is not applicable: the
    oracle counts it as `tune` does, neither failed nor as a search (audit, session 17)."""

    examples = Path(__file__).resolve().parents[2] / "examples" / "graphs"
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-g",
            str(examples / "llama_rmsnorm.json"),
            "--device",
            "cpu",
            "--engine",
            "TORCH_ENGINE",
            "--oracle",
            *FAST,
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["graphs"][0]["results"]
    oracle = row["oracle"]
    assert oracle["candidates_total"] == 1 and oracle["candidates_failed"] == 0
    assert oracle["tuning_available"] is False
