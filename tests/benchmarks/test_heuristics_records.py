"""benchmarks/heuristics_records.py rebuilds the committed H200 records, and the shipped
HeuristicMode.B model is the one trained from them."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import run_benchmark

from dnntune.backend.learned import DEFAULT_MODEL, load_model
from dnntune.learning import merge, read_records_file
from dnntune.learning.training import points_of

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "benchmarks" / "heuristics" / "h200_records.json"


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


def test_the_shipped_model_holds_every_usable_committed_problem() -> None:
    model = load_model(DEFAULT_MODEL)
    usable = points_of(merge(read_records_file(COMMITTED)))
    assert model.point_count == len(usable) == model.training["problems"]
    assert model.training["sources"] == ["benchmarks/heuristics/h200_records.json"]
    evaluation = model.evaluation
    assert evaluation is not None and evaluation["problems"] == len(usable)
    # shipped because it is no worse than the static order on held-out problems
    assert evaluation["B"]["regret_geomean"] <= evaluation["A"]["regret_geomean"]
    assert evaluation["B"]["top1"] >= evaluation["A"]["top1"]


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
