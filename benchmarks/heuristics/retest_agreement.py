"""How often two measurements of one problem agree on its fastest engine (a noise ceiling).

A held-out label of ``dnntune heuristics train`` is the fastest engine of a problem's records
(merged by geometric mean). Where a problem was measured more than once (the H200 records:
the decision-quality re-times of sessions 7, 8 and 11, and three problems also in session 24's
suite), each record names a winner of its own among the engines every record timed. The share
of ordered pairs of records of one problem that name the same winner is what a perfect
predictor of one measurement could score against another: the top-1 ceiling that measurement
noise (and engines changing between sessions) leaves. The H100 records (``h100_records.json``:
three suite runs of one session, every problem three times) give the noise within one session
only. Usage (from the repo root)::

    python benchmarks/heuristics/retest_agreement.py [benchmarks/heuristics/h200_records.json]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from dnntune.learning import Record, read_records_file

RECORDS = Path(__file__).resolve().parent / "h200_records.json"


def winners(records: list[Record]) -> list[str]:
    """Each record's fastest engine among the engines every one of ``records`` timed."""
    common = set.intersection(*(set(r.times_ms) for r in records))
    return [min(sorted(common), key=lambda e: r.times_ms[e]) for r in records]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("records", nargs="?", type=Path, default=RECORDS)
    args = p.parse_args(argv)
    by_problem: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in read_records_file(args.records):
        if not r.order_only:
            by_problem[(r.problem.label(), r.device_class)].append(r)
    pairs: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (label, _device), records in sorted(by_problem.items()):
        if len(records) < 2:
            continue
        won = winners(records)
        op_class = records[0].problem.op_class
        for i, a in enumerate(won):
            for j, b in enumerate(won):
                if i != j:
                    pairs[op_class][0] += a == b
                    pairs[op_class][1] += 1
        print(f"{op_class:8} {label:64} {' '.join(won)}")
    total = [sum(v[0] for v in pairs.values()), sum(v[1] for v in pairs.values())]
    for name, (same, n) in [*sorted(pairs.items()), ("all", total)]:
        print(f"{name:8} winner agreement between two records: {same}/{n} = {same / n:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
