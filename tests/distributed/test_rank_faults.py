"""Two ranks on CPU (gloo), started by hand as torchrun would, one of them broken on purpose
(``_fault_rank.py``): who says what, and which exit code each rank ends with."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dnntune import testing

RANK_SCRIPT = Path(__file__).with_name("_fault_rank.py")
FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")
pytestmark = pytest.mark.slow


@dataclass
class Rank:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        lines = [ln for ln in self.out.splitlines() if ln.startswith("{")]
        assert lines, self.err[-3000:]
        return dict(json.loads(lines[-1]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ranks(*args: str, fault: str = "", cwd: Path | None = None) -> list[Rank]:
    """Two ranks of ``_fault_rank.py ARGS`` with ``T_FAULT=fault``."""
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD"))}
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            COLUMNS="200",
            T_FAULT=fault,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(RANK_SCRIPT), *args],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ranks = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        ranks.append(Rank(p.returncode, out, err))
    return ranks


def _graphs(tmp_path: Path, n: int = 4) -> Path:
    folder = tmp_path / "graphs"
    folder.mkdir()
    for i in range(n):
        g = testing.small_matmul_graph(4 + 2 * i, 8, 8)
        g.name = f"mm{i}"
        g.save(folder / f"mm{i}.json")
    return folder


def _tune(graphs: Path, out: Path, *args: str) -> tuple[str, ...]:
    return ("cli", "tune", "-g", str(graphs), "-o", str(out), *FAST, "--distributed", *args)


def _entries(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["engine_overrides"])


def test_rank_1_says_why_when_rank_0_dies_in_graph_mode(tmp_path: Path) -> None:
    """Rank 0 is gone: rank 1 says which rank it is and which round's collective failed."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    args = _tune(_graphs(tmp_path), out, "--engine", "TORCH_ENGINE", "--dist-timeout-s", "20")
    rank0, rank1 = _ranks(*args, fault="die_in_tune:0")
    assert rank0.code == 9
    assert rank1.code == 1, rank1.err[-3000:]
    assert "error: rank 1: collective after graphs" in rank1.err
    assert "internal error" not in rank1.err and rank1.out == ""


def test_rank_1_names_the_graph_when_rank_0_dies_deciding_it(tmp_path: Path) -> None:
    """Candidate mode: the broadcast of rank 0's decision fails like any collective."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    args = _tune(
        _graphs(tmp_path, 2),
        out,
        "--engine",
        "TORCH_ENGINE",
        "--shard",
        "candidates",
        "--dist-timeout-s",
        "20",
    )
    rank0, rank1 = _ranks(*args, fault="die_in_confirm:0")
    assert rank0.code == 9
    assert rank1.code == 1, rank1.err[-3000:]
    assert "error: rank 1: collective after the decision on graph 0" in rank1.err
    assert "mm0.json" in rank1.err and "internal error" not in rank1.err


def test_a_rank_that_cannot_build_the_decided_plan_fails_that_graph(tmp_path: Path) -> None:
    """Candidate mode, TORCH_ENGINE broken on rank 1: each graph fails on rank 1 (named),
    not a disagreement between ranks; rank 1 prints nothing."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    args = _tune(_graphs(tmp_path, 2), out, "--engine", "TORCH_ENGINE", "--shard", "candidates")
    rank0, rank1 = _ranks(*args, fault="engine_fails:1")
    assert (rank0.code, rank1.code) == (1, 1), rank0.err[-3000:]
    assert rank0.err.count("could not build the decided plan TORCH_ENGINE on rank 1") == 2
    assert "TORCH_ENGINE broken on this rank" in rank0.err
    assert "different" not in rank0.err and "bug" not in rank0.err
    assert "ranks built the same winner" not in rank0.out
    assert rank1.out == "" and rank1.err == ""  # no WARNING lines for an expected failure
    assert not out.exists()


def test_every_rank_returns_rank_0s_write_outcome(tmp_path: Path) -> None:
    """Graph mode: rank 0's failed write is every rank's report (and exit code); the entries
    of graphs tuned on rank 1 name their device; every rank's reports carry the cost."""
    out = tmp_path / "o.json"
    ranks = _ranks("lib", str(_graphs(tmp_path)), str(out), "graphs", fault="write_fails:0")
    assert [r.code for r in ranks] == [0, 0], [r.err[-3000:] for r in ranks]
    reports = [r.json()["reports"] for r in ranks]
    assert reports[0] == reports[1]
    errors = [r["error"] for r in reports[0]]
    assert errors[1].startswith("writing ") and "version 1" in errors[1]
    assert [e == "" for e in errors] == [True, False, True, True]
    assert [bool(r["written_to"]) for r in reports[0]] == [True, False, True, True]
    assert all(r["cost"].get("compile_ms") is not None for r in reports[0])
    entries = _entries(out)
    assert len(entries) == 3
    devices = {e["autotune_metadata"].get("device") for e in entries}
    assert len(devices) == 1 and None not in devices  # rank 1's graphs too (mm3)


def test_candidate_mode_ranks_return_the_same_reports(tmp_path: Path) -> None:
    """Candidate mode: the heuristic pick, its time, the winner's re-timing and the write
    outcome are the same on every rank."""
    out = tmp_path / "o.json"
    ranks = _ranks("lib", str(_graphs(tmp_path, 2)), str(out), "candidates")
    assert [r.code for r in ranks] == [0, 0], [r.err[-3000:] for r in ranks]
    reports = [r.json()["reports"] for r in ranks]
    assert reports[0] == reports[1]
    for r in reports[0]:
        assert r["ok"] and r["written_to"] == str(out)
        assert r["heuristic_plan"] == testing.FAKE_ENGINE_A
        assert r["winner"]["engine_name"] == testing.FAKE_ENGINE_C
        assert r["heuristic_time_ms"] and r["winner_retimed_ms"] and r["speedup"] > 1.0
        assert r["cost"]["confirm_ms"] > 0.0
    assert all(e["autotune_metadata"].get("device") for e in _entries(out))


def test_only_rank_0_says_a_usage_error(tmp_path: Path) -> None:
    """``-o`` a folder: exit code 2 on every rank, the message once (rank 0)."""
    (tmp_path / "folder").mkdir()
    args = _tune(_graphs(tmp_path, 1), tmp_path / "folder")
    rank0, rank1 = _ranks(*args)
    assert (rank0.code, rank1.code) == (2, 2)
    assert "is a directory" in rank0.err
    assert rank1.err == "" and rank1.out == ""


def test_engines_that_cannot_run_here_are_checked_on_every_rank(tmp_path: Path) -> None:
    """``--engine`` an engine the device cannot run: a usage error (2) as in a one-process
    run; a list with one that can: the other is left out with a warning from rank 0 alone."""
    pytest.importorskip("dnntune.providers.torch_eager")
    graphs = _graphs(tmp_path, 1)
    rank0, rank1 = _ranks(*_tune(graphs, tmp_path / "a.json", "--engine", "CUDNN_ENGINE"))
    assert (rank0.code, rank1.code) == (2, 2), rank0.err[-3000:]
    assert "CUDNN_ENGINE needs cuda" in rank0.err and rank1.err == ""
    args = _tune(graphs, tmp_path / "b.json", "--engine", "CUDNN_ENGINE,TORCH_ENGINE")
    rank0, rank1 = _ranks(*args)
    assert (rank0.code, rank1.code) == (0, 0), rank0.err[-3000:]
    assert rank0.err.count("warning: --engine: CUDNN_ENGINE needs cuda") == 1
    assert rank1.err == ""
