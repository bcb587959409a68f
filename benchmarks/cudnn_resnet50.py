"""ResNet-50 conv+bias+relu layers, fp16 NHWC: PyTorch eager vs CUDNN_ENGINE (heuristic, tuned).

For each layer shape (batch 32 by default) the same input, weight, bias and output buffers are
timed three ways:

* ``eager``: ``torch.relu(F.conv2d(x, w, stride=s, padding=p) + b.view(1, -1, 1, 1))`` on
  channels_last tensors, the three ops as a user writes them (and again with
  ``torch.backends.cudnn.benchmark = True``);
* ``heuristic``: CUDNN_ENGINE with ``cudnn.engine_config = -1``, the fused cuDNN graph on the
  plan cuDNN's heuristics rank first (built with an empty find db, so it is the heuristic's
  choice and not a remembered one);
* ``tuned``: CUDNN_ENGINE with ``global.benchmarking = 1``: the engine builds every plan of
  cuDNN's list, times them, keeps the fastest (and records it in its find db).

Every column is timed by the same harness: CUDA events around ``--inner`` back-to-back calls,
``--warmup`` calls first, median of ``--samples`` samples (min and coefficient of variation
kept). The CUDNN_ENGINE columns call ``plan.execute`` (what ``Graph.execute`` runs after checking
the variant pack); ``tuned_graph_ms`` times ``Graph.execute`` itself. Each tuned output is
checked against eager's.

Writes a markdown table to stdout and JSON to ``$OUT/cudnn_resnet50.json`` (or ``--out``).
Run: ``PYTHONPATH=src python benchmarks/cudnn_resnet50.py``. Needs a CUDA GPU and
nvidia-cudnn-frontend.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: (name, N, C, H=W, K, R=S, stride, pad); N is replaced by --batch
LAYERS: list[tuple[str, int, int, int, int, int, int, int]] = [
    # the two conv+bias+relu graphs of examples/graphs/, at their source shapes
    ("res2a_branch2b 3x3 (examples)", 32, 64, 56, 64, 3, 1, 1),
    ("res3a_branch2a 1x1 s2 (examples)", 32, 256, 56, 128, 1, 2, 0),
    # more ResNet-50 layers
    ("res2a_branch2a 1x1", 32, 64, 56, 64, 1, 1, 0),
    ("res2a_branch2c 1x1", 32, 64, 56, 256, 1, 1, 0),
    ("res2b_branch2a 1x1", 32, 256, 56, 64, 1, 1, 0),
    ("res3a_branch2b 3x3", 32, 128, 28, 128, 3, 1, 1),
    ("res3a_branch2c 1x1", 32, 128, 28, 512, 1, 1, 0),
    ("res4a_branch2b 3x3", 32, 256, 14, 256, 3, 1, 1),
    ("res4b_branch2a 1x1", 32, 1024, 14, 256, 1, 1, 0),
    ("res5a_branch2b 3x3", 32, 512, 7, 512, 3, 1, 1),
    ("res5a_branch2c 1x1", 32, 512, 7, 2048, 1, 1, 0),
]


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    cov: float


@dataclass
class Row:
    layer: str
    shape: list[int]
    eager_ms: float
    eager_benchmark_ms: float
    heuristic_ms: float
    tuned_ms: float
    tuned_graph_ms: float
    tuned_vs_eager: float
    heuristic_vs_eager: float
    tuned_vs_heuristic: float
    plans: int
    plans_timed: int
    search_s: float
    heuristic_plan: str
    tuned_plan: str
    max_abs_diff_vs_eager: float
    eager_cov: float
    heuristic_cov: float
    tuned_cov: float


def time_it(fn: Callable[[], object], warmup: int, samples: int, inner: int) -> Timing:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    mean = statistics.fmean(times)
    return Timing(statistics.median(times), min(times), statistics.pstdev(times) / mean)


def bench_layer(
    spec: tuple[str, int, int, int, int, int, int, int], args: argparse.Namespace
) -> Row:
    import torch
    import torch.nn.functional as F

    import dnntune as dt

    name, _, c, hw, k, r, stride, pad = spec
    n = args.batch
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, c, hw, hw, generator=gen).half().cuda()
    x = x.to(memory_format=torch.channels_last)
    w = (torch.randn(k, c, r, r, generator=gen) / math.sqrt(c * r * r)).half().cuda()
    w = w.to(memory_format=torch.channels_last)
    b = torch.randn(k, generator=gen).half().cuda()
    b4 = b.view(1, k, 1, 1)

    def eager() -> torch.Tensor:
        return torch.relu(F.conv2d(x, w, stride=stride, padding=pad) + b4)

    expected = eager()
    out = torch.empty_like(expected, memory_format=torch.channels_last)

    g = dt.Graph(
        name=f"resnet50_{name.split()[0]}",
        io_data_type=dt.DataType.HALF,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    tx, tw, tb = g.tensor_like(x, "X"), g.tensor_like(w, "W"), g.tensor_like(b4, "B")
    y = g.conv_fprop(tx, tw, padding=pad, stride=stride)
    y = g.pointwise(y, tb, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    assert y.strides == list(out.stride()), (y.strides, out.stride())
    pack: dict[int, torch.Tensor] = {}
    for t, buf in ((tx, x), (tw, w), (tb, b4), (y, out)):
        assert t.uid is not None
        pack[t.uid] = buf
    handle = dt.create_handle("cuda")
    engine = dt.get_registry().get("CUDNN_ENGINE")

    heur = engine.compile(g, [dt.KnobSetting("cudnn.engine_config", -1)], handle)
    assert heur.metadata["selection"] == "heuristic", heur.metadata["selection"]
    start = time.perf_counter()
    tuned = engine.compile(g, [dt.KnobSetting("global.benchmarking", 1)], handle)
    search_s = time.perf_counter() - start
    ws = torch.empty(
        max(heur.workspace_size, tuned.workspace_size, 1), dtype=torch.uint8, device="cuda"
    )

    tuned.execute(pack, ws)
    torch.cuda.synchronize()
    diff = float((out.float() - expected.float()).abs().max())
    if diff > args.max_diff:
        raise SystemExit(f"{name}: tuned output differs from eager by {diff}")

    def run_heur() -> None:
        heur.execute(pack, ws)

    def run_tuned() -> None:
        tuned.execute(pack, ws)

    g.build_operation_graph(handle)
    g.create_execution_plan_ext("CUDNN_ENGINE", {"cudnn.engine_config": -1})
    g.build_plans()  # a find-db hit now: the tuned plan, run through Graph.execute
    assert g.active_plan is not None
    assert g.active_plan.metadata["cudnn_plan_name"] == tuned.metadata["cudnn_plan_name"]

    def run_graph() -> None:
        g.execute(handle, pack, ws)

    cfg = {"w": args.warmup, "s": args.samples, "i": args.inner}
    torch.backends.cudnn.benchmark = False
    t_eager = time_it(eager, cfg["w"], cfg["s"], cfg["i"])
    torch.backends.cudnn.benchmark = True
    t_eager_b = time_it(eager, cfg["w"], cfg["s"], cfg["i"])
    torch.backends.cudnn.benchmark = False
    t_heur = time_it(run_heur, cfg["w"], cfg["s"], cfg["i"])
    t_tuned = time_it(run_tuned, cfg["w"], cfg["s"], cfg["i"])
    t_graph = time_it(run_graph, cfg["w"], cfg["s"], cfg["i"])
    timed = [s for s in tuned.metadata.get("search", []) if s["median_ms"] is not None]
    return Row(
        layer=name,
        shape=[n, c, hw, hw, k, r, stride, pad],
        eager_ms=t_eager.median_ms,
        eager_benchmark_ms=t_eager_b.median_ms,
        heuristic_ms=t_heur.median_ms,
        tuned_ms=t_tuned.median_ms,
        tuned_graph_ms=t_graph.median_ms,
        tuned_vs_eager=t_eager.median_ms / t_tuned.median_ms,
        heuristic_vs_eager=t_eager.median_ms / t_heur.median_ms,
        tuned_vs_heuristic=t_heur.median_ms / t_tuned.median_ms,
        plans=int(tuned.metadata["cudnn_distinct_plans"]),
        plans_timed=len(timed),
        search_s=search_s,
        heuristic_plan=str(heur.metadata["cudnn_plan_name"]),
        tuned_plan=str(tuned.metadata["cudnn_plan_name"]),
        max_abs_diff_vs_eager=diff,
        eager_cov=t_eager.cov,
        heuristic_cov=t_heur.cov,
        tuned_cov=t_tuned.cov,
    )


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def markdown(rows: list[Row], env: dict[str, Any]) -> str:
    lines = [
        f"CUDNN_ENGINE vs PyTorch eager, fp16 NHWC conv+bias+relu, batch {rows[0].shape[0]} "
        f"({env['device']}, torch {env['torch']}, cuDNN {env['cudnn_backend']}, "
        f"cudnn-frontend {env['cudnn_frontend']}); median ms",
        "",
        "| layer | C>K RxR/s | eager | eager+bench | cuDNN heur | cuDNN tuned | tuned via "
        "Graph.execute | tuned/eager | heur/eager | tuned/heur | plans timed | search s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        _, c, hw, _, k, rr, s, _ = r.shape
        lines.append(
            f"| {r.layer} | {c}>{k} {rr}x{rr}/{s} @{hw} | {r.eager_ms:.4f} | "
            f"{r.eager_benchmark_ms:.4f} | {r.heuristic_ms:.4f} | {r.tuned_ms:.4f} | "
            f"{r.tuned_graph_ms:.4f} | {r.tuned_vs_eager:.2f}x | {r.heuristic_vs_eager:.2f}x | "
            f"{r.tuned_vs_heuristic:.2f}x | {r.plans_timed}/{r.plans} | {r.search_s:.2f} |"
        )
    lines.append(
        f"| **geomean** | | | | | | | **{geomean([r.tuned_vs_eager for r in rows]):.2f}x** | "
        f"{geomean([r.heuristic_vs_eager for r in rows]):.2f}x | "
        f"{geomean([r.tuned_vs_heuristic for r in rows]):.2f}x | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--inner", type=int, default=5, help="back-to-back calls per sample")
    parser.add_argument(
        "--max-diff",
        type=float,
        default=0.05,
        help="largest tolerated |tuned - eager| (fp16 outputs)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--layers", type=int, default=len(LAYERS), help="first N layers only")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    # An empty find db, so that the heuristic column is cuDNN's heuristic choice.
    os.environ["DNNTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnntune-bench-")
    # the cuDNN library versions the engine loaded (no public name: provider-specific)
    from dnntune.providers.cudnn._runtime import versions

    env = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        **versions(),
        "batch": args.batch,
        "warmup": args.warmup,
        "samples": args.samples,
        "inner": args.inner,
    }
    rows = []
    for spec in LAYERS[: args.layers]:
        rows.append(bench_layer(spec, args))
        print(
            f"# {rows[-1].layer}: tuned {rows[-1].tuned_vs_eager:.2f}x eager",
            file=sys.stderr,
            flush=True,
        )
    print(markdown(rows, env))
    result = {
        "env": env,
        "rows": [asdict(r) for r in rows],
        "geomean_tuned_vs_eager": geomean([r.tuned_vs_eager for r in rows]),
        "geomean_heuristic_vs_eager": geomean([r.heuristic_vs_eager for r in rows]),
        "geomean_tuned_vs_heuristic": geomean([r.tuned_vs_heuristic for r in rows]),
    }
    out = args.out or Path(os.environ.get("OUT", ".")) / "cudnn_resnet50.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
