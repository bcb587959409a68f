"""One rank of a distributed tuning test (run as a subprocess by test_distributed.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    graph_dir, output, shard, behaviour = sys.argv[1:5]
    from dnntune import AutotuneStrategy, testing
    from dnntune.distributed import DistributedTuneError, tune_library
    from dnntune.frontend import Graph
    from dnntune.workflows.tuning import TuneOptions

    rank = int(os.environ.get("RANK", "0"))
    if behaviour == "die" and rank == 1:
        os._exit(3)  # a rank that disappears before the first collective
    if behaviour == "preinit":  # the caller's own process group, no torchrun variables
        import torch.distributed as dist

        world = int(os.environ["WORLD_SIZE"])
        address = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            os.environ.pop(name)
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    sources: list[tuple[str, Graph | Exception]] = []
    for path in sorted(Path(graph_dir).glob("*.json")):
        try:
            sources.append((str(path), Graph.load(path)))
        except Exception as exc:
            sources.append((str(path), exc))
    options = TuneOptions(
        warmup_iterations=1,
        # a rank given another option than its peers ("other_iters": rank 1 times 4 runs)
        timed_iterations=4 if behaviour == "other_iters" and rank == 1 else 3,
        strategy=AutotuneStrategy.FIXED_AVERAGE,
    )
    timings = {"FAKE_ENGINE_A": 1.0, "FAKE_ENGINE_B": 3.0, "FAKE_ENGINE_C": 0.7}
    with testing.fake_engines(
        names=["FAKE_ENGINE_A", "FAKE_ENGINE_B", "FAKE_ENGINE_C"], timings=timings
    ):
        try:
            report = tune_library(
                sources,
                output,
                options,
                overwrite=True,
                shard=shard,
                device="cpu",
                timeout_s=float(os.environ.get("T_S", "60")),
            )
        except DistributedTuneError as exc:
            print(json.dumps({"rank": rank, "error": str(exc)}), flush=True)
            sys.exit(1)
    print(
        json.dumps(
            {
                "rank": rank,
                "graphs": [r.graph_name for r in report.reports],
                "winners": [r.winner_plan for r in report.reports],
                "errors": [r.error for r in report.reports],
                "decisions": report.decisions,
                "agree": report.ranks_agree,
                "world": report.world_size,
            }
        ),
        flush=True,
    )
    if behaviour == "preinit":
        # The group is the caller's, so tearing it down is the caller's job too; a gloo group
        # left to interpreter exit can abort there ("terminate called without an active
        # exception", seen once in CI), which PyTorch documents as the caller's duty.
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
