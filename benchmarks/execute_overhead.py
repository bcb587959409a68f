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
    # Noise only ever adds time: the difference of minima is the steadier estimate of what
    # the extra Python costs; the difference of medians is what a typical call sees.
    for way in ("plan", "graph"):
        rows[f"overhead_{way}_us"] = rows[way]["median_us"] - rows["direct"]["median_us"]
        rows[f"overhead_{way}_min_us"] = rows[way]["min_us"] - rows["direct"]["min_us"]
    rows["device"] = device
    rows["dtype"] = dtype.json_name
    rows["calls_per_sample"] = calls
    rows["samples"] = samples
    return rows


def breakdown(device: str) -> dict[str, float]:
    """Microseconds per call of each piece of ``Graph.execute`` (timeit, best of 7)."""
    import timeit

    from dnntune.backend.variant_pack import normalize_variant_pack

    dtype = dt.DataType.FLOAT if device == "cpu" else dt.DataType.HALF
    g, handle, pack = build_graph(device, dtype)
    plan = g.active_plan
    assert plan is not None
    args = [pack[u] for u in plan.arg_uids]  # type: ignore[attr-defined]
    run = plan._run  # type: ignore[attr-defined]
    plans = g._plans
    assert plans is not None
    pieces: dict[str, Callable[[], object]] = {
        "normalize_variant_pack": lambda: normalize_variant_pack(g, pack, handle),
        "stream_context": lambda: handle.stream_context().__enter__(),
        "check_not_barred": lambda: plans.check_not_barred(plan),
        "program_run": lambda: run(args),
        "plan_execute": lambda: plan.execute(pack, None),
        "graph_execute": lambda: g.execute(handle, pack),
        "direct": direct_fn(g, pack),
    }
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, fn in pieces.items():
        sync()
        best = min(timeit.repeat(fn, number=500, repeat=7)) / 500 * 1e6
        sync()
        out[name] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--breakdown", action="store_true", help="also time each piece")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = {d: measure(d, args.calls, args.samples) for d in devices}
    if args.breakdown:
        for d in devices:
            results[d]["breakdown_us"] = pieces = breakdown(d)
            print(d, "  ".join(f"{k} {v:.2f}" for k, v in pieces.items()))
    print("microseconds per call: median of samples (min of samples)")
    header = ["device", "dtype", "direct", "plan", "graph", "plan overhead", "graph overhead"]
    print(" ".join(f"{h:>16}" for h in header))
    for d, r in results.items():
        cells = [d, r["dtype"]]
        cells += [
            f"{r[w]['median_us']:.2f} ({r[w]['min_us']:.2f})" for w in ("direct", "plan", "graph")
        ]
        cells += [
            f"{r[f'overhead_{w}_us']:.2f} ({r[f'overhead_{w}_min_us']:.2f})"
            for w in ("plan", "graph")
        ]
        print(" ".join(f"{c:>16}" for c in cells))
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
