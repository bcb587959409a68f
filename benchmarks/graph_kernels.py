"""Where dnntune's recorded forward spends its device time against PyTorch's (issue 23).

``optimize(cuda_graph="auto")`` keeps PyTorch's own forward replayed on the transformers (ViT,
LLaMA, ConvNeXt), because its own replay measured slower, and that replay read 0.99x of the
models benchmark's plain ``torch.cuda.graph`` capture (session 17). This script says which
kernels make the differences: per model, in one process, the plain capture of the eager
forward, ``optimize(copy, cuda_graph="auto")``'s forward and ``optimize(copy,
cuda_graph=True)``'s forward are each profiled over a few calls (``torch.profiler``), and their
kernels are summed per kind (GEMM, attention, norm, conv, elementwise, copy, other) and per
name. Also the forwards timed side by side (``_models_run._interleaved``) and the optimize
reports (which layers run on which engine).

    PYTHONPATH=src:benchmarks python benchmarks/graph_kernels.py --models vit_b16,llama_prefill

With ``--compile-mode max-autotune`` the model compiled by ``torch.compile`` in that mode is a
fourth forward, profiled and compared with the plain capture as the others are (its compile
seconds reported): which kernels it fuses that dnntune's forward leaves to PyTorch (the Whisper
encoder and the LLaMA-style prefill, where max-autotune is ahead of auto). dnntune's routing
of attention and the pools is installed first, as in ``models.py``, so the compiled forward
traces what it later runs.

    PYTHONPATH=src:benchmarks python benchmarks/graph_kernels.py --models whisper_encoder \
        --compile-mode max-autotune --tune-budget-s 15

Writes ``<out>/graph_kernels.json`` and prints a table per model.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _models_run import (
    Context,
    _eager_graph,
    _interleaved,
    _route_globals_like_dnntune,
    _sync,
)
from _models_zoo import SPECS, make_setting

import dnntune.torch as dtt

#: kernel kinds, first match wins (names are CUDA kernel names, lower-cased)
KINDS = (
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("norm", r"norm|rms"),
    ("conv", r"conv|implicit_gemm|winograd|fprop|dgrad|wgrad"),
    ("gemm", r"gemm|sm90_xmma|cutlass|cublas|matmul|nvjet|_mm_|triton_.*mm"),
    ("copy", r"copy|transpose|permute|cat|contiguous|fill"),
    ("elementwise", r"elementwise|vectorized|pointwise|gelu|silu|relu|add|mul|triton_poi"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "other")


def kernels(fn: Any, s: Any, calls: int = 5) -> dict[str, list[float]]:
    """{kernel name: [launches per call, device µs per call]} over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync(s)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        _sync(s)
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            cell = out[event.name[:140]]
            cell[0] += 1 / calls
            cell[1] += getattr(event, "device_time_total", 0.0) / calls
    return dict(out)


def by_kind(table: dict[str, list[float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name, (count, us) in table.items():
        cell = out[kind_of(name)]
        cell[0] += count
        cell[1] += us
    return dict(out)


def _bound(model: Any, inputs: Any) -> Any:
    return lambda: model(*inputs)


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    s = make_setting(args)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    with s.device:
        w = SPECS[name].build(s)
    ctx = Context(s, args, Path(args.out) / f"{name}_ov.json")
    row: dict[str, Any] = {"model": name}
    if args.compile_mode:
        from dnntune.torch.routing import install_routers

        install_routers()  # before the compile: it traces the functions it later runs
        _route_globals_like_dnntune(w.model)  # the same for the rotary and grouped-heads globals
    with torch.no_grad():
        w.model(*w.inputs)
        plain = _eager_graph(w, ctx).fn
        fns: dict[str, Any] = {"plain": plain}
        for label, mode in (("dnntune_auto", "auto"), ("dnntune_graph", True)):
            if label not in args.forms.split(","):
                continue
            model = copy.deepcopy(w.model)
            start = time.perf_counter()
            report = dtt.optimize(
                model,
                w.inputs,
                policy=args.policy,
                overrides=ctx.overrides,
                cuda_graph=mode,  # type: ignore[arg-type]
                time_budget_s=args.tune_budget_s,
            )
            row[f"{label}_tune_s"] = time.perf_counter() - start
            row[f"{label}_report"] = str(report)
            row[f"{label}_choice"] = getattr(report, "choice", None)
            fns[label] = _bound(model, w.inputs)
        if args.compile_mode:
            compiled = torch.compile(copy.deepcopy(w.model), mode=args.compile_mode)
            start = time.perf_counter()
            compiled(*w.inputs)  # compiles (max-autotune: and benchmarks its kernels)
            _sync(s)
            row["compiled_s"] = time.perf_counter() - start
            row["compile_mode"] = args.compile_mode
            fns["compiled"] = _bound(compiled, w.inputs)
        samples, failed = _interleaved(fns, s, args.warmup_s, args.rounds)
        row["median_ms"] = {k: statistics.median(v) for k, v in samples.items()}
        row["failed"] = failed
        row["kernels"] = {k: kernels(fn, s) for k, fn in fns.items()}
        row["kinds"] = {k: by_kind(v) for k, v in row["kernels"].items()}
    return row


LABELS = ("plain", "dnntune_auto", "dnntune_graph", "compiled")


def render(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['model']}: {row['error']}"
    med = row["median_ms"]
    labels = [x for x in LABELS if x in row["kinds"]]
    lines = [
        f"== {row['model']}: "
        + ", ".join(f"{x} {med.get(x, float('nan')):.4f} ms" for x in labels)
        + f"; auto chose {row.get('dnntune_auto_choice')}; failed: {row['failed'] or 'none'}",
        f"{'kind':<12} " + " ".join(f"{x + ' n':>18} {x + ' us':>18}" for x in labels),
    ]
    kinds = sorted(set().union(*(row["kinds"][x] for x in labels)))
    for kind in kinds:
        cells = [row["kinds"][x].get(kind, [0, 0]) for x in labels]
        lines.append(f"{kind:<12} " + " ".join(f"{n:>18.1f} {us:>18.1f}" for n, us in cells))
    plain = row["kernels"]["plain"]
    for label in labels[1:]:
        ours = row["kernels"][label]
        diff = {
            k: (
                ours.get(k, [0, 0])[0] - plain.get(k, [0, 0])[0],
                ours.get(k, [0, 0])[1] - plain.get(k, [0, 0])[1],
            )
            for k in set(plain) | set(ours)
        }
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1][1]))[:16]
        lines.append(f"-- kernels that differ most, {label} - plain (launches, us per call)")
        lines += [f"  {us:>+9.1f} us {n:>+6.1f}x  {k[:110]}" for k, (n, us) in top if us or n]
    if "compiled" in labels:
        lines.append(f"-- compiled: mode {row['compile_mode']}, {row['compiled_s']:.0f} s")
    for label in labels[1:]:
        if label + "_report" in row:
            lines.append(f"-- optimize report, {label} ({row[label + '_tune_s']:.0f} s)")
            lines.append(row[label + "_report"])
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="vit_b16,llama_prefill,convnext_tiny")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup-s", type=float, default=0.3)
    p.add_argument("--tune-budget-s", type=float, default=20)
    p.add_argument("--policy", default="tune")
    p.add_argument(
        "--compile-mode", help='also torch.compile(mode=...), e.g. "max-autotune", profiled'
    )
    p.add_argument(
        "--forms",
        default="dnntune_auto,dnntune_graph",
        help="which of dnntune's forwards to profile (comma-separated)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        try:
            row = run(name, args)
        except Exception as exc:  # one model's failure is data
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:800]}
        rows.append(row)
        print(render(row), flush=True)
        (Path(args.out) / "graph_kernels.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
