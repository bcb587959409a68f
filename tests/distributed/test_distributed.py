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
    graph_dir: Path | list[Path],
    output: Path,
    shard: str | list[str] = "graphs",
    behaviour: str = "ok",
    timeout_s: float = 60,
) -> list[dict[str, Any]]:
    port = _free_port()
    dirs = graph_dir if isinstance(graph_dir, list) else [graph_dir] * world
    shards = shard if isinstance(shard, list) else [shard] * world
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
        args = [str(dirs[rank]), str(output), shards[rank], behaviour]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *args],
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


@pytest.mark.parametrize("shard", ["graphs", "candidates"])
def test_ranks_given_different_graphs_all_say_so_before_tuning(tmp_path: Path, shard: str) -> None:
    """Rounds and candidates are matched by position: ranks holding other graphs (or another
    count of them) all fail with the same error and nothing is written (audit, session 17: rank
    0 wrote another graph's winner under its own, or waited out the timeout)."""
    graphs = _graphs(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    for path in sorted(graphs.glob("*.json"))[:-1]:
        (other / path.name).write_text(path.read_text())
    g = testing.small_matmul_graph(32, 8, 8)
    g.name = "mm4"
    g.save(other / "mm4.json")  # the same name, another shape
    fewer = tmp_path / "fewer"
    fewer.mkdir()
    for path in sorted(graphs.glob("*.json"))[:3]:
        (fewer / path.name).write_text(path.read_text())
    for dirs in ([graphs, other], [graphs, fewer]):
        out = tmp_path / f"{shard}_{dirs[1].name}.json"
        ranks = _launch(2, dirs, out, shard=shard)
        assert [r["code"] for r in ranks] == [1, 1], [r["stderr"][-1500:] for r in ranks]
        assert all("the ranks were given different graphs" in r["stderr"] for r in ranks)
        assert not out.exists()


def test_ranks_given_different_shard_modes_all_say_so_before_tuning(tmp_path: Path) -> None:
    """One rank splitting graphs, the other candidates: every rank fails with the same usage
    error and nothing is written (audit, session 57: rank 0 ended with "internal error:
    KeyError: 'index'", rank 1 with a collective failure)."""
    graphs = _graphs(tmp_path)
    out = tmp_path / "out.json"
    ranks = _launch(2, graphs, out, shard=["graphs", "candidates"])
    assert [r["code"] for r in ranks] == [1, 1], [r["stderr"][-1500:] for r in ranks]
    for r in ranks:
        assert "the ranks were given different ways to split the work" in r["stderr"]
        assert "shard 'graphs' on rank 0, 'candidates' on rank 1" in r["stderr"]
    assert not out.exists()


@pytest.mark.parametrize("shard", ["graphs", "candidates"])
def test_ranks_given_different_options_all_say_so_before_tuning(tmp_path: Path, shard: str) -> None:
    """Options decide the candidates, which candidate mode deals out by position: ranks given
    other options all fail with an error naming the option (audit, session 57: they tuned
    on, each with its own options, and candidate mode split lists that differed)."""
    graphs = _graphs(tmp_path)
    out = tmp_path / "out.json"
    ranks = _launch(2, graphs, out, shard=shard, behaviour="other_iters")
    assert [r["code"] for r in ranks] == [1, 1], [r["stderr"][-1500:] for r in ranks]
    for r in ranks:
        assert "the ranks were given different tuning options" in r["stderr"]
        assert "timed_iterations is 3 on rank 0, 4 on rank 1" in r["stderr"]
    assert not out.exists()


def test_a_process_group_the_caller_started_is_the_job(tmp_path: Path) -> None:
    """tune_library joins a process group the caller already started (explicit ranks, no
    RANK/WORLD_SIZE): it ran a one-rank job per process, each tuning every graph."""
    graphs = _graphs(tmp_path)
    ranks = _launch(2, graphs, tmp_path / "pre.json", behaviour="preinit")
    assert all(r["code"] == 0 for r in ranks), [r["stderr"][-1500:] for r in ranks]
    assert [r["world"] for r in ranks] == [2, 2]
    assert len(_entries(tmp_path / "pre.json")) == 5


def test_a_launch_without_a_rendezvous_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK and WORLD_SIZE set but no rendezvous (no torchrun), or a rank out of range: a
    clear InvalidValueError (the CLI's usage error), not PyTorch's internal one."""
    from dnntune.distributed.env import init_distributed
    from dnntune.errors import InvalidValueError

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InvalidValueError, match=r"could not join the other ranks.*torchrun"):
        init_distributed("cpu", 5)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(InvalidValueError, match="RANK 2 is not below WORLD_SIZE 2"):
        init_distributed("cpu", 5)
