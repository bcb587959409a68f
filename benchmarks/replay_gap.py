"""Why ``optimize(cuda_graph="auto")``'s replay of PyTorch's own forward reads slower than a
plain ``torch.cuda.graph`` capture of the same forward (issue 23: llama_decode 6 %, vit and
llama_prefill 3-4 %, session 14).

For each model (``_models_zoo``, real model code, random weights), in one process, timed side
by side in interleaved rounds (``_models_run._interleaved``):

* ``plain``: the models benchmark's own capture (``_models_run._eager_graph``);
* ``plain_ws``: the same capture with dnntune's recording steps around it (its side stream and
  ``own_cublas_workspace``): isolates what the recording recipe does to the graph;
* ``installed``: ``dnntune.torch.cuda_graphs.install`` on a copy, called as a user calls it:
  what "pytorch+cuda_graph" runs (checks, input copies, the replay, output clones);
* ``installed_bare``: that installed module's recorded graph, its inputs copied and replayed
  with no checks and no clone: the graph itself.

Then the host cost of one ``installed`` call (cProfile, 200 calls), and the kernels each graph
runs (``torch.profiler`` over a few replays: count and total µs per kernel name), written as
JSON and a short text table under ``--out``.

    PYTHONPATH=src:benchmarks python benchmarks/replay_gap.py --models llama_decode,vit_b16
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _models_run import Context, _eager_graph, _interleaved, _sync
from _models_zoo import SPECS, make_setting
from graph_kernels import kernels as _kernels
from torch.utils._pytree import tree_flatten

from dnntune.torch import _tags
from dnntune.torch._capture import own_cublas_workspace
from dnntune.torch._graph_state import Capture
from dnntune.torch._recorded import signature
from dnntune.torch.cuda_graphs import graphs_of, install


def _plain_ws(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    static = [t.clone() for t in inputs]
    device = static[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            model(*static)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with own_cublas_workspace(), torch.cuda.graph(graph, stream=side):
        out = model(*static)

    def replay() -> Any:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        graph.replay()
        return out

    return replay, graph


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _host_cost_study(plain: Any, alternate: Any) -> dict[str, Any]:
    """Does host time between replays cost GPU time? ``plain`` with a busy wait of 50 and 200
    µs before each call (no CUDA call in it), and two separate captures called in turn (a
    graph exec launched again while its last launch runs may wait for it)."""
    out: dict[str, Any] = {}
    for us in (50.0, 200.0):
        out[f"plain_spin{us:.0f}"] = lambda us=us: (_spin(us), plain())[1]
    out["alternate"] = alternate
    out["alternate_spin200"] = lambda: (_spin(200.0), alternate())[1]
    return out


def _back_to_back_us(fn: Any, s: Any, calls: int = 30) -> float:
    """Median host µs of one call among ``calls`` back to back (no sync between): near the
    GPU's time per call when the launch waits for the GPU."""
    _sync(s)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    _sync(s)
    return statistics.median(times[5:])


def _installed(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, Any]:
    copied = copy.deepcopy(model)
    install(copied)
    copied(*inputs)  # records
    captures = [c for c in graphs_of(copied).captures.values() if isinstance(c, Capture)]
    if not captures:
        raise RuntimeError("the installed copy recorded nothing")
    capture = captures[-1]

    def bare() -> Any:
        for dst, src in zip(capture.static_inputs, inputs, strict=True):
            dst.copy_(src)
        capture.graph.replay()
        return capture.static_output

    def bare_clone() -> Any:
        bare()
        return capture.output()

    def bare_checks() -> Any:
        capture.weights.unchanged()
        return bare()

    def bare_signature() -> Any:
        flat, spec = tree_flatten(((*inputs,), {}))
        signature(flat, spec)
        return bare()

    weights = capture.weights
    _installed.diagnosis = {  # type: ignore[attr-defined]
        "modules": len(list(copied.modules())),
        "weights_unchanged_us": _loop_us(weights.unchanged),
        "plain_unchanged_us": _loop_us(weights._plain.unchanged),
        "tags": getattr(_tags.tag_reader(), "__name__", None),
        "attr_tags_hold": weights._plain._tags is not None
        and weights._plain._attr_versions == weights._plain._tags(weights._plain._attr_dicts),
        "slot_tags_hold": weights._tags is not None
        and weights._slot_versions == weights._tags(weights._slots),
        "hook_id_holds": weights._plain._hook_id == _tags.hook_id(),
        "pieces_us": _pieces_us(weights),
    }
    parts = {"bare_clone": bare_clone, "bare_checks": bare_checks}
    parts["bare_signature"] = bare_signature
    return (lambda: copied(*inputs)), (bare, parts)


def _pieces_us(weights: Any) -> dict[str, Any]:
    """What each step of ``Weights.unchanged`` costs here (µs per call), and what it walks."""
    from dnntune.torch import _recorded

    plain = weights._plain
    tags = weights._tags or (lambda d: None)
    ptr = torch.Tensor.data_ptr
    boxes = collections.Counter(type(b).__name__ for b in plain._boxes)
    return {
        "slot_dicts": len(weights._slots),
        "cuda_tensors": len(weights._tensors),
        "attr_dicts": len(plain._attr_dicts),
        "hooked_dicts": len(plain._hooked),
        "boxes": dict(boxes),
        "slot_tags": _loop_us(lambda: tags(weights._slots)),
        "data_ptrs": _loop_us(lambda: tuple(map(ptr, weights._tensors))),
        "pointers": _loop_us(weights._read_pointers),
        "hooks": _loop_us(lambda: tuple(map(tuple, plain._hooked))),
        "attr_tags": _loop_us(lambda: tags(plain._attr_dicts)),
        "box_contents": _loop_us(lambda: tuple(map(_recorded._contents, plain._boxes))),
        "hook_id": _loop_us(_tags.hook_id),
    }


def _loop_us(fn: Any, calls: int = 2000) -> float:
    """Best of 5 loops: µs per call of ``fn`` (host only)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / calls)
    return best


def _host_us(fn: Any, s: Any, calls: int = 40) -> float:
    """Median host µs of one call started on an idle GPU (nothing blocks it)."""
    times = []
    for _ in range(calls):
        _sync(s)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    _sync(s)
    return statistics.median(times)


def _host_profile(fn: Any, s: Any, calls: int = 200) -> str:
    fn()
    _sync(s)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    _sync(s)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    return text.getvalue()


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    s = make_setting(args)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    with s.device:
        w = SPECS[name].build(s)
    ctx = Context(s, args, Path(args.out) / "unused.json")
    row: dict[str, Any] = {"model": name}
    with torch.no_grad():
        w.model(*w.inputs)
        fns: dict[str, Any] = {"plain": _eager_graph(w, ctx).fn}
        plain_ws, _ = _plain_ws(w.model, w.inputs)
        fns["plain_ws"] = plain_ws
        if args.study:
            second = _eager_graph(w, ctx).fn
            turn = [0]

            def alternate() -> Any:
                turn[0] ^= 1
                return (fns["plain"] if turn[0] else second)()

            fns |= _host_cost_study(fns["plain"], alternate)
        installed, (bare, parts) = _installed(w.model, w.inputs)
        fns["installed"] = installed
        fns["installed_bare"] = bare
        fns |= parts
        samples, failed = _interleaved(fns, s, args.warmup_s, args.rounds)
        medians = {k: statistics.median(v) for k, v in samples.items()}
        row["median_ms"] = medians
        row["ratio_to_plain"] = {k: medians["plain"] / v for k, v in medians.items()}
        row["failed"] = failed
        row["host_us"] = {k: _host_us(fn, s) for k, fn in fns.items()}
        row["back_to_back_us"] = {k: _back_to_back_us(fn, s) for k, fn in fns.items()}
        row["checks"] = getattr(_installed, "diagnosis", {})
        row["graph_nodes"] = {}
        with contextlib.suppress(Exception):
            row["kernels"] = {k: _kernels(fns[k], s) for k in ("plain", "installed_bare")}
        row["host_profile_installed"] = _host_profile(installed, s)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="llama_decode,vit_b16,llama_prefill,whisper_encoder")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--study", action="store_true", help="also time the plain capture with host busy waits"
    )
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--warmup-s", type=float, default=0.3)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        try:
            row = run(name, args)
        except Exception as exc:  # one model's failure is data
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        rows.append(row)
        ratios = row.get("ratio_to_plain", {})
        print(name, {k: round(v, 4) for k, v in ratios.items()}, row.get("error", ""), flush=True)
        print("  host µs per call:", {k: round(v, 1) for k, v in row.get("host_us", {}).items()})
        print(
            "  back to back µs per call:",
            {k: round(v, 1) for k, v in row.get("back_to_back_us", {}).items()},
        )
        print("  checks:", row.get("checks"))
        kernels = row.get("kernels")
        if kernels:
            plain, bare = kernels["plain"], kernels["installed_bare"]
            names = sorted(
                set(plain) | set(bare),
                key=lambda n: -abs(bare.get(n, [0, 0])[1] - plain.get(n, [0, 0])[1]),
            )
            print("  kernel diffs (count, µs per call: plain -> installed):")
            for n in names[:12]:
                a, b = plain.get(n, [0, 0]), bare.get(n, [0, 0])
                print(f"    {a[0]:.0f}/{a[1]:.1f} -> {b[0]:.0f}/{b[1]:.1f}  {n[:90]}")
            print("  total µs", sum(v[1] for v in plain.values()), sum(v[1] for v in bare.values()))
        Path(args.out, "replay_gap.json").write_text(json.dumps(rows, indent=1, default=str))
    for row in rows:
        print(f"==== host profile of installed: {row['model']}")
        print("\n".join(str(row.get("host_profile_installed", "")).splitlines()[:45]))


if __name__ == "__main__":
    main()
