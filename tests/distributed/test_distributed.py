"""Distributed tuning on CPU with gloo: 2 and 3 processes against a single process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dnntune import testing

WORKER = Path(__file__).with_name("_worker.py")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _graphs(tmp_path: Path) -> Path:
    folder = tmp_path / "graphs"
    folder.mkdir()
    for i, (m, n, k) in enumerate([(8, 8, 16), (4, 16, 8), (16, 4, 4), (2, 8, 8), (8, 2, 16)]):
        g = testing.small_matmul_graph(m, n, k)
        g.name = f"mm{i}"
        g.save(folder / f"mm{i}.json")
    return folder


def _launch(
    world: int,
    graph_dir: Path,
    output: Path,
    shard: str = "graphs",
    behaviour: str = "ok",
    timeout_s: float = 60,
) -> list[dict[str, Any]]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD"))}
        if world > 1:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                T_S=str(timeout_s),
            )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(graph_dir), str(output), shard, behaviour],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        outs.append(
            {"code": p.returncode, "stderr": stderr, **(json.loads(lines[-1]) if lines else {})}
        )
    return outs


def _entries(path: Path) -> list[tuple[Any, ...]]:
    doc = json.loads(path.read_text())
    return [
        (e["op"], e["engine_name"], json.dumps(e["tensors"], sort_keys=True))
        for e in doc["engine_overrides"]
    ]


def test_graph_sharded_matches_single_process(tmp_path: Path) -> None:
    graphs = _graphs(tmp_path)
    single = _launch(1, graphs, tmp_path / "single.json")
    assert single[0]["code"] == 0, single[0]["stderr"]
    for world in (2, 3):
        out = tmp_path / f"w{world}.json"
        ranks = _launch(world, graphs, out)
        assert all(r["code"] == 0 for r in ranks), [r["stderr"][-2000:] for r in ranks]
        assert _entries(out) == _entries(tmp_path / "single.json")
        assert all(r["winners"] == single[0]["winners"] for r in ranks)
    assert set(single[0]["winners"]) == {"FAKE_ENGINE_C"}


def test_candidate_sharded_ranks_agree(tmp_path: Path) -> None:
    graphs = _graphs(tmp_path)
    single = _launch(1, graphs, tmp_path / "single.json", shard="candidates")
    assert single[0]["code"] == 0, single[0]["stderr"]
    ranks = _launch(3, graphs, tmp_path / "c3.json", shard="candidates")
    assert all(r["code"] == 0 for r in ranks), [r["stderr"][-2000:] for r in ranks]
    assert all(r["agree"] for r in ranks)
    decisions = [r["decisions"] for r in ranks]
    assert decisions[0] == decisions[1] == decisions[2]
    assert all(len(set(names)) == 1 for names in decisions[0])
    assert _entries(tmp_path / "c3.json") == _entries(tmp_path / "single.json")


def test_bad_graph_on_one_rank_is_reported_not_hung(tmp_path: Path) -> None:
    graphs = _graphs(tmp_path)
    (graphs / "mm1.json").write_text("{not json")  # rank 1's first graph fails to load
    ranks = _launch(2, graphs, tmp_path / "out.json")
    assert all(r["code"] == 0 for r in ranks), [r["stderr"][-2000:] for r in ranks]
    errors = ranks[0]["errors"]
    assert errors[1] and not errors[0] and not errors[2]
    assert len(_entries(tmp_path / "out.json")) == 4


def test_dead_rank_makes_others_fail_not_hang(tmp_path: Path) -> None:
    graphs = _graphs(tmp_path)
    ranks = _launch(2, graphs, tmp_path / "out.json", behaviour="die", timeout_s=10)
    assert ranks[1]["code"] == 3
    assert ranks[0]["code"] != 0
    text = ranks[0].get("error", "") + ranks[0]["stderr"]
    assert "rank" in text
