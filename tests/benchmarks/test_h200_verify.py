"""benchmarks/h200_verify.sh: valid bash, and every script and option it uses exists (it runs
only on the GPU machine, where a typo costs a device call)."""

from __future__ import annotations

import re
import subprocess
import sys

from bench_helpers import REPO

SCRIPT = REPO / "benchmarks" / "h200_verify.sh"


def test_the_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_script_and_option_it_passes_exists() -> None:
    text = SCRIPT.read_text()
    # "python3 benchmarks/X.py [args up to the redirect]", joined over continuation lines
    joined = re.sub(r"\\\n\s*", " ", text)
    calls = re.findall(r"python3 (benchmarks/\w+\.py)([^>\n]*)", joined)
    assert {c[0] for c in calls} >= {
        "benchmarks/conformance.py",
        "benchmarks/decision_quality.py",
        "benchmarks/models.py",
        "benchmarks/execute_overhead.py",
    }
    for script, _ in calls:
        assert (REPO / script).is_file(), script
    # each script's --help at once: each process imports PyTorch (about 2 s)
    running = {
        script: subprocess.Popen(
            [sys.executable, str(REPO / script), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for script in dict.fromkeys(c[0] for c in calls)
    }
    help_of: dict[str, str] = {}
    for script, proc in running.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        help_of[script] = out
    for script, args in calls:
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", args):
            assert option in help_of[script], f"{script} has no {option}"
    # the bench command's options, through dnntune's own help
    bench = subprocess.run(
        [sys.executable, "-m", "dnntune", "bench", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"},
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    for option in ("--oracle", "--validate", "--device", "-o"):
        assert option in bench.stdout
