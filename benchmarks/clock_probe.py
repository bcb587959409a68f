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
  behind the stall gate) and its host submit time;
- ``host same`` / ``host fresh``: host time per ``Plan.execute`` issued back to back on the
  current stream (as ``dnntune.torch`` calls a plan), with the same output and workspace
  buffers every call (as the tuner times it) or freshly allocated ones (as a model's forward
  calls it; the allocations are included). Written to test whether an engine's per-call host
  cost depends on seeing new pointers (session 4: a cuDNN execute cost ~66 us of host time in
  the decode model, while the tuner's latency put cuDNN and TORCH_ENGINE within 3 %).

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
import time
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
    for entry in g.plan_set.plans.entries:  # type: ignore[union-attr]
        if entry.plan is not None and entry.plan.name not in out:
            out[entry.plan.name] = entry.plan
    return out


def _host_us(
    plan: Any,
    pack: dict[int, Any],
    ws: torch.Tensor,
    handle: dt.Handle,
    fresh: bool,
    outputs: list[int],
    samples: int,
    calls: int = 50,
) -> float:
    """Median host microseconds per back-to-back ``plan.execute`` (see the module docstring)."""

    def buffers() -> tuple[dict[int, Any], torch.Tensor]:
        if not fresh:
            return pack, ws
        p = dict(pack)
        for uid in outputs:
            t = pack[uid]
            p[uid] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        return p, torch.empty_like(ws)

    times = []
    for _ in range(samples):
        handle.timer.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            p, w = buffers()
            plan.execute(p, w, None)
        times.append((time.perf_counter() - t0) / calls * 1e6)
        handle.timer.synchronize()
    return statistics.median(times)


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
    outputs = [t.uid for t in g.output_tensors() if t.uid is not None]
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
        same = _host_us(plan, pack, ws, handle, False, outputs, samples)
        fresh = _host_us(plan, pack, ws, handle, True, outputs, samples)
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
                "host_same_us": same,
                "host_fresh_us": fresh,
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
        "| suite host us | host same us | host fresh us |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.graphs:
        for r in probe(path, handle, args.samples):
            rows.append(r)
            print(
                f"| {r['graph'][:48]} | {r['plan']} | {r['latency_us']:.1f} | "
                f"{r['latency_wd_us']:.1f} | {r['device_us']:.1f} | {r['throughput_us']:.1f} | "
                f"{r['suite_us']:.1f} | "
                f"{r['suite_host_us']:.1f} | {r['host_same_us']:.1f} | {r['host_fresh_us']:.1f} |",
                flush=True,
            )
    out = os.environ.get("OUT")
    if out:
        Path(out, "clock_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
