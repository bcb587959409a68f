"""Running a script under Triton's interpreter (``TRITON_INTERPRET=1``: the kernels on CPU
tensors, one program at a time), shared by the tests that check TRITON_ENGINE's kernels
without a GPU. The interpreter must be chosen before the kernels are imported, so the script
runs in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["run_interpreted"]

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
