"""Host overhead of ``Graph.execute`` over calling the same ATen ops directly.

A small conv + bias + ReLU graph runs three ways, back to back, many times:

* ``direct``: the ATen calls TORCH_ENGINE's plan makes, written out by hand;
* ``plan``: ``Plan.execute`` with a ``{uid: tensor}`` pack (no validation);
* ``graph``: ``Graph.execute(handle, pack)``, what a user calls (pack checked every call).

The overhead is the per-call difference of medians. The tensors are tiny so that launch and
Python costs dominate; on CUDA, calls are queued back to back and the device is synchronized once
per sample, so the time per call is the host submit time whenever it exceeds the kernels'.

Usage::

    python benchmarks/execute_overhead.py [--calls 2000] [--samples 15]

Prints a table; writes ``$OUT/execute_overhead.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import dnntune as dt
from dnntune import reference


def build_graph(device: str, dtype: dt.DataType) -> tuple[dt.Graph, dt.Handle, dict[int, Any]]:
    handle = dt.create_handle(device)
    g = dt.Graph(
        name="overhead_conv_bias_relu",
        io_data_type=dtype,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dtype,
    )
    x = g.tensor("X", [1, 8, 8, 8])
    w = g.tensor("W", [8, 8, 3, 3])
    b = g.tensor("B", [1, 8, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y")
    g.build_operation_graph(handle)
    g.create_execution_plan_ext("TORCH_ENGINE")
    g.check_support()
    g.build_plans()
    pack = reference.make_inputs(g, device)
    return g, handle, pack


def direct_fn(g: dt.Graph, pack: dict[int, Any]) -> Callable[[], None]:
    """The plan's ATen calls, by hand: conv2d, add, and relu written into the output."""
    x, w, b = (pack[u] for u in _uids(g, ("X", "W", "B")))
    (y_uid,) = _uids(g, ("Y",))
    out = pack[y_uid]

    def run() -> None:
        t = torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        t = torch.add(t, b)
        torch.clamp_min(t, 0.0, out=out)

    return run


def _uids(g: dt.Graph, names: tuple[str, ...]) -> list[int]:
    by_name = {t.name: t.uid for t in g.tensors}
    return [int(by_name[n]) for n in names]  # type: ignore[arg-type]


def time_per_call_us(
    fn: Callable[[], None], calls: int, samples: int, sync: Callable[[], None]
) -> list[float]:
    for _ in range(max(calls // 10, 10)):
        fn()
    sync()
    out = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter_ns() - start) / 1e3 / calls)
    return out


def measure(device: str, calls: int, samples: int) -> dict[str, Any]:
    dtype = dt.DataType.FLOAT if device == "cpu" else dt.DataType.HALF
    g, handle, pack = build_graph(device, dtype)
    plan = g.active_plan
    assert plan is not None
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    direct = direct_fn(g, pack)
    # the hand-written calls must compute what the plan computes
    (y_uid,) = _uids(g, ("Y",))
    direct()
    by_hand = pack[y_uid].clone()
    pack[y_uid].zero_()
    g.execute(handle, pack)
    torch.testing.assert_close(pack[y_uid], by_hand)
    ways: dict[str, Callable[[], None]] = {
        "direct": direct,
        "plan": lambda: plan.execute(pack, None),
        "graph": lambda: g.execute(handle, pack),
    }
    rows: dict[str, Any] = {}
    # interleave the ways sample by sample so that drift hits all of them alike
    samples_by_way: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(samples):
        for name, fn in ways.items():
            samples_by_way[name] += time_per_call_us(fn, calls, 1, sync)
    for name, values in samples_by_way.items():
        rows[name] = {
            "median_us": statistics.median(values),
            "min_us": min(values),
            "stdev_us": statistics.pstdev(values),
        }
    rows["overhead_plan_us"] = rows["plan"]["median_us"] - rows["direct"]["median_us"]
    rows["overhead_graph_us"] = rows["graph"]["median_us"] - rows["direct"]["median_us"]
    rows["device"] = device
    rows["dtype"] = dtype.json_name
    rows["calls_per_sample"] = calls
    rows["samples"] = samples
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = {d: measure(d, args.calls, args.samples) for d in devices}
    print(
        f"{'device':<6} {'dtype':<6} {'direct us':>10} {'plan us':>10} {'graph us':>10} "
        f"{'plan ovh':>9} {'graph ovh':>9}"
    )
    for d, r in results.items():
        print(
            f"{d:<6} {r['dtype']:<6} {r['direct']['median_us']:>10.2f} "
            f"{r['plan']['median_us']:>10.2f} {r['graph']['median_us']:>10.2f} "
            f"{r['overhead_plan_us']:>9.2f} {r['overhead_graph_us']:>9.2f}"
        )
    out_dir = os.environ.get("OUT")
    if out_dir:
        payload = {
            "benchmark": "execute_overhead",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "results": results,
        }
        path = Path(out_dir) / "execute_overhead.json"
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
