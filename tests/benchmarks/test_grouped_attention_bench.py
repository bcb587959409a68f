"""benchmarks/grouped_attention.py through its real entry point: on the CPU it says that the
fused kernels are CUDA-only and times nothing; its transformers form and its inputs are what
a decode step over a ``StaticCache`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from bench_helpers import load_benchmark, run_benchmark


def test_the_cpu_run_times_nothing(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("times the cases on a GPU; this test is the CPU path")
    result = run_benchmark("grouped_attention.py", out=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "CUDA only; nothing timed" in result.stdout


@pytest.mark.parametrize("name", ["decode_1x16/4_2048", "chunk_1x16/4_2048_q64"])
def test_the_transformers_form_and_the_cases_inputs(name: str) -> None:
    module = load_benchmark("grouped_attention.py")
    q, k, v, mask = module.inputs(name, torch.float64, device="cpu")
    b, hq, hk, slots, d, rows = module.CASES[name]
    assert q.shape == (b, hq, rows, d) and k.shape == (b, hk, slots, d)
    filled = slots // 2 + rows
    assert mask[0, 0, -1].sum() == filled and mask[0, 0, 0].sum() == filled - rows + 1
    group = hq // hk
    want = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask
    )
    torch.testing.assert_close(module.transformers_form(q, k, v, mask), want)
