"""Running a script of ``benchmarks/`` through its real entry point, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(
    script: str, *args: str, out: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<script> <args>`` with ``OUT=out``; its output captured, unchecked."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        env={**os.environ, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
