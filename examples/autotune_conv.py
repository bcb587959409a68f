"""Autotune a convolution graph: try every applicable engine, keep the fastest verified one.

    python examples/autotune_conv.py [graph.json] [--overrides overrides.json]

Follows RFC 0013's plan-spec path: build the operation graph, add every engine as a plan spec
(nothing is compiled yet), autotune with a variant pack, then execute the winner. With
``--overrides`` the winner is also written to an engine-override file that the next run's
heuristics read, so the next process picks it without tuning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import dnntune as dt

DEFAULT_GRAPH = Path(__file__).resolve().parent / "graphs" / "resnet50_conv3x3_bias_relu_nchw.json"


def random_pack(g: dt.Graph, device: str) -> dict[dt.TensorAttributes, torch.Tensor]:
    """A buffer for every non-virtual tensor, with the graph's dims, strides and dtype."""
    pack = {}
    for t in g.io_tensors():
        assert t.data_type is not None
        storage = torch.empty(t.storage_size(), dtype=t.data_type.to_torch(), device=device)
        buf = torch.as_strided(storage, t.dims, t.strides)
        if t in g.input_tensors():
            buf.copy_(torch.randn(t.dims, device=device))
        pack[t] = buf
    return pack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", type=Path, default=DEFAULT_GRAPH)
    parser.add_argument("--overrides", type=Path, help="engine-override file to write")
    parser.add_argument("--exhaustive", action="store_true", help="let engines search too")
    args = parser.parse_args(argv)

    handle = dt.create_handle()  # "cuda" if available, else "cpu"
    g = dt.Graph.load(args.graph)
    g.build_operation_graph(handle)
    g.add_all_engines()
    ws_bytes = g.get_estimated_max_workspace_size()
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=handle.device) if ws_bytes else None
    pack = random_pack(g, str(handle.device))

    mode = dt.TuneMode.EXHAUSTIVE if args.exhaustive else dt.TuneMode.STANDARD
    storage = dt.AutotuneStorageConfig(file_path=str(args.overrides)) if args.overrides else None
    results = g.autotune(
        handle,
        pack,
        workspace,
        workspace_size=ws_bytes,
        config=dt.AutotuneConfig(mode=mode),
        storage_config=storage,
    )
    for r in sorted(results, key=lambda r: (not r.succeeded, r.rank)):
        status = f"rank {r.rank}: {r.min_time_ms:.4f} ms" if r.succeeded else r.error_message
        print(f"{r.engine_name:24s} {status}")
    g.execute(handle, pack, workspace)  # runs the winner
    print(f"winner: {g.get_plan_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
