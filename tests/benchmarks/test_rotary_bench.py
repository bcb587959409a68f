"""benchmarks/rotary.py through its real entry point: on the CPU it says that the kernel is
CUDA-only and times nothing; its eager form is transformers' (rotate-half) form."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bench_helpers import load_benchmark, run_benchmark


def test_the_cpu_run_times_nothing(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("times the cases on a GPU; this test is the CPU path")
    result = run_benchmark("rotary.py", out=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "CUDA only; nothing timed" in result.stdout


def test_the_eager_form_is_the_rotate_half_form() -> None:
    module = load_benchmark("rotary.py")
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8)
    cos, sin = torch.rand(1, 5, 8), torch.rand(1, 5, 8)
    got = module.eager_form()(q, k, cos, sin)
    for x, y in zip((q, k), got, strict=True):
        x1, x2 = x[..., :4], x[..., 4:]
        c, s = cos[:, None], sin[:, None]
        want = torch.cat((x1 * c[..., :4] - x2 * s[..., :4], x2 * c[..., 4:] + x1 * s[..., 4:]), -1)
        torch.testing.assert_close(y, want)
