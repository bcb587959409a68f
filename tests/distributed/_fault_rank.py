"""One rank of a distributed run, started by hand as torchrun would (RANK, WORLD_SIZE, ...),
with a fault injected on one rank: ``T_FAULT=kind:rank``. Run by test_rank_faults.py.

``_fault_rank.py cli ARGS...``: ``dnntune ARGS`` (the real CLI entry point).
``_fault_rank.py lib GRAPH_DIR OUTPUT SHARD``: ``tune_library`` on the fake engines; prints
this rank's reports as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

RANK = int(os.environ.get("RANK", "0"))


def _inject(kind: str) -> None:
    from dnntune.distributed import candidates, library, writer

    if kind == "die_in_tune":  # this rank disappears while tuning its second graph
        calls = {"n": 0}
        tune_graph = library.tune_graph

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] > 1:
                os._exit(9)
            return tune_graph(*args, **kwargs)

        library.tune_graph = dying
    elif kind == "die_in_confirm":  # candidate mode: rank 0 disappears in its confirmation

        def gone(*args: Any, **kwargs: Any) -> Any:
            os._exit(9)

        candidates._confirm_merged = gone
    elif kind == "write_fails":  # rank 0 cannot write the second graph's entry
        from dnntune.errors import InvalidValueError

        calls = {"n": 0}
        write = writer.write_autotune_winner

        def failing(*args: Any, **kwargs: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise InvalidValueError("the file became a version 1 file")
            write(*args, **kwargs)

        writer.write_autotune_winner = failing
    elif kind == "engine_fails":  # TORCH_ENGINE's plans fail to build on this rank only
        from dnntune.providers import torch_eager

        def broken(self: Any, graph: Any, knob_settings: Any, handle: Any) -> Any:
            raise RuntimeError("TORCH_ENGINE broken on this rank")

        torch_eager.TorchEngine.compile = broken  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown fault {kind!r}")


def _lib(graph_dir: str, output: str, shard: str) -> None:
    from dnntune import AutotuneStrategy, testing
    from dnntune.distributed import tune_library
    from dnntune.frontend import Graph
    from dnntune.workflows.tuning import TuneOptions

    sources: list[tuple[str, Graph | Exception]] = [
        (str(p), Graph.load(p)) for p in sorted(Path(graph_dir).glob("*.json"))
    ]
    options = TuneOptions(
        warmup_iterations=1, timed_iterations=3, strategy=AutotuneStrategy.FIXED_AVERAGE
    )
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.2}):
        result = tune_library(
            sources,
            output,
            options,
            overwrite=True,
            shard="candidates" if shard == "candidates" else "graphs",
            device="cpu",
            timeout_s=60,
        )
    reports = [r.to_dict() for r in result.reports]
    print(json.dumps({"rank": RANK, "reports": reports}, default=str), flush=True)


def main() -> None:
    fault = os.environ.get("T_FAULT", "")
    if fault:
        kind, rank = fault.split(":")
        if int(rank) == RANK:
            _inject(kind)
    if sys.argv[1] == "lib":
        from dnntune.distributed.env import exit_rank

        _lib(*sys.argv[2:5])
        exit_rank(0)  # as the CLI ends a rank (exit_rank says why)
    from dnntune.cli.app import main as cli_main

    sys.argv = ["dnntune", *sys.argv[2:]]
    cli_main()


if __name__ == "__main__":
    main()
