"""Patch embeddings (a convolution whose stride equals its filter) as PyTorch runs them and as
one GEMM over the gathered patches (TORCH_ENGINE's ``torch.conv_as_gemm``).

Writes each case as a dnntune graph file into ``--graphs`` (for ``dnntune tune -g``), and on a
CUDA device times, side by side in interleaved rounds (each variant's burst of calls recorded
as a CUDA graph, replays timed with CUDA events, the median per call: device time, as a model
replay runs it; ``torch.backends.cudnn.benchmark`` on, as the model benchmarks run):

* ``conv``: ``F.conv2d`` on the NCHW input (what the model's ``nn.Conv2d`` runs);
* ``conv_nhwc``: the same on a channels-last copy made beforehand (the copy not timed);
* ``gemm``: :func:`dnntune.providers._torch.conv.patch_conv` on the NCHW input, its result
  copied into an NCHW buffer (what the engine's plan writes).

Usage (device)::

    PYTHONPATH=src:benchmarks python benchmarks/patch_embed.py --graphs /tmp/patch
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import dnntune as dt
from dnntune.providers._torch.conv import patch_conv

#: name: (batch, in channels, image, out channels, patch, bias)
CASES: dict[str, tuple[int, int, int, int, int, bool]] = {
    "vit_b16": (32, 3, 224, 768, 16, True),
    "clip_b16": (32, 3, 224, 768, 16, False),
    "vit_b32": (32, 3, 224, 768, 32, True),
    "swin_convnext_stem": (32, 3, 224, 96, 4, True),
    "convnext_down": (32, 96, 56, 192, 2, True),
}


def write_graph(folder: Path, name: str, dtype: dt.DataType) -> None:
    n, c, hw, o, p, bias = CASES[name]
    g = dt.Graph(
        name=f"patch_{name}",
        io_data_type=dtype,
        intermediate_data_type=dt.DataType.FLOAT,
        compute_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[n, c, hw, hw], data_type=dtype)
    w = g.tensor(name="W", dims=[o, c, p, p], data_type=dtype)
    y = g.conv_fprop(x, w, padding=0, stride=p, dilation=1)
    if bias:
        y = g.pointwise(
            y, g.tensor(name="B", dims=[1, o, 1, 1], data_type=dtype), mode=dt.PointwiseMode.ADD
        )
    y.set_output(True)
    y.set_data_type(dtype)
    g.validate()
    g.save(folder / f"patch_{name}.json")


def _captured(fn: Callable[[], object], burst: int) -> torch.cuda.CUDAGraph:
    """``burst`` calls of ``fn`` recorded as one CUDA graph: a replay times the device work,
    not the Python around each call (the GEMM path makes eight ATen calls to the conv's one)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(burst):
            fn()
    return graph


def _time(fns: dict[str, Callable[[], object]], rounds: int, burst: int) -> dict[str, float]:
    graphs = {k: _captured(f, burst) for k, f in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[k].replay()
            end.record()
            torch.cuda.synchronize()
            samples[k].append(start.elapsed_time(end) * 1e3 / burst)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure(name: str, dtype: torch.dtype, rounds: int, burst: int) -> str:
    n, c, hw, o, p, bias = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(o, c, p, p, device="cuda", dtype=dtype, generator=gen) / (c * p * p) ** 0.5
    b = torch.randn(o, device="cuda", dtype=dtype, generator=gen) if bias else None
    x_nhwc = x.contiguous(memory_format=torch.channels_last)
    out = torch.empty(n, o, hw // p, hw // p, device="cuda", dtype=dtype)
    stride, zero, one = [p, p], [0, 0], [1, 1]
    fns: dict[str, Callable[[], object]] = {
        "conv": lambda: F.conv2d(x, w, b, p),
        "conv_nhwc": lambda: F.conv2d(x_nhwc, w, b, p),
        "gemm": lambda: out.copy_(patch_conv(x, w, b, stride, zero, one, 1)),
    }
    want = F.conv2d(x.float(), w.float(), None if b is None else b.float(), p)
    got = patch_conv(x, w, b, stride, zero, one, 1).float()
    err = ((got - want).abs().max() / want.abs().max()).item()
    us = _time(fns, rounds, burst)
    cells = " | ".join(f"{us[k]:.1f}" for k in fns)
    ratio = us["conv"] / us["gemm"]
    return f"| {name} | {n}x{c}x{hw}x{hw} -> {o}, {p}x{p} | {cells} | {ratio:.2f}x | {err:.1e} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=Path, default=None, help="write the cases' graph files here")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=int, default=20)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.graphs is not None:
        args.graphs.mkdir(parents=True, exist_ok=True)
        for name in CASES:
            write_graph(args.graphs, name, dt.DataType.from_torch(dtype))
        print(f"wrote {len(CASES)} graph files to {args.graphs}")
    if not torch.cuda.is_available():
        print("no CUDA device: graph files only")
        return
    torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name()
    print(f"{name}, {args.dtype}, device us per call (CUDA-graph replays, median of {args.rounds})")
    print("| case | shape | conv | conv_nhwc | gemm | conv / gemm | gemm rel. err |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in CASES:
        print(measure(name, dtype, args.rounds, args.burst), flush=True)


if __name__ == "__main__":
    main()
