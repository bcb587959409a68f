"""``bench --oracle`` builds each plan once: the tune takes the OOTB row's plan for the engine's
default-knob spec instead of compiling it again (on the H200 a TORCH_COMPILE_ENGINE row paid a
second Inductor compile for it), and the warm baseline, the confirmation's default and the row
are one plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_helpers import oracle_row

from dnntune import testing
from dnntune.bench import oracle


def _bench(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], testing.FakeEngines]:
    return oracle_row(tmp_path, *extra)


def test_the_oracle_compiles_each_candidate_once_and_the_rows_plan_not_again(
    tmp_path: Path,
) -> None:
    row, fakes = _bench(tmp_path)
    info = row["oracle"]
    assert row["verdict"] == "passed" and row["oracle_error"] is None, row
    assert info["candidates_total"] >= 4 and info["candidates_failed"] == 0
    # one build per plan spec: the row built the default-knob plan, the tune the variants
    assert fakes.counters.compiles[testing.FAKE_ENGINE_A] == info["candidates_total"]
    assert info["correctness"]["match"] is True
    assert row["oracle_delta"] is not None


def test_under_exhaustive_the_rows_plan_is_the_unprimed_default(tmp_path: Path) -> None:
    row, fakes = _bench(tmp_path, "--oracle-mode", "exhaustive")
    info = row["oracle"]
    assert row["oracle_error"] is None and info["mode"] == "exhaustive", row
    primed = fakes.counters.priming_compiles[testing.FAKE_ENGINE_A]
    assert primed == info["candidates_total"]  # every spec primed, then built from its search
    # the row's build, each priming plan, each primed build; the unprimed default is the row's
    assert fakes.counters.compiles[testing.FAKE_ENGINE_A] == 1 + 2 * primed


def test_the_tunes_default_is_the_rows_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[Any, ...]] = []
    real = oracle.run_autotune

    def spy(graph: Any, plans: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(plans.prebuilt)
        return real(graph, plans, *args, **kwargs)

    monkeypatch.setattr(oracle, "run_autotune", spy)
    row, _ = _bench(tmp_path)
    (prebuilt,) = handed  # one row, one tune, handed the row's one plan
    assert [p.name for p in prebuilt] == [row["plan_name"]] == [testing.FAKE_ENGINE_A]
