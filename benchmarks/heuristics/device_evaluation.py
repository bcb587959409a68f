"""Held-out scores of the learned ranking per device, each records file alone and all together.

``dnntune heuristics train``'s nested grouped K-fold (``dnntune.learning.evaluate``, the same
folds and parameter choice) run on each records file alone and on all of them together, for
one or more fold seeds; every test problem is scored on its own device's group, so the
together run says what training on several devices does to each device's held-out picks (a
shape measured on two devices is one shape group: it is never in training while either
device's copy of it is tested).

Besides top-1 and "within 2 %" (the evaluation's own), one extra figure, not a replacement
for top-1: **within noise**, a pick that is at most the measured run-to-run noise slower than
the fastest engine. The noise is the median, over the (problem, engine) pairs of the records
that measured a problem more than once on one device (``--noise-from``, default the H100
records: three runs in one session), of ``max / min - 1`` of an engine's time over those
records. Usage (from the repo root)::

    python benchmarks/heuristics/device_evaluation.py [RECORDS ...] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from dnntune.learning import Record, read_records_file
from dnntune.learning.evaluation import Case, evaluate

HERE = Path(__file__).resolve().parent
RECORDS = (HERE / "h200_records.json", HERE / "h100_records.json")


def run_to_run_noise(records: Sequence[Record]) -> float | None:
    """Median ``max / min - 1`` of an engine's time over the records of one problem on one
    device (problems measured once: none); None if no problem was measured twice."""
    by: dict[tuple[Any, str], list[Record]] = defaultdict(list)
    for r in records:
        if not r.order_only:
            by[(r.problem.key(), r.device_class)].append(r)
    spreads = []
    for rs in by.values():
        if len(rs) < 2:
            continue
        for engine in set.intersection(*(set(r.times_ms) for r in rs)):
            times = [r.times_ms[engine] for r in rs]
            spreads.append(max(times) / min(times) - 1.0)
    return statistics.median(spreads) if spreads else None


def scores(cases: Sequence[Case], pick: str, noise: float) -> dict[str, float]:
    ratios = [c.a_ratio if pick == "A" else c.b_ratio for c in cases]
    clear = [r for r, c in zip(ratios, cases, strict=True) if c.clear]
    n = len(ratios)
    return {
        "n": n,
        "top1": sum(r <= 1 + 1e-9 for r in ratios) / n,
        "top1_clear": sum(r <= 1 + 1e-9 for r in clear) / len(clear) if clear else math.nan,
        "within_2pct": sum(r <= 1.02 for r in ratios) / n,
        "within_noise": sum(r <= 1 + noise + 1e-9 for r in ratios) / n,
        "regret": math.exp(sum(math.log(r) for r in ratios) / n) - 1.0,
    }


def _evaluate(job: tuple[str, tuple[str, ...], int]) -> tuple[str, int, list[Case]]:
    name, paths, seed = job
    records = [r for p in paths for r in read_records_file(p)]
    return name, seed, evaluate(records, seed=seed).cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("records", nargs="*", type=Path, default=list(RECORDS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="fold seeds")
    p.add_argument("--noise-from", type=Path, default=HERE / "h100_records.json")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--by-class", action="store_true", help="also per op class")
    a = p.parse_args(argv)
    noise = run_to_run_noise(read_records_file(a.noise_from))
    if noise is None:
        p.error(f"{a.noise_from}: no problem measured twice, no run-to-run noise to take")
    print(f"run-to-run noise (median engine time spread, {a.noise_from.name}): {noise:.2%}")
    sets = {path.stem: (str(path),) for path in a.records}
    if len(a.records) > 1:
        sets["together"] = tuple(str(path) for path in a.records)
    jobs = [(name, paths, seed) for name, paths in sets.items() for seed in a.seeds]
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        results = list(pool.map(_evaluate, jobs))
    head = (
        f"{'trained on':20} {'device':22} {'class':8} {'seed':>4} {'n':>3}  "
        "A top-1  B top-1  B clear  B <=2%  B noise  A regret  B regret  B worse"
    )
    print(head)
    rows: dict[tuple[str, str, str], list[dict[str, float]]] = defaultdict(list)
    for name, seed, cases in results:
        devices = sorted({c.device_class for c in cases})
        for device in devices:
            mine = [c for c in cases if c.device_class == device]
            classes = ["all"] + (sorted({c.op_class for c in mine}) if a.by_class else [])
            for op_class in classes:
                cs = [c for c in mine if op_class in ("all", c.op_class)]
                sa, sb = scores(cs, "A", noise), scores(cs, "B", noise)
                worse = sum(c.b_ratio > c.a_ratio + 1e-9 for c in cs)
                row = {**{f"b_{k}": v for k, v in sb.items()}, "a_top1": sa["top1"]}
                row |= {"a_regret": sa["regret"], "worse": worse}
                rows[(name, device, op_class)].append(row)
                print(_line(name, device, op_class, str(seed), row))
    if len(a.seeds) > 1:
        print(f"mean over seeds {' '.join(map(str, a.seeds))}:")
        for (name, device, op_class), rs in rows.items():
            mean = {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
            print(_line(name, device, op_class, "mean", mean))
    return 0


def _line(name: str, device: str, op_class: str, seed: str, r: dict[str, float]) -> str:
    return (
        f"{name:20} {device:22} {op_class:8} {seed:>4} {int(r['b_n']):3d}  "
        f"{r['a_top1']:7.1%}  {r['b_top1']:7.1%}  {r['b_top1_clear']:7.1%}  "
        f"{r['b_within_2pct']:6.1%}  {r['b_within_noise']:7.1%}  {r['a_regret']:8.1%}  "
        f"{r['b_regret']:8.1%}  {r['worse']:7.2f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
