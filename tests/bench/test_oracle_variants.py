"""``bench --oracle`` tunes each engine over plans, not over searches or duplicates (issue 25):
knob values that run the engine's search or write its records (``Knob.search_values``,
``Knob.persistent_values``) are never candidates; in the standard mode neither is a value that
builds the default's plan (``Knob.default_plan_values``), while ``--oracle-mode exhaustive``
keeps it (primed, it searches another space). The row's candidate counts are what was swept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app

FAST = ["--warmup", "1", "--iters", "3"]


def _bench(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], testing.FakeEngines]:
    g = testing.small_matmul_graph()
    path, out = tmp_path / "mm.json", tmp_path / "r.json"
    g.save(path)
    args = ["bench", "-g", str(path), *FAST, "--oracle", "--validate", "reference", *extra]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]) as fakes:
        engine = fakes[testing.FAKE_ENGINE_A]
        # fake.variant 0..3 (default 0): 1 a plan of its own, 2 the default's plan again,
        # 3 writes the engine's records
        engine._knobs = [
            dataclasses.replace(
                k,
                default_plan_values=frozenset({2}),
                persistent_values=frozenset({3}),
            )
            if k.knob_id == "fake.variant"
            else k
            for k in engine._knobs
        ]
        result = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["graphs"][0]["results"]
    assert row["oracle_error"] is None, row
    return row, fakes


def _swept(fakes: testing.FakeEngines) -> int:
    return fakes.counters.compiles[testing.FAKE_ENGINE_A]


@pytest.mark.parametrize(
    ("mode", "candidates"),
    [
        ("standard", 2),  # the default (the row's plan) and variant 1
        ("exhaustive", 3),  # also variant 2: primed, not the default's plan
    ],
)
def test_the_oracle_sweeps_no_record_writer_and_no_duplicate_of_the_default(
    tmp_path: Path, mode: str, candidates: int
) -> None:
    row, fakes = _bench(tmp_path, "--oracle-mode", mode)
    info = row["oracle"]
    assert info["mode"] == mode
    assert info["candidates_total"] == candidates and info["candidates_failed"] == 0
    if mode == "standard":
        # one build per candidate: the row built the default, the tune the variant
        assert _swept(fakes) == candidates
