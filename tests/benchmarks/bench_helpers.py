"""Running a script of ``benchmarks/`` through its real entry point, as a user would."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def load_benchmark(script: str) -> ModuleType:
    """``benchmarks/<script>`` imported as a module (its folder on ``sys.path`` while it loads,
    as when run), to test its functions without running its ``main``."""
    path = REPO / "benchmarks" / script
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
