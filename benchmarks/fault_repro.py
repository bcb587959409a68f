"""Find the step at which ``torch_e2e.py``'s prefill run faults (session 4: "CUDA error:
unspecified launch failure" when torch.compile max-autotune ran in the same process).

Runs the same steps as ``torch_e2e.run_case`` for one model, with a device synchronize and a
line of output after each, so the first failing line names the step whose kernels faulted. Each
step can be left out, to bisect:

    python benchmarks/fault_repro.py [--model decoder_prefill] [--skip compile,throughput,...]

Steps: eager, compile, latency (optimize, latency-ranked), throughput (optimize,
throughput-ranked), graph (optimize with cuda_graph=True, device-ranked), cached (a fresh copy
with policy="cached" and cuda_graph=True, as the e2e times it), interleave (every variant
called in turn, synchronized after each call).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import dnntune.torch as dtt

sys.path.insert(0, str(Path(__file__).parent))
from torch_e2e import _cases, make_model

STEPS = ("eager", "compile", "latency", "throughput", "graph", "cached", "interleave")


def _step(name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    print(f"-> {name} ...", flush=True)
    out = fn()
    torch.cuda.synchronize()
    print(f"ok {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="decoder_prefill")
    parser.add_argument("--skip", default="", help=f"comma-separated steps of {STEPS}")
    parser.add_argument("--quick", action="store_true", help="tiny shapes")
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if unknown := skip - set(STEPS):
        parser.error(f"unknown steps {sorted(unknown)}; steps are {STEPS}")
    device, dtype = torch.device("cuda"), torch.bfloat16
    (_, make, shape, kind) = next(c for c in _cases(args.quick, dtype) if c[0] == args.model)
    base, x = make_model(make, shape, kind, device, dtype)
    variants: dict[str, Callable[[], Any]] = {}
    tmp = Path(tempfile.mkdtemp())
    with torch.no_grad():
        if "eager" not in skip:
            _step("eager", lambda: base(x))
            variants["eager"] = lambda: base(x)
        if "compile" not in skip:
            compiled = torch.compile(copy.deepcopy(base), mode="max-autotune")
            _step("compile", lambda: compiled(x))
            variants["compile"] = lambda: compiled(x)
    for name, kwargs in (
        ("latency", {}),
        ("throughput", {"ranking_metric": "throughput"}),
        ("graph", {"cuda_graph": True}),
    ):
        if name in skip:
            continue
        model = copy.deepcopy(base)
        _step(
            name,
            lambda m=model, n=name, kw=kwargs: dtt.optimize(  # type: ignore[misc]
                m, (x,), policy="tune", overrides=tmp / f"{n}.json", **kw
            ),
        )
        variants[name] = lambda m=model: m(x)  # type: ignore[misc]
    if "cached" not in skip and "graph" not in skip:
        reused = copy.deepcopy(base)
        _step(
            "cached",
            lambda: dtt.optimize(
                reused, (x,), policy="cached", overrides=tmp / "graph.json", cuda_graph=True
            ),
        )
        variants["cached"] = lambda: reused(x)
    if "interleave" not in skip:
        with torch.no_grad():
            for r in range(3):
                for name, fn in variants.items():
                    _step(f"interleave round {r}: {name}", fn)
    print("no fault", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
