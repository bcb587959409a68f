"""TRITON_ENGINE kernels on a GPU against PyTorch eager (and the copy bandwidth ceiling).

Norms (RMSNorm, LayerNorm, bf16): achieved GB/s of TRITON_ENGINE with its searched config,
PyTorch eager (``F.rms_norm`` / ``F.layer_norm``) and a large ``dst.copy_(src)``.
Matmul + bias + gelu at BERT/LLaMA shapes (decode M=1..32 and prefill M >= 2048):
TRITON_ENGINE (searched config, one fused kernel) against eager ``a @ b``, ``+ bias``,
``gelu`` (three kernels), and optionally ``torch.compile(mode="max-autotune")``.

Times are medians of CUDA-event samples, each sample ``repeats`` back-to-back calls (device
time including launch gaps). Every TRITON_ENGINE output is checked against eager first.
Prints markdown tables; ``--json`` writes every number.

    PYTHONPATH=src python benchmarks/triton_kernels.py --json out.json [--quick] [--compile]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import dnntune as dt
from dnntune import KnobSetting, get_registry, make_inputs

P = dt.PointwiseMode
BF16 = dt.DataType.BFLOAT16

NORM_SHAPES = [(16384, 4096), (4096, 8192), (65536, 1024)]
#: (label, M, N, K)
MATMUL_SHAPES = [
    ("llama-7b mlp up, decode", 1, 11008, 4096),
    ("llama-7b mlp up, decode", 16, 11008, 4096),
    ("llama-7b mlp down, decode", 32, 4096, 11008),
    ("bert-base ffn1 (32x256 tokens)", 8192, 3072, 768),
    ("bert-large ffn1 (8x512 tokens)", 4096, 4096, 1024),
    ("llama-7b mlp up, prefill", 2048, 11008, 4096),
    ("llama-3-70b mlp up, prefill", 2048, 28672, 4096),
]
QUICK_NORMS = [(16384, 4096)]
QUICK_MATMULS = [MATMUL_SHAPES[1], MATMUL_SHAPES[4]]


def time_ms(fn: Callable[[], object], samples: int = 25, min_sample_ms: float = 1.0) -> dict:
    """Median per-call milliseconds over ``samples`` event pairs of back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    repeats = max(1, min(200, math.ceil(min_sample_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    median = statistics.median(times)
    cov = statistics.pstdev(times) / statistics.mean(times)
    return {"median_ms": median, "min_ms": min(times), "cov": cov, "repeats": repeats}


def copy_bandwidth_gbps() -> dict:
    n = 512 * 1024 * 1024  # 1 GiB of bf16 each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src), samples=15, min_sample_ms=5.0)
    return {"bytes": 2 * n * 2, **t, "gbps": 2 * n * 2 / t["median_ms"] / 1e6}


def build(engine: Any, graph: dt.Graph, handle: dt.Handle) -> tuple[Any, float]:
    start = time.perf_counter()
    plan = engine.compile(graph, [KnobSetting("global.benchmarking", 1)], handle)
    return plan, time.perf_counter() - start


def norm_graph(op: str, m: int, n: int) -> dt.Graph:
    g = dt.Graph(name=f"{op}_{m}x{n}", io_data_type=BF16, compute_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [m, n])
    w = g.tensor("W", [1, n])
    if op == "layernorm":
        y = g.layernorm(x, w, g.tensor("B", [1, n]), 1e-5, normalized_dim_count=1)[0]
    else:
        y = g.rmsnorm(x, w, 1e-6, normalized_dim_count=1)[0]
    y.set_output(True)
    g.validate()
    return g


def mm_graph(m: int, n: int, k: int) -> dt.Graph:
    g = dt.Graph(
        name=f"mm_bias_gelu_{m}x{n}x{k}",
        io_data_type=BF16,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    y = g.matmul(g.tensor("A", [m, k]), g.tensor("B", [k, n]))
    y = g.pointwise(y, g.tensor("bias", [1, n]), mode=P.ADD)
    y = g.pointwise(y, mode=P.GELU_FWD)
    y.set_output(True)
    g.validate()
    return g


def workspace(plan: Any) -> torch.Tensor | None:
    size = plan.workspace_size
    return torch.empty(size, dtype=torch.uint8, device="cuda") if size else None


def bench_norms(engine: Any, handle: dt.Handle, shapes: list[tuple[int, int]], copy: dict) -> list:
    rows = []
    for m, n in shapes:
        for op in ("rmsnorm", "layernorm"):
            g = norm_graph(op, m, n)
            plan, build_s = build(engine, g, handle)
            pack = make_inputs(g, "cuda", seed=0)
            uid = {t.name: t.uid for t in g.tensors}
            x, w = pack[uid["X"]], pack[uid["W"]].reshape(n)
            y = pack[g.output_tensors()[0].uid]
            ws = workspace(plan)
            if op == "rmsnorm":

                def eager(x=x, w=w, n=n) -> torch.Tensor:
                    return F.rms_norm(x, (n,), w, 1e-6)
            else:
                b = pack[uid["B"]].reshape(n)

                def eager(x=x, w=w, b=b, n=n) -> torch.Tensor:
                    return F.layer_norm(x, (n,), w, b, 1e-5)

            plan.execute(pack, ws)
            torch.cuda.synchronize()
            err = (y.float() - eager().float()).abs().max().item()
            assert err < 0.1, f"{op} {m}x{n}: max abs error {err} against eager"
            moved = 2 * m * n * 2  # read x, write y (bf16); weights are noise
            t_triton = time_ms(lambda plan=plan, pack=pack, ws=ws: plan.execute(pack, ws))
            t_eager = time_ms(eager)
            t_copy = time_ms(lambda x=x, y=y: y.copy_(x))  # the same bytes, no arithmetic
            row = {
                "op": op,
                "shape": [m, n],
                "config": plan.metadata.get("config"),
                "build_s": build_s,
                "triton_ms": t_triton["median_ms"],
                "triton_cov": t_triton["cov"],
                "eager_ms": t_eager["median_ms"],
                "triton_gbps": moved / t_triton["median_ms"] / 1e6,
                "eager_gbps": moved / t_eager["median_ms"] / 1e6,
                "max_abs_err_vs_eager": err,
                "same_size_copy_gbps": moved / t_copy["median_ms"] / 1e6,
            }
            row["triton_pct_same_size_copy"] = 100 * row["triton_gbps"] / row["same_size_copy_gbps"]
            row["triton_pct_copy"] = 100 * row["triton_gbps"] / copy["gbps"]
            row["eager_pct_copy"] = 100 * row["eager_gbps"] / copy["gbps"]
            rows.append(row)
            print(
                f"# {op} {m}x{n}: {row['triton_gbps']:.0f} GB/s ({row['triton_pct_copy']:.1f}%"
                f" of copy) vs eager {row['eager_gbps']:.0f}; {plan.metadata.get('config')}",
                flush=True,
            )
    return rows


def bench_matmuls(engine: Any, handle: dt.Handle, shapes: list, with_compile: bool) -> list:
    rows = []
    for label, m, n, k in shapes:
        g = mm_graph(m, n, k)
        plan, build_s = build(engine, g, handle)
        pack = make_inputs(g, "cuda", seed=0)
        uid = {t.name: t.uid for t in g.tensors}
        a, b, bias = pack[uid["A"]], pack[uid["B"]], pack[uid["bias"]]
        y = pack[g.output_tensors()[0].uid]
        ws = workspace(plan)

        def eager(a=a, b=b, bias=bias) -> torch.Tensor:
            return F.gelu((a @ b) + bias)

        plan.execute(pack, ws)
        torch.cuda.synchronize()
        ref = eager().float()
        err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        assert err < 0.05, f"{label}: relative error {err} against eager"
        t_triton = time_ms(lambda plan=plan, pack=pack, ws=ws: plan.execute(pack, ws))
        t_eager = time_ms(eager)
        row = {
            "label": label,
            "shape": [m, n, k],
            "config": plan.metadata.get("config"),
            "build_s": build_s,
            "searched": plan.metadata.get("searched_candidates"),
            "triton_ms": t_triton["median_ms"],
            "triton_cov": t_triton["cov"],
            "eager_ms": t_eager["median_ms"],
            "speedup_vs_eager": t_eager["median_ms"] / t_triton["median_ms"],
            "triton_tflops": 2 * m * n * k / t_triton["median_ms"] / 1e9,
            "rel_err_vs_eager": err,
        }
        if with_compile:
            compiled = torch.compile(eager, mode="max-autotune-no-cudagraphs")
            start = time.perf_counter()
            compiled()
            row["compile_s"] = time.perf_counter() - start
            row["max_autotune_ms"] = time_ms(compiled)["median_ms"]
        rows.append(row)
        print(
            f"# {label} {m}x{n}x{k}: triton {row['triton_ms']:.4f} ms vs eager "
            f"{row['eager_ms']:.4f} ms ({row['speedup_vs_eager']:.2f}x); {row['config']}",
            flush=True,
        )
    return rows


def bench_overhead(engine: Any, handle: dt.Handle) -> dict:
    """Per-call cost of a tiny fused pointwise plan (host-bound) against one eager op."""
    g = dt.Graph(name="tiny_add", io_data_type=BF16, compute_data_type=dt.DataType.FLOAT)
    y = g.pointwise(g.tensor("X", [1, 1024]), g.tensor("Y", [1, 1024]), mode=P.ADD)
    y.set_output(True)
    g.validate()
    plan = engine.compile(g, [], handle)
    pack = make_inputs(g, "cuda", seed=0)
    uid = {t.name: t.uid for t in g.tensors}
    x, yy, out = pack[uid["X"]], pack[uid["Y"]], pack[g.output_tensors()[0].uid]
    triton_us = 1e3 * time_ms(lambda: plan.execute(pack, None))["median_ms"]
    eager_us = 1e3 * time_ms(lambda: torch.add(x, yy, out=out))["median_ms"]
    print(
        f"# tiny pointwise plan: {triton_us:.1f} us per call; eager torch.add {eager_us:.1f} us",
        flush=True,
    )
    return {"triton_execute_us": triton_us, "eager_add_us": eager_us}


def report(copy: dict, norms: list, mms: list) -> None:
    print(f"\nCopy bandwidth (1 GiB bf16 dst.copy_(src)): {copy['gbps']:.0f} GB/s\n")
    if norms:
        print(
            "| op | shape | TRITON GB/s | % of copy | eager GB/s | % of copy | same-size copy "
            "GB/s | TRITON % of it | TRITON ms | eager ms | config |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in norms:
            cfg = r["config"]
            print(
                f"| {r['op']} | {r['shape'][0]}x{r['shape'][1]} | {r['triton_gbps']:.0f} | "
                f"{r['triton_pct_copy']:.1f}% | {r['eager_gbps']:.0f} | {r['eager_pct_copy']:.1f}%"
                f" | {r['same_size_copy_gbps']:.0f} | {r['triton_pct_same_size_copy']:.1f}%"
                f" | {r['triton_ms']:.4f} | {r['eager_ms']:.4f} | "
                f"m{cfg['block_m']} n{cfg['block_n']} w{cfg['num_warps']} |"
            )
    if mms:
        print(
            "\n| shape (M x N x K) | workload | TRITON ms | eager ms | speedup | TFLOP/s | "
            "max-autotune ms | config |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in mms:
            c = r["config"]
            cfg = (
                f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} "
                f"s{c['num_stages']} sk{c['split_k']}"
            )
            mat = f"{r['max_autotune_ms']:.4f}" if "max_autotune_ms" in r else "-"
            m, n, k = r["shape"]
            print(
                f"| {m}x{n}x{k} | {r['label']} | {r['triton_ms']:.4f} | {r['eager_ms']:.4f} | "
                f"{r['speedup_vs_eager']:.2f}x | {r['triton_tflops']:.0f} | {mat} | {cfg} |"
            )
        geo = math.exp(statistics.mean(math.log(r["speedup_vs_eager"]) for r in mms))
        print(f"\nGeomean speedup of fused matmul+bias+gelu over eager: {geo:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every number to this file")
    parser.add_argument("--quick", action="store_true", help="one norm and two matmul shapes")
    parser.add_argument("--compile", action="store_true", help="also torch.compile max-autotune")
    parser.add_argument("--skip-norms", action="store_true")
    parser.add_argument("--skip-matmuls", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("DNNTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="dnntune-bench-"))
    handle = dt.create_handle("cuda")
    engine = get_registry().get("TRITON_ENGINE")
    overhead = bench_overhead(engine, handle)
    copy = copy_bandwidth_gbps()
    print(f"# copy bandwidth {copy['gbps']:.0f} GB/s", flush=True)
    norms = (
        []
        if args.skip_norms
        else bench_norms(engine, handle, QUICK_NORMS if args.quick else NORM_SHAPES, copy)
    )
    mms = (
        []
        if args.skip_matmuls
        else bench_matmuls(
            engine, handle, QUICK_MATMULS if args.quick else MATMUL_SHAPES, args.compile
        )
    )
    report(copy, norms, mms)
    if args.json:
        import triton

        env = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "dnntune": dt.__version__,
        }
        with open(args.json, "w") as f:
            out = {"env": env, "copy": copy, "overhead": overhead, "norms": norms, "matmuls": mms}
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
