"""End to end: ``dnntune.torch.optimize`` vs PyTorch eager vs ``torch.compile`` (issue 13).

Two models, inference and one training step, each measured in one process on the same inputs:

* a ResNet-50-like stack (stem conv 7x7/2 + BN + ReLU, max pool, three bottleneck blocks),
  NHWC (channels_last), fp16 or bf16;
* a LLaMA-like decoder block (RMSNorm, QKV, causal SDPA with GQA, O projection, RMSNorm,
  SwiGLU MLP), bf16, at a prefill shape and a decode shape.

Baselines: eager with ``torch.backends.cudnn.benchmark = True``, and
``torch.compile(mode="max-autotune")``. dnntune: ``optimize(model, example_inputs, "tune")``
(first-run tuning time reported next to max-autotune's compile time); on CUDA also
``optimize(..., "tune", cuda_graph=True)`` (tuned by kernel time, replayed as one CUDA graph),
then a fresh copy with ``policy="cached"`` from that override file (must tune nothing), which
is the one timed as "dnntune+graph".

Timing: every inference variant of a model (and then both training steps) is timed side by
side in interleaved rounds of back-to-back calls (``_side_by_side``), after a time-based warm-up,
with ``cudnn.benchmark`` on for all; the tables report the median ms per call, so the ratios are
throughput ratios under equal conditions.

Usage::

    python benchmarks/torch_e2e.py [--device cuda] [--dtype bf16] [--skip-compile] [--quick]

Prints a table; writes ``$OUT/torch_e2e.json`` when ``OUT`` is set. On CPU use ``--quick`` (tiny
shapes) to check that it runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt


class Bottleneck(nn.Module):
    def __init__(self, channels: int, mid: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, mid, 3, padding=1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, channels, 1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


class ResNetStack(nn.Module):
    def __init__(self, width: int = 256, mid: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.blocks = nn.Sequential(*(Bottleneck(width, mid) for _ in range(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(self.stem(x), 3, 2, 1)
        return self.blocks(y)


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2).contiguous()
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        a = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _side_by_side(
    fns: dict[str, Callable[[], Any]], device: torch.device, warmup: int, rounds: int
) -> dict[str, float]:
    """Median ms per call of every variant, timed in interleaved rounds under equal conditions.

    Each variant first runs ``warmup`` calls and at least 0.2 s (GPU clocks up, lazy work
    done); then each round times every variant, in a rotating order, over a burst of
    back-to-back calls of about 10 ms (one sync per burst: what a serving loop sees, host and
    device overlapping). A clock change or a noisy neighbour hits all variants alike, not
    the one that happened to run then.
    """
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    bursts: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        sync()
        n, t0 = 0, time.perf_counter()
        while n < 10 or time.perf_counter() - t0 < 0.2:
            fn()
            n += 1
            if n % 10 == 0:
                sync()
        sync()
        per_call = (time.perf_counter() - t0) / n
        bursts[name] = max(3, min(200, int(0.010 / max(per_call, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], bursts[name]
            sync()
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
                samples[name].append(float(start.elapsed_time(end)) / n)
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - t0) * 1e3 / n)
    return {name: statistics.median(v) for name, v in samples.items()}


def _cases(
    quick: bool, dtype: torch.dtype
) -> list[tuple[str, Callable[[], nn.Module], tuple[int, ...], str]]:
    if quick:
        return [
            ("resnet_stack", lambda: ResNetStack(16, 8), (2, 3, 32, 32), "image"),
            ("decoder_prefill", lambda: DecoderBlock(64, 4, 2, 128), (1, 16, 64), "tokens"),
            ("decoder_decode", lambda: DecoderBlock(64, 4, 2, 128), (4, 1, 64), "tokens"),
        ]
    return [
        ("resnet_stack", lambda: ResNetStack(256, 64), (32, 3, 224, 224), "image"),
        ("decoder_prefill", lambda: DecoderBlock(4096, 32, 8, 14336), (1, 2048, 4096), "tokens"),
        ("decoder_decode", lambda: DecoderBlock(4096, 32, 8, 14336), (32, 1, 4096), "tokens"),
    ]


def _profile(
    name: str,
    fns: dict[str, Callable[[], Any]],
    device: torch.device,
    report: str,
    suffix: str = "",
) -> None:
    """Print (and write under $OUT) a profiler table per variant: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    text = [report]
    for label, fn in fns.items():
        fn()
        with profile(activities=activities) as prof:
            for _ in range(5):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        table = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60)
        text.append(f"== {name} / {label} (5 calls)\n{table}")
    print("\n".join(text), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, f"profile_{name}{suffix}.txt").write_text("\n".join(text))


def _cprofile(name: str, model: nn.Module, x: torch.Tensor, device: torch.device) -> None:
    """The host-side Python cost of dnntune's forward, by function (cProfile, 50 calls)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    with torch.no_grad():
        model(x)
        prof.enable()
        for _ in range(50):
            model(x)
        prof.disable()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
    print(buf.getvalue(), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, f"cprofile_{name}.txt").write_text(buf.getvalue())


def make_model(
    make: Callable[[], nn.Module],
    shape: tuple[int, ...],
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[nn.Module, torch.Tensor]:
    """The eval-mode model and its input (seeded; channels_last for image models)."""
    torch.manual_seed(0)
    base = make().to(device=device, dtype=dtype).eval()
    x = torch.randn(shape, device=device, dtype=dtype)
    if kind == "image":
        base = base.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return base, x


def run_case(
    name: str,
    make: Callable[[], nn.Module],
    shape: tuple[int, ...],
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
    args: argparse.Namespace,
    overrides: Path,
) -> dict[str, Any]:
    base, x = make_model(make, shape, kind, device, dtype)
    row: dict[str, Any] = {"model": name, "shape": list(shape), "dtype": str(dtype)}
    torch.backends.cudnn.benchmark = True
    infer: dict[str, Callable[[], Any]] = {"eager_ms": lambda: base(x)}
    with torch.no_grad():
        base(x)  # cudnn.benchmark picks its algorithms here, outside any timing
        expected = base(x)
    if not args.skip_compile:
        compiled = torch.compile(copy.deepcopy(base), mode="max-autotune")
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(x)
        row["compile_s"] = time.perf_counter() - t0
        infer["max_autotune_ms"] = lambda: compiled(x)
    torch.backends.cudnn.benchmark = False
    dtt.configure(mode=args.mode)
    row["tune_mode"] = args.mode
    tuned = copy.deepcopy(base)
    t0 = time.perf_counter()
    # the uncaptured forward (the default cuda_graph="auto" may replay it)
    report = dtt.optimize(
        tuned, example_inputs=(x,), policy="tune", overrides=overrides, cuda_graph=False
    )
    row["dnntune_first_run_s"] = time.perf_counter() - t0
    row["dnntune_tuning_s"] = report.tuning_time_ms / 1e3
    print(f"[{name}] latency-ranked: {report}", flush=True)
    row["fusions"] = len(report.fusions)  # the fusions that run: none once reverted
    row["reverted"] = report.reverted
    infer["dnntune_ms"] = lambda: tuned(x)
    with torch.no_grad():
        got = tuned(x)
    row["max_abs_diff_vs_eager"] = float((got.float() - expected.float()).abs().max())
    if report.speedup is not None:
        row["check_speedup"] = report.speedup  # optimize()'s own end-to-end check
    if args.also_throughput:
        # the same, tuned on the back-to-back clock (host and device overlapping): is it the
        # better default for an uncaptured forward?
        thr = copy.deepcopy(base)
        thr_report = dtt.optimize(
            thr,
            (x,),
            policy="tune",
            overrides=overrides.with_name(overrides.stem + "_throughput.json"),
            ranking_metric="throughput",
            cuda_graph=False,
        )
        row["dnntune_throughput_tuning_s"] = thr_report.tuning_time_ms / 1e3
        print(f"[{name}] throughput-ranked: {thr_report}", flush=True)
        infer["dnntune_throughput_ms"] = lambda: thr(x)
    if args.also_refine:
        # the latency-ranked winners (from the same file, no tuning), then each module tried on
        # PyTorch's own ops in the whole forward (optimize(refine=True))
        refined = copy.deepcopy(base)
        ref_report = dtt.optimize(
            refined, (x,), policy="cached", overrides=overrides, refine=True, cuda_graph=False
        )
        row["refined_modules"] = [r.name for r in ref_report.swapped if r.pytorch]
        print(f"[{name}] refined: {ref_report}", flush=True)
        infer["dnntune_refined_ms"] = lambda: refined(x)
    if args.profile:
        with torch.no_grad():
            _profile(
                name, {"eager": lambda: base(x), "dnntune": lambda: tuned(x)}, device, str(report)
            )
        _cprofile(name, tuned, x, device)
    graphed = device.type == "cuda"
    graph_overrides = overrides.with_name(overrides.stem + "_graph.json")
    if graphed:
        # tuned for CUDA-graph replay (candidates ranked by kernel time), replayed as one graph
        # the way max-autotune's cudagraphs replay it
        tuned_graph = copy.deepcopy(base)
        graph_report = dtt.optimize(
            tuned_graph, (x,), policy="tune", overrides=graph_overrides, cuda_graph=True
        )
        row["dnntune_graph_tuning_s"] = graph_report.tuning_time_ms / 1e3
        print(f"[{name}] device-ranked, CUDA graph: {graph_report}", flush=True)
    # a fresh copy from the override file: must tune nothing
    reused = copy.deepcopy(base)
    calls = dtt.runtime_stats.autotune_calls
    dtt.optimize(
        reused,
        example_inputs=(x,),
        policy="cached",
        overrides=graph_overrides if graphed else overrides,
        cuda_graph=graphed,
    )
    row["cached_autotune_calls"] = dtt.runtime_stats.autotune_calls - calls
    if graphed:
        infer["dnntune_graph_ms"] = lambda: reused(x)
        with torch.no_grad():
            got = reused(x)
        row["graph_max_abs_diff_vs_eager"] = float((got.float() - expected.float()).abs().max())
    # every inference variant side by side, in interleaved rounds, under the same settings
    # (cudnn.benchmark on, as the eager baseline has it)
    torch.backends.cudnn.benchmark = True
    with torch.no_grad():
        row.update(_side_by_side(infer, device, args.warmup, args.iters))
    if "dnntune_throughput_ms" in row:
        row["throughput_speedup_vs_eager"] = row["eager_ms"] / row["dnntune_throughput_ms"]
    if "dnntune_refined_ms" in row:
        row["refined_speedup_vs_eager"] = row["eager_ms"] / row["dnntune_refined_ms"]
    if "dnntune_graph_ms" in row:
        row["graph_speedup_vs_eager"] = row["eager_ms"] / row["dnntune_graph_ms"]
        if "max_autotune_ms" in row:
            row["graph_speedup_vs_max_autotune"] = row["max_autotune_ms"] / row["dnntune_graph_ms"]
    # one training step (forward + backward) on the train-mode model
    train_eager, train_dt = copy.deepcopy(base).train(), copy.deepcopy(tuned).train()
    xt = x.detach().requires_grad_(False)

    def step(model: nn.Module) -> Callable[[], None]:
        def go() -> None:
            model.zero_grad(set_to_none=True)
            model(xt).float().square().mean().backward()

        return go

    train = {"train_eager_ms": step(train_eager), "train_dnntune_ms": step(train_dt)}
    if graphed:
        # the training step with the forward and its backward replayed as CUDA graphs (tuned
        # on kernel time, as the inference copy; the backward's kernels tune on first sight)
        train["train_dnntune_graph_ms"] = step(copy.deepcopy(tuned_graph).train())
    if args.compile_train and not args.skip_compile:
        compiled_train = cast(
            nn.Module, torch.compile(copy.deepcopy(base).train(), mode="max-autotune")
        )
        t0 = time.perf_counter()
        step(compiled_train)()
        step(compiled_train)()
        row["compile_train_s"] = time.perf_counter() - t0
        train["train_max_autotune_ms"] = step(compiled_train)
    row.update(_side_by_side(train, device, 2, args.iters))
    for variant in ("train_dnntune_graph_ms", "train_max_autotune_ms"):
        if variant in row:
            row[variant.replace("_ms", "_speedup_vs_eager")] = row["train_eager_ms"] / row[variant]
    if args.profile:
        # where a training step's time goes: dnntune's dgrad/wgrad kernels against its host work
        fns = {"train_eager": train["train_eager_ms"], "train_dnntune": train["train_dnntune_ms"]}
        _profile(name, fns, device, str(report), suffix="_train")
    torch.backends.cudnn.benchmark = False
    row["speedup_vs_eager"] = row["eager_ms"] / row["dnntune_ms"]
    if "max_autotune_ms" in row:
        row["speedup_vs_max_autotune"] = row["max_autotune_ms"] / row["dnntune_ms"]
        row["tuning_over_compile"] = row["dnntune_tuning_s"] / max(row["compile_s"], 1e-9)
    row["train_speedup_vs_eager"] = row["train_eager_ms"] / row["train_dnntune_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--profile", action="store_true", help="print profiler tables")
    parser.add_argument("--models", default="", help="comma-separated model names to run")
    parser.add_argument(
        "--mode",
        choices=["standard", "exhaustive"],
        default="standard",
        help="dnntune.torch tuning mode (exhaustive: engines' own searches prime first)",
    )
    parser.add_argument(
        "--also-refine",
        action="store_true",
        help="also time a copy optimized with refine=True (modules tried on PyTorch's ops)",
    )
    parser.add_argument(
        "--compile-train",
        action="store_true",
        help="also time a training step of torch.compile(mode='max-autotune') (compiles the "
        "backward too: slow)",
    )
    parser.add_argument(
        "--also-throughput",
        action="store_true",
        help="also tune a copy with ranking_metric='throughput' and time it uncaptured",
    )
    args = parser.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        overrides = Path(tmp) / "overrides.json"
        wanted = {m for m in args.models.split(",") if m}
        for name, make, shape, kind in _cases(args.quick, dtype):
            if wanted and name not in wanted:
                continue
            row = run_case(name, make, shape, kind, device, dtype, args, overrides)
            rows.append(row)
            print(json.dumps(row), flush=True)
    nan = float("nan")
    print(
        "| model | eager ms | max-autotune ms | dnntune ms | dnntune+graph ms | vs eager | "
        "+graph vs eager | +graph vs max-autotune | tuning s | compile s | train vs eager | "
        "cached tunes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['eager_ms']:.3f} | {r.get('max_autotune_ms', nan):.3f}"
            f" | {r['dnntune_ms']:.3f} | {r.get('dnntune_graph_ms', nan):.3f}"
            f" | {r['speedup_vs_eager']:.2f}x | {r.get('graph_speedup_vs_eager', nan):.2f}x"
            f" | {r.get('graph_speedup_vs_max_autotune', nan):.2f}x"
            f" | {r['dnntune_tuning_s']:.1f} | {r.get('compile_s', nan):.1f} | "
            f"{r['train_speedup_vs_eager']:.2f}x | {r['cached_autotune_calls']} |"
        )
    if any("train_dnntune_graph_ms" in r or "train_max_autotune_ms" in r for r in rows):
        print(
            "\n| model | train eager ms | train dnntune ms | train dnntune+graph ms | "
            "train max-autotune ms | +graph vs eager | max-autotune vs eager |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['model']} | {r['train_eager_ms']:.3f} | {r['train_dnntune_ms']:.3f} | "
                f"{r.get('train_dnntune_graph_ms', nan):.3f} | "
                f"{r.get('train_max_autotune_ms', nan):.3f} | "
                f"{r.get('train_dnntune_graph_speedup_vs_eager', nan):.2f}x | "
                f"{r.get('train_max_autotune_speedup_vs_eager', nan):.2f}x |"
            )
    if any("dnntune_refined_ms" in r for r in rows):
        print(
            "\n| model | eager ms | dnntune ms | dnntune refined ms | refined vs eager "
            "| on PyTorch |"
        )
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['model']} | {r['eager_ms']:.3f} | {r['dnntune_ms']:.3f} | "
                f"{r.get('dnntune_refined_ms', nan):.3f} | "
                f"{r.get('refined_speedup_vs_eager', nan):.2f}x | "
                f"{', '.join(r.get('refined_modules', [])) or '-'} |"
            )
    if any("dnntune_throughput_ms" in r for r in rows):
        print(
            "\n| model | eager ms | dnntune (latency-ranked) ms | dnntune (throughput-ranked) ms |"
        )
        print("|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['model']} | {r['eager_ms']:.3f} | {r['dnntune_ms']:.3f} | "
                f"{r.get('dnntune_throughput_ms', nan):.3f} |"
            )
    out = os.environ.get("OUT")
    if out:
        Path(out, "torch_e2e.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
