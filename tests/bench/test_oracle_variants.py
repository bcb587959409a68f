"""``bench --oracle`` tunes each engine over plans, not over searches or duplicates (issue 25):
knob values that run the engine's search or write its records (``Knob.search_values``,
``Knob.persistent_values``) are never candidates; in the standard mode neither is a value that
builds the default's plan (``Knob.default_plan_values``), while ``--oracle-mode exhaustive``
keeps it (primed, it searches another space). The row's candidate counts are what was swept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import oracle_row

from dnntune import testing


def _variants_of_their_own(fakes: testing.FakeEngines) -> None:
    # fake.variant 0..3 (default 0): 1 a plan of its own, 2 the default's plan again,
    # 3 writes the engine's records
    engine = fakes[testing.FAKE_ENGINE_A]
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


def _bench(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], testing.FakeEngines]:
    row, fakes = oracle_row(tmp_path, *extra, setup=_variants_of_their_own)
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
