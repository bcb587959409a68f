"""Beyond the RFC: many processes appending to one override file lose no entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dnntune.overrides.format import load_file

PROCESSES = 16
ENTRIES_PER_PROCESS = 3

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import dnntune as dt
    from dnntune.rfc import AutotuneResult, AutotuneStorageConfig
    from dnntune.overrides.writer import write_autotune_winner

    index, per_process, target, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    while not Path(go).exists():  # start together: maximum contention
        time.sleep(0.005)
    for j in range(per_process):
        g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT)
        a = g.tensor(name="A", dims=[index + 1, 8 + j])
        b = g.tensor(name="B", dims=[8 + j, 4])
        g.matmul(a, b).set_output(True)
        g.validate()
        result = AutotuneResult(engine_id=index, engine_name=f"E{index}_{j}", rank=0,
                                succeeded=True, min_time_ms=0.1, avg_time_ms=0.1)
        write_autotune_winner(g, [result], AutotuneStorageConfig(target), None)
    """
)


@pytest.mark.slow
def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    target = tmp_path / "shared.json"
    go = tmp_path / "go"
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(ENTRIES_PER_PROCESS), str(target), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(PROCESSES)
    ]
    time.sleep(0.5)
    go.write_text("")
    failures = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        if p.returncode != 0:
            failures.append(err.decode(errors="replace"))
    assert not failures, failures[0]
    doc = json.loads(target.read_text())  # valid JSON
    names = sorted(e["engine_name"] for e in doc["engine_overrides"])
    expected = sorted(f"E{i}_{j}" for i in range(PROCESSES) for j in range(ENTRIES_PER_PROCESS))
    assert names == expected
    assert load_file(target).named_tensor_ids
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
