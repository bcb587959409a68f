"""Running a script under Triton's interpreter (``TRITON_INTERPRET=1``: the kernels on CPU
tensors, one program at a time), shared by the tests that check TRITON_ENGINE's kernels
without a GPU. The interpreter must be chosen before the kernels are imported, so the script
runs in a fresh process."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["interpreter_problem", "run_interpreted"]

REPO = Path(__file__).resolve().parents[2]


def run_interpreted(args: Sequence[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """``python *args`` in the interpreter, this checkout's ``src`` first on ``PYTHONPATH`` and
    the caller's after it (triton may come from there); its output captured as text."""
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


_PROBE = r"""
import torch
import triton
import triton.language as tl

@triton.jit
def _probe(Y, N, B: tl.constexpr):
    acc = 0.0
    for _ in range(0, N, B):
        acc += 1.0
    tl.store(Y, acc)

_probe[(1,)](torch.zeros(1), 5, B=2)
"""


@functools.cache
def interpreter_problem() -> str | None:
    """None where the interpreter runs a loop with a runtime bound (the kernels' key, K and
    row loops), else why not: triton 3.9's interpreter under numpy 2.4 cannot (numpy refuses
    its one-element arrays as loop bounds), and a test then skips with that reason."""
    done = run_interpreted(["-c", _PROBE], timeout=120)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"this Triton interpreter cannot run a loop with a runtime bound: {last}"
