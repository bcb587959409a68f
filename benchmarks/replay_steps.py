"""Where the host time before an installed replay's launch goes (issue 23): each step of
``dnntune.torch.cuda_graphs.call`` added in turn to a bare replay of the same recorded graph,
every variant's one call timed from an idle GPU (after a synchronize), interleaved.

Then what the GPU sees, as the models benchmark times it: bursts of three forwards from an
idle GPU (synchronize, three calls, synchronize), interleaved, for the plain capture, the
installed replay as it runs (``launch first``: a forward that writes none of its module's
tensors replays before its weights check) and the same installed replay with the check first
(``Capture.pure`` set False, as before 6e4369d).

    PYTHONPATH=src:benchmarks python benchmarks/replay_steps.py --models vit_b16
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, cast

import torch
from _models_run import Context, _eager_graph
from _models_zoo import SPECS, make_setting

from dnntune.torch import cuda_graphs
from dnntune.torch._graph_state import Capture
from dnntune.torch._support import tracing


def _variants(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    m = copy.deepcopy(model)
    cuda_graphs.install(m)
    m(*inputs)  # records
    state = cuda_graphs.graphs_of(m)
    capture = next(c for c in state.captures.values() if isinstance(c, Capture))
    plain_forward = cast(Any, type(m).__mro__[1]).forward

    def bare() -> Any:
        for dst, src in zip(capture.static_inputs, inputs, strict=True):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        capture.graph.replay()
        return capture.static_output

    def fwd(*a: Any, **k: Any) -> Any:
        return plain_forward(m, *a, **k)

    steps: dict[str, Any] = {
        "bare": bare,
        "bare+clone": lambda: (bare(), capture.output())[1],
        "bare+unchanged": lambda: (capture.weights.unchanged(), bare())[1],
        "bare+flatten+signature": lambda: (
            cuda_graphs.signature(*cuda_graphs._flatten(inputs, {})),
            bare(),
        )[1],
        "bare+graph_mode": lambda: (
            cuda_graphs._graph_mode(m, list(inputs), state),
            bare(),
        )[1],
        "bare+stream": lambda: (cuda_graphs._current_stream(inputs[0].device.index), bare())[1],
        "bare+tracing": lambda: (tracing(), bare())[1],
        "bare+capturing": lambda: (torch.cuda.is_current_stream_capturing(), bare())[1],
        "call()": lambda: cuda_graphs.call(m, fwd, inputs, {}),
        "m.forward()": lambda: m.forward(*inputs),
        "m()": lambda: m(*inputs),
    }
    return steps


def _bursts(fns: dict[str, Any], rounds: int, calls: int = 3) -> dict[str, float]:
    """Median ms of ``calls`` forwards from an idle GPU to their end, interleaved."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v[rounds // 8 :]) for k, v in times.items()}


def _check_first(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """An installed copy whose replays check the weights before the launch."""
    m = copy.deepcopy(model)
    cuda_graphs.install(m)
    m(*inputs)
    for capture in cuda_graphs.graphs_of(m).captures.values():
        if isinstance(capture, Capture):
            capture.pure = False
    return lambda: m(*inputs)


def _from_idle(fns: dict[str, Any], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="vit_b16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    args = p.parse_args()
    s = make_setting(args)
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        with s.device:
            w = SPECS[name].build(s)
        ctx = Context(s, args, args.out / "unused.json")
        with torch.no_grad():
            w.model(*w.inputs)
            fns = {"plain": _eager_graph(w, ctx).fn, **_variants(w.model, w.inputs)}
            _from_idle(fns, 5)  # warm
            us = _from_idle(fns, args.rounds)
            bursts = _bursts(
                {
                    "plain": fns["plain"],
                    "launch_first": fns["m()"],
                    "check_first": _check_first(w.model, w.inputs),
                },
                args.rounds,
            )
        print(f"{name}: host µs of one call from an idle GPU (median of {args.rounds})")
        for k, v in us.items():
            print(f"  {k:26s} {v:8.1f}  ({v - us['bare']:+.1f} over bare)")
        print(f"{name}: ms of three forwards from an idle GPU (median)")
        for k, v in bursts.items():
            print(f"  {k:26s} {v:8.3f}  ({v / bursts['plain']:.4f}x plain's time)")
        rows.append({"model": name, "host_us_from_idle": us, "bursts_ms": bursts})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_steps.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
