"""Compare the one-GPU and the distributed tuning runs of ``multi_gpu_tune.sh``.

Usage: python benchmarks/_multi_gpu_compare.py OUT T0 T1 T2 (the folder and the three start/end
times the script took). Prints the wall times and speedup, how much of the graph-sharded time the
per-round synchronisation cost (each round waits for its slowest graph), and which override
entries differ between the runs, with the one-GPU run's margin between its winner and runner-up
(a winner that differs where the margin is inside the noise is a tie, not a bug).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _entries(path: Path) -> dict[str, dict[str, Any]]:
    """Override entries by their tensors (the graph's identity), timings left out."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    out: dict[str, dict[str, Any]] = {}
    for e in data.get("engine_overrides", []):
        key = json.dumps([e["op"], e["tensors"], e.get("criteria", {})], sort_keys=True)
        out[key] = {k: v for k, v in e.items() if k != "autotune_metadata"}
    return out


def _reports(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def _winner(report: dict[str, Any]) -> str:
    w = report.get("winner") or {}
    return str(w.get("plan") or w.get("engine_name") or w)


def main(out: Path, t0: float, t1: float, t2: float) -> None:
    single_s, graphs_s = t1 - t0, t2 - t1
    print(
        f"one GPU: {single_s:.1f} s; graph-sharded: {graphs_s:.1f} s; "
        f"speedup {single_s / graphs_s:.2f}x"
    )
    single = _reports(out / "single_report.json")
    sharded = _reports(out / "graphs_report.json")
    times = [r["tuning_time_ms"] / 1e3 for r in sharded]
    if times:
        world = 2
        rounds = [max(times[i : i + world]) for i in range(0, len(times), world)]
        print(
            f"graph-sharded tuning: {sum(times):.1f} s of work; rounds took {sum(rounds):.1f} s "
            f"(perfect balance {sum(times) / world:.1f} s)"
        )
    print(
        f"one-GPU tuning work: {sum(r['tuning_time_ms'] for r in single) / 1e3:.1f} s "
        f"in {len(single)} graphs ({sum(r['ok'] for r in single)} ok)"
    )
    a, b = _entries(out / "single.json"), _entries(out / "graphs.json")
    same = sum(1 for k in a if a[k] == b.get(k))
    print(
        f"override entries: one GPU {len(a)}, graph-sharded {len(b)}; "
        f"identical modulo timings: {same}"
    )
    margins = {r["graph"]: r.get("margin") for r in single}
    by_graph = {r["graph"]: r for r in sharded}
    for r in single:
        other = by_graph.get(r["graph"])
        if other is not None and _winner(r) != _winner(other):
            m = margins.get(r["graph"])
            margin = "n/a" if m is None else f"{100 * m:.1f}%"
            print(
                f"  differs: {r['graph']}: {_winner(r)} vs {_winner(other)} "
                f"(one-GPU margin to runner-up {margin})"
            )
    c = _entries(out / "candidates.json")
    agree = sum(1 for k in c if c[k] == a.get(k))
    print(f"candidate-sharded entries: {len(c)}; identical to the one-GPU run's: {agree}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *(float(x) for x in sys.argv[2:5]))
