"""TORCH_ENGINE: every operation against the reference, its knobs, its plans."""

from __future__ import annotations

import pytest
from torch_cases import CASES, Case, run_and_compare

import dnntune as dt

ENGINE = "TORCH_ENGINE"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_op_matches_reference_cpu_float(case: Case, cpu_handle: dt.Handle) -> None:
    run_and_compare(case.build(dt.DataType.FLOAT), cpu_handle, ENGINE)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_op_matches_reference_cpu_half(case: Case, cpu_handle: dt.Handle) -> None:
    run_and_compare(case.build(dt.DataType.HALF), cpu_handle, ENGINE)
