"""``dnntune bench --oracle --budget-s``: the budget is the graph's tuning, shared by its rows as
they go; the baseline and tuned plan a row times after its tuning are measurement and do not
spend it (they did: on a slow CPU, 100 launches of each left the next row 0.04 s of a 2 s
budget whose first row had tuned for 0.2 s; audit, session 27)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import BENCH_FAST, bench_graph_file, invoke

from dnntune import testing
from dnntune.bench.runner import BenchRunner
from dnntune.bench.timing import PlanTiming

#: real seconds each baseline timing takes here (the bench's budget is on the wall clock)
SLOW_BASELINE_S = 1.5


def test_timing_after_a_rows_tuning_leaves_its_share_to_the_next_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = BenchRunner._measure

    def slow_baseline(self: BenchRunner, label: str, run: Callable[[], None]) -> PlanTiming:
        if label == "baseline":  # the warm baseline the oracle times after tuning a row
            time.sleep(SLOW_BASELINE_S)
        return original(self, label, run)

    monkeypatch.setattr(BenchRunner, "_measure", slow_baseline)
    path, out = bench_graph_file(tmp_path), tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        result = invoke(
            ["bench", "-g", str(path), *BENCH_FAST, "--oracle", "--budget-s", "2", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    rows = {r["engine"]["name"]: r for r in json.loads(out.read_text())["graphs"][0]["results"]}
    first = rows[testing.FAKE_ENGINE_A]["oracle"]
    second = rows[testing.FAKE_ENGINE_C]["oracle"]
    assert first["cost"]["time_budget_s"] <= 1.0  # its half of 2 s
    spent_s = first["tuning_wall_ms"] / 1e3
    assert spent_s < 0.5  # the fake engines tune in moments
    # what the first row's tuning left, not less the 1.5 s baseline timed after it
    # (before: about 2 - 1.5 = 0.5 s)
    assert second["cost"]["time_budget_s"] > 2.0 - spent_s - 0.25


def test_under_a_budget_the_rows_variants_are_added_without_building_their_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's variants' workspace estimates build their plans (cuDNN: every engine config of a
    norm, a runtime compile each); under ``--budget-s`` they are added without builds
    (``backend.estimates``) and built when the row's search reaches them, as before without."""
    from dnntune.autotune.plan_specs import PlanSpecCollection
    from dnntune.backend.estimates import builds_allowed

    seen: list[bool] = []
    original = PlanSpecCollection.add_engine_variants

    def spy(self: PlanSpecCollection, variants: Any) -> None:
        seen.append(builds_allowed())
        original(self, variants)

    monkeypatch.setattr(PlanSpecCollection, "add_engine_variants", spy)
    path = bench_graph_file(tmp_path)
    for budget, allowed in ((["--budget-s", "5"], False), ([], True)):
        seen.clear()
        out = tmp_path / f"r{len(budget)}.json"
        with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
            result = invoke(
                ["bench", "-g", str(path), *BENCH_FAST, "--oracle", *budget, "-o", str(out)]
            )
        assert result.exit_code == 0, result.output
        assert seen and all(s is allowed for s in seen), (budget, seen)
    assert builds_allowed()
