"""Do the tuner's clocks agree with the suite's? One table per graph, every engine's plan.

For each graph (suite JSON files given on the command line) and each engine's heuristic plan,
measured side by side in one process:

- ``latency``: the tuner's "latency" sample (one execute on an idle device, host submit
  included), with calls inline (no candidate timeout);
- ``latency+wd``: the same through a Watchdog helper thread (``candidate_timeout_s`` set, the
  ``dnntune tune`` default);
- ``device``: the tuner's "device" sample (kernels behind the stall gate);
- ``throughput``: the tuner's "throughput" sample (calls back to back, no gate);
- ``suite``: ``benchmarks/run.py``'s clock (``dnntune.bench.timing.time_callable``: one launch
  behind the stall gate) and its host submit time.

Medians of ``--samples`` samples each, after the tuner's two untimed runs per sample. Written
to find out why tuned plans lost to heuristic ones in the suite (session 3).

Usage: ``python benchmarks/clock_probe.py benchmarks/suite/norm_*.json``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import dnntune as dt
from dnntune import reference
from dnntune.autotune.benchmark import ExecutionContext, steady_sample
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.bench.timing import TimingOptions, time_callable


def _plans(g: dt.Graph) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in g._plans.entries:  # type: ignore[union-attr]
        if entry.plan is not None and entry.plan.name not in out:
            out[entry.plan.name] = entry.plan
    return out


def probe(path: Path, handle: dt.Handle, samples: int) -> list[dict[str, Any]]:
    g = dt.Graph.load(path)
    g.build_operation_graph(handle)
    g.deselect_engines(["TORCH_COMPILE_ENGINE"])
    g.create_execution_plans([dt.HeuristicMode.FALLBACK])
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    pack = normalize_variant_pack(g, reference.make_inputs(g, handle.device, seed=0), handle)
    plans = _plans(g)
    size = max((p.workspace_size for p in plans.values()), default=0)
    ws = torch.empty(max(size, 1), dtype=torch.uint8, device=handle.device)
    inline = ExecutionContext(handle, pack, ws)
    guarded = ExecutionContext(handle, pack, ws, watchdog=Watchdog(60.0, handle.device))
    rows = []
    for name, plan in plans.items():
        lat = [steady_sample(inline, plan, "latency") for _ in range(samples)]
        lat_wd = [steady_sample(guarded, plan, "latency") for _ in range(samples)]
        dev = [steady_sample(inline, plan, "device") for _ in range(samples)]
        n = inline.calibrate_throughput(plan)
        thr = [steady_sample(inline, plan, "throughput", n) for _ in range(samples)]

        def run(plan: Any = plan) -> None:
            inline.run(plan)

        t = time_callable(run, handle, TimingOptions(warmup=10, iters=samples))
        rows.append(
            {
                "graph": path.stem,
                "plan": name,
                "latency_us": 1e3 * statistics.median(lat),
                "latency_wd_us": 1e3 * statistics.median(lat_wd),
                "device_us": 1e3 * statistics.median(dev),
                "throughput_us": 1e3 * statistics.median(thr),
                "suite_us": 1e3 * t.kernel.median_ms,
                "suite_host_us": 1e3 * t.host.median_ms,
            }
        )
    guarded.watchdog.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("graphs", nargs="+", type=Path)
    p.add_argument("--samples", type=int, default=30)
    args = p.parse_args(argv)
    handle = dt.Handle(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rows: list[dict[str, Any]] = []
    print(
        "| graph | plan | latency us | latency+wd us | device us | throughput us | suite us "
        "| suite host us |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in args.graphs:
        for r in probe(path, handle, args.samples):
            rows.append(r)
            print(
                f"| {r['graph'][:48]} | {r['plan']} | {r['latency_us']:.1f} | "
                f"{r['latency_wd_us']:.1f} | {r['device_us']:.1f} | {r['throughput_us']:.1f} | "
                f"{r['suite_us']:.1f} | "
                f"{r['suite_host_us']:.1f} |",
                flush=True,
            )
    out = os.environ.get("OUT")
    if out:
        Path(out, "clock_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
