"""A writer process for the store concurrency tests (one of many appending at once)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    kind, root, index = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:  # rewrite the same keys again and again, compacting on every append
        from dnntune.overrides import store

        store.COMPACT_MIN_BYTES = 0
        rounds, keys = int(sys.argv[4]), 3
    else:
        rounds, keys = 1, 5
    for n in [n for _ in range(rounds) for n in range(keys)]:
        tag = index * 100 + n
        if kind == "find_db":
            from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, FindDbRecord

            key = FindDbKey(f"graph{tag}", "dev", 91900, "1.16.0", "a", 0)
            assert FindDb(root).record(key, FindDbRecord(f"eng{tag}", tag, 0, 1.0))
        else:
            from dnntune.providers.triton.perf_db import PerfDb, PerfKey, PerfRecord

            key = PerfKey("matmul", {"m": tag}, {"name": "dev"}, {"triton": "3.6"})
            PerfDb(root).store(key, PerfRecord({"block_m": 64 + tag}, 1.0))


if __name__ == "__main__":
    main()
