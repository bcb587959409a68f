"""benchmarks/heuristics_records.py rebuilds the committed H200 and H100 records, and the
shipped HeuristicMode.B model is the one trained from them."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import load_benchmark, run_benchmark

from dnntune.backend.learned import DEFAULT_MODEL, load_model
from dnntune.learning import Record, merge, read_records_file
from dnntune.learning.training import points_of

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "benchmarks" / "heuristics" / "h200_records.json"
COMMITTED_H100 = REPO / "benchmarks" / "heuristics" / "h100_records.json"


def test_the_script_rebuilds_the_committed_records(tmp_path: Path) -> None:
    out = tmp_path / "records.json"
    result = run_benchmark("heuristics_records.py", "-o", str(out), out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "98 records" in result.stdout
    rebuilt, committed = json.loads(out.read_text()), json.loads(COMMITTED.read_text())
    # decision quality of sessions 7, 8 and 11: 14 independently re-timed graphs each
    dq = [k for k in rebuilt["sources"] if "decision_quality" in k]
    assert len(dq) == 3 and all(rebuilt["sources"][k] == 14 for k in dq)
    assert rebuilt["records"] == committed["records"]

    # the session 24 suite (46 graphs on the current engines) replaces the Nov 29 records of
    # the problems it measured: none of those is left beside it; session 25's run of the three
    # pooling graphs (after Triton's global-pool default changed) replaces session 24's
    def problems(session: str) -> set[str]:
        return {
            json.dumps(r["problem"], sort_keys=True)
            for r in rebuilt["records"]
            if session in r["source"]
        }

    s24, s25 = problems("h200_2026-12-03_s24"), problems("h200_2026-12-03_s25")
    assert len(s24) == 43 and len(s25) == 3 and not s24 & s25
    assert all('"pool' in p or "resample" in p for p in s25)
    current = s24 | s25
    stale = [
        r["source"]
        for r in rebuilt["records"]
        if "2026-11-29" in r["source"] and json.dumps(r["problem"], sort_keys=True) in current
    ]
    assert stale == []
    assert rebuilt["left_out"] == committed["left_out"]


def test_the_script_rebuilds_the_committed_h100_records(tmp_path: Path) -> None:
    """--device h100: session 57's three suite runs, one record per graph per run."""
    out = tmp_path / "records.json"
    result = run_benchmark(
        "heuristics_records.py", "--device", "h100", "-o", str(out), out=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "138 records" in result.stdout
    rebuilt, committed = json.loads(out.read_text()), json.loads(COMMITTED_H100.read_text())
    assert rebuilt["records"] == committed["records"]
    assert rebuilt["device"] == "NVIDIA H100 80GB HBM3"
    assert list(rebuilt["sources"].values()) == [46, 46, 46]
    assert {r["device_class"] for r in rebuilt["records"]} == {"nvidia-h100-80gb-hbm3"}
    per_problem: dict[str, int] = {}
    for r in rebuilt["records"]:
        key = json.dumps(r["problem"], sort_keys=True)
        per_problem[key] = per_problem.get(key, 0) + 1
    assert len(per_problem) == 46 and set(per_problem.values()) == {3}


def test_full_dq_is_refused_for_the_h100(tmp_path: Path) -> None:
    result = run_benchmark("heuristics_records.py", "--device", "h100", "--full-dq", out=tmp_path)
    assert result.returncode == 2 and "--full-dq" in result.stderr


def test_the_shipped_model_holds_every_usable_committed_problem() -> None:
    model = load_model(DEFAULT_MODEL)
    records = read_records_file(COMMITTED) + read_records_file(COMMITTED_H100)
    usable = points_of(merge(records))
    assert model.point_count == len(usable) == model.training["problems"]
    assert model.training["sources"] == [
        "benchmarks/heuristics/h100_records.json",
        "benchmarks/heuristics/h200_records.json",
    ]
    evaluation = model.evaluation
    assert evaluation is not None and evaluation["problems"] == len(usable)
    # shipped because it is no worse than the static order on held-out problems, on each
    # device it holds
    for scores in (evaluation, *evaluation["by_device"].values()):
        assert scores["B"]["regret_geomean"] <= scores["A"]["regret_geomean"]
        assert scores["B"]["top1"] >= scores["A"]["top1"]
    assert set(evaluation["by_device"]) == {"nvidia-h200", "nvidia-h100-80gb-hbm3"}


def test_retest_agreement_counts_each_problems_winners_per_record(tmp_path: Path) -> None:
    """benchmarks/heuristics/retest_agreement.py on the committed records: every re-timed
    problem's winner per record, and how often two records agree (the noise ceiling of top-1
    that docs/heuristics.md cites: the GEMMs' 22 of 48 pairs)."""
    result = run_benchmark("heuristics/retest_agreement.py", str(COMMITTED), out=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "matmul   winner agreement between two records: 22/48 = 45.8%" in lines
    assert "conv     winner agreement between two records: 36/36 = 100.0%" in lines
    assert lines[-1].startswith("all      winner agreement between two records: 76/102")


def test_retest_agreement_on_the_h100_records(tmp_path: Path) -> None:
    """Three runs of one session on the H100: the figures docs/heuristics.md cites."""
    result = run_benchmark("heuristics/retest_agreement.py", str(COMMITTED_H100), out=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "matmul   winner agreement between two records: 74/78 = 94.9%" in lines
    assert lines[-1] == "all      winner agreement between two records: 272/276 = 98.6%"


def test_device_evaluation_noise_is_the_median_engine_spread_over_repeats() -> None:
    """benchmarks/heuristics/device_evaluation.py's "within noise" tolerance: the median of
    max/min - 1 of an engine's time over the records of one problem on one device."""
    module = load_benchmark("heuristics/device_evaluation.py")
    records = read_records_file(COMMITTED_H100)
    noise = module.run_to_run_noise(records)
    assert noise is not None and 0 < noise < 0.05
    first = records[0]
    twice = [
        Record(first.problem, first.device_class, {"X": 1.1, "Y": 2.0}),
        Record(first.problem, first.device_class, {"X": 1.0, "Y": 2.0}),
    ]
    assert abs(module.run_to_run_noise(twice) - 0.05) < 1e-9  # spreads 0.1 and 0.0
    assert module.run_to_run_noise(records[:1]) is None
