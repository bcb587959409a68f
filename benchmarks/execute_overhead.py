"""Host time per call of every layer of the execute path, per op and per engine.

For each op (conv+bias+act, linear+act, layernorm, rmsnorm, SDPA, pooling) and each engine that
runs it here (CUDNN_ENGINE, TRITON_ENGINE, TORCH_ENGINE on CUDA; TORCH_ENGINE on the CPU), one
call is timed along each of these paths:

* ``pytorch_op``: PyTorch's own functional op(s) (``F.conv2d`` then ``F.relu``, ...);
* ``pytorch_module``: PyTorch's own module (``nn.Sequential(Conv2d, ReLU)``, ``nn.LayerNorm``,
  ...; none for SDPA);
* ``dnntune_op``: the ``dnntune.torch.functional`` op, its plan pinned to the engine;
* ``dnntune_module``: that module after ``dnntune.torch.optimize`` (the conv one is
  Conv2d + BatchNorm2d + ReLU, so its forward includes the batch-norm fold check; SDPA and
  pooling calls are routed from inside an optimized module's forward);
* ``graph_execute``: ``Graph.execute(handle, pack)`` on the graph dnntune.torch built;
* ``plan_execute``: ``Plan.execute(pack, None)`` of its plan;
* ``binding_run``: the bound path ``Graph.execute`` takes after its first call (its pack
  binding's ``run``: the layout guard, the addresses, the plan's bound call), without the
  facade's own checks;
* ``bound_call``: the plan's bound call (:meth:`Plan.bind`) on the tensors in a list;
* ``bound_frontend`` (CUDNN_ENGINE): the same bound call through the frontend's execute (what
  it was before the compiled caller of cuDNN's backend API, ``providers/cudnn/direct.py``);
* ``raw``: the engine's own call, everything else prepared (TORCH_ENGINE: the lowered program
  on positional tensors; CUDNN_ENGINE: the frontend's execute with a prepared pointer pack;
  TRITON_ENGINE: the plan's launcher).

On the CPU, TORCH_ENGINE's default plan is PyTorch's own op, which dnntune.torch then calls
directly; the pseudo-engine ``TORCH_ENGINE*`` pins the same plan but marks it as not eager, so
dnntune.torch takes its kernel path (what a cuDNN or Triton plan goes through) and the
overhead of that path can be measured without a GPU.

Tensors are tiny so that kernel time is negligible: on the CPU a call's time is its host time;
on CUDA ``calls`` calls are queued back to back and timed without a synchronize, so the time
per call is the host submit time (the device is synchronized before each sample, untimed).
Every path of one op and engine is sampled in interleaved rounds; the median per call is
reported (and the minimum, steadier against noise, in the JSON).

Usage::

    python benchmarks/execute_overhead.py [--calls 400] [--rounds 15] [--ops conv,linear]
        [--profile conv:TORCH_ENGINE*:dnntune_op]

Prints a table per device; writes ``$OUT/execute_overhead.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import json
import operator
import os
import platform
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import dnntune as dt
import dnntune.torch as dtt
from dnntune import allocate_workspace, get_registry, reference
from dnntune.torch import runtime

OPS = ("conv", "linear", "layernorm", "rmsnorm", "sdpa", "pool")
PATHS = (
    "pytorch_op",
    "pytorch_module",
    "dnntune_op",
    "dnntune_module",
    "graph_execute",
    "plan_execute",
    "binding_run",
    "bound_call",
    "bound_frontend",
    "raw",
)
#: the pseudo-engine: TORCH_ENGINE's plan, taken through dnntune.torch's kernel path
KERNEL_PATH = "TORCH_ENGINE*"


@dataclass
class Case:
    """One op at one size: its PyTorch call, its PyTorch module, and the tensors."""

    op: str
    pytorch_op: Callable[[], Any]
    dnntune_op: Callable[[], Any]
    module: nn.Module | None
    module_input: tuple[torch.Tensor, ...]
    #: the module dnntune.torch optimizes (None: ``module`` itself, deep-copied)
    optimized_from: nn.Module | None = None


def _case(op: str, device: str, dtype: torch.dtype) -> Case:
    kw: dict[str, Any] = {"device": device, "dtype": dtype}
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(**kw)

    if op == "conv":
        x = rand(1, 8, 8, 8).contiguous(memory_format=torch.channels_last)
        conv = nn.Conv2d(8, 8, 3, padding=1).to(**kw).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        module = nn.Sequential(conv, nn.ReLU()).eval()
        # dnntune's module folds a batch norm: its forward pays the fold check
        folded = nn.Sequential(copy.deepcopy(conv), nn.BatchNorm2d(8).to(**kw), nn.ReLU()).eval()
        w, b = conv.weight.detach(), conv.bias.detach()
        return Case(
            op,
            lambda: F.relu(F.conv2d(x, w, b, 1, 1)),
            lambda: dtt.conv2d(x, w, b, 1, 1, activation="relu"),
            module,
            (x,),
            folded,
        )
    if op == "linear":
        x = rand(8, 64)
        lin = nn.Linear(64, 64).to(**kw)
        w, b = lin.weight.detach(), lin.bias.detach()
        return Case(
            op,
            lambda: F.gelu(F.linear(x, w, b)),
            lambda: dtt.linear(x, w, b, activation="gelu"),
            nn.Sequential(lin, nn.GELU()).eval(),
            (x,),
        )
    if op in ("layernorm", "rmsnorm"):
        x = rand(8, 64)
        if op == "layernorm":
            ln = nn.LayerNorm(64).to(**kw).eval()
            lw, lb = ln.weight.detach(), ln.bias.detach()
            return Case(
                op,
                lambda: F.layer_norm(x, (64,), lw, lb),
                lambda: dtt.layer_norm(x, (64,), lw, lb),
                ln,
                (x,),
            )
        rms = nn.RMSNorm(64, eps=1e-6).to(**kw).eval()
        rw = rms.weight.detach()
        return Case(
            op,
            lambda: F.rms_norm(x, (64,), rw, 1e-6),
            lambda: dtt.rms_norm(x, (64,), rw, 1e-6),
            rms,
            (x,),
        )
    if op == "sdpa":
        q, k, v = rand(1, 2, 16, 32), rand(1, 2, 16, 32), rand(1, 2, 16, 32)
        return Case(
            op,
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: dtt.scaled_dot_product_attention(q, k, v, is_causal=True),
            None,
            (q, k, v),
            _Attention().eval(),
        )
    if op == "pool":
        x = rand(1, 8, 8, 8)
        return Case(
            op,
            lambda: F.max_pool2d(x, 2),
            lambda: dtt.max_pool2d(x, 2),
            nn.MaxPool2d(2).eval(),
            (x,),
        )
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


class _Attention(nn.Module):
    """An optimized model's attention call: ``F.scaled_dot_product_attention``, routed."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---- pinning dnntune.torch to one engine ------------------------------------------------------
@dataclass
class Pinned:
    """What dnntune.torch built while pinned: (graph, handle, plan) per kernel."""

    built: list[tuple[dt.Graph, dt.Handle, Any]] = field(default_factory=list)


@contextlib.contextmanager
def pinned_engine(engine: str) -> Iterator[Pinned]:
    """dnntune.torch's heuristic policy builds ``engine``'s default plan for every call (the
    override file is a path that does not exist, so nothing else is consulted)."""
    record = Pinned()
    name = engine.rstrip("*")
    original = runtime._heuristic

    def build(graph: dt.Graph, handle: dt.Handle) -> Any:
        graph.build_operation_graph(handle)
        graph.create_execution_plan_ext(name)
        graph.check_support()
        graph.build_plans()
        plan = graph.active_plan
        assert plan is not None
        if engine == KERNEL_PATH:
            plan.runs_eager_ops = False  # take dnntune.torch's kernel path, not PyTorch's op
        record.built.append((graph, handle, plan))
        return plan

    with tempfile.TemporaryDirectory() as tmp:
        dtt.configure(policy="heuristic", overrides=str(Path(tmp) / "none.json"))
        runtime.cache().clear()
        runtime._heuristic = build
        try:
            yield record
        finally:
            runtime._heuristic = original
            runtime.cache().clear()


def raw_call(plan: Any, pack: dict[int, torch.Tensor], workspace: Any) -> Callable[[], None]:
    """The engine's own call with everything else prepared (private attributes: a benchmark)."""
    name = plan.engine.name
    if name in ("TORCH_ENGINE", "TORCH_COMPILE_ENGINE"):
        args = tuple(pack[u] for u in plan.arg_uids)
        run = plan._run
        return lambda: run(args)
    if name == "CUDNN_ENGINE":
        from dnntune.providers.cudnn._runtime import cudnn_handle, current_stream_ptr

        pointers = dict(plan._scalars)
        pointers.update({u: pack[u].data_ptr() for u in plan._io_uids})
        ws = 0 if workspace is None else workspace.data_ptr()
        device = plan._device_index
        handle = cudnn_handle(device, current_stream_ptr(device))
        execute, index = plan._run, plan._index
        return lambda: execute(pointers, ws, index, handle)
    if name == "TRITON_ENGINE":
        launch = plan._launch
        return lambda: launch(pack, workspace)
    return lambda: plan.execute(pack, workspace)


def engines_for(device: str) -> list[str]:
    if device == "cpu":
        return ["TORCH_ENGINE", KERNEL_PATH]
    out = []
    for name in ("CUDNN_ENGINE", "TRITON_ENGINE", "TORCH_ENGINE"):
        engine = get_registry().find(name)
        if engine is None:
            continue
        try:
            engine.check_available()
        except dt.DnnTuneError:
            continue
        out.append(name)
    return out


# ---- timing ------------------------------------------------------------------------------------
def _per_call_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    sync()
    return elapsed / 1e3 / calls


def interleaved(
    ways: dict[str, Callable[[], Any]], calls: int, rounds: int, sync: Callable[[], None]
) -> dict[str, dict[str, float]]:
    """Median and minimum µs per call of each way, sampled round-robin (drift hits all)."""
    for fn in ways.values():  # warm: lazy builds, allocator, caches
        for _ in range(max(10, calls // 10)):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in ways}
    names = list(ways)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            samples[name].append(_per_call_us(ways[name], calls, sync))
    return {
        k: {"median_us": statistics.median(v), "min_us": min(v), "stdev_us": statistics.pstdev(v)}
        for k, v in samples.items()
    }


def measure_op(
    op: str, device: str, engine: str, calls: int, rounds: int, profile: str | None
) -> dict[str, Any] | None:
    """Every path of ``op`` on ``engine``; None when the engine does not run the op here."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    case = _case(op, device, dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ways: dict[str, Callable[[], Any]] = {"pytorch_op": case.pytorch_op}
    if case.module is not None:
        module, x = case.module, case.module_input
        ways["pytorch_module"] = lambda: module(*x)
    with torch.no_grad(), pinned_engine(engine) as pinned:
        try:
            expected = case.pytorch_op()
            got = case.dnntune_op()
        except dt.DnnTuneError:
            return None
        if not pinned.built or pinned.built[-1][2].engine.name != engine.rstrip("*"):
            return None  # dnntune.torch ran PyTorch's op (the engine cannot run this call)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
        ways["dnntune_op"] = case.dnntune_op
        source = case.optimized_from if case.optimized_from is not None else case.module
        if source is not None:
            optimized = copy.deepcopy(source)
            dtt.optimize(optimized, policy="heuristic", overrides=None, check_speed=False)
            xin = case.module_input
            with torch.no_grad():
                optimized(*xin)
            ways["dnntune_module"] = lambda: optimized(*xin)
        graph, handle, plan = pinned.built[-1]
        pack = reference.make_inputs(graph, device)
        workspace = allocate_workspace(plan.workspace_size, torch.device(device))
        graph.execute(handle, pack, workspace)
        ways["graph_execute"] = lambda: graph.execute(handle, pack, workspace)
        ways["plan_execute"] = lambda: plan.execute(pack, workspace)
        binding = graph._binding  # Graph.execute's bound path, without the facade's checks
        if binding is not None:
            ways["binding_run"] = lambda: binding.run(pack, workspace)
        uids = list(pack)
        bound, tensors = plan.bind(uids), [pack[u] for u in uids]
        ways["bound_call"] = lambda: bound(tensors, workspace)
        if engine == "CUDNN_ENGINE":
            from dnntune.providers.cudnn import plan as cudnn_plan

            real, cudnn_plan.direct_call = cudnn_plan.direct_call, lambda *a: None
            try:
                frontend = plan.bind(uids)
            finally:
                cudnn_plan.direct_call = real
            ways["bound_frontend"] = lambda: frontend(tensors, workspace)
        ways["raw"] = raw_call(plan, pack, workspace)
        if profile is not None:
            _profile(ways, profile, op, engine, calls * rounds)
        rows = interleaved(ways, calls, rounds, sync)
    result: dict[str, Any] = {"op": op, "engine": engine, "plan": plan.name, "paths": rows}
    result["bound_call_kind"] = getattr(bound, "__name__", type(bound).__name__)
    base = rows["pytorch_op"]["median_us"]
    raw = rows["raw"]["median_us"]
    result["dnntune_op_over_pytorch_us"] = rows["dnntune_op"]["median_us"] - base
    result["graph_execute_over_raw_us"] = rows["graph_execute"]["median_us"] - raw
    return result


def _profile(ways: dict[str, Callable[[], Any]], spec: str, op: str, engine: str, n: int) -> None:
    """cProfile one path (``op:engine:path``, each part may be ``*`` for all)."""
    want_op, want_engine, want_path = [*spec.split(":"), "*", "*"][:3]
    if want_op not in ("*", op) or want_engine not in ("*", engine):
        return
    for path, fn in ways.items():
        if want_path not in ("*", path):
            continue
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        print(f"---- cProfile {op} {engine} {path} ({n} calls) ----")
        print(text.getvalue())


def print_table(device: str, rows: list[dict[str, Any]], stat: str) -> None:
    print(f"\n{device}: host µs per call, {stat} of interleaved rounds")
    head = ["op", "engine", *PATHS, "op-pt", "graph-raw"]
    widths = [9, 14, *([10] * len(PATHS)), 7, 9]
    key = f"{stat}_us"
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for r in rows:
        paths = r["paths"]
        cells = [r["op"], r["engine"]]
        cells += [f"{paths[p][key]:.2f}" if p in paths else "-" for p in PATHS]
        cells += [
            f"{paths['dnntune_op'][key] - paths['pytorch_op'][key]:+.2f}",
            f"{paths['graph_execute'][key] - paths['raw'][key]:+.2f}",
        ]
        print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per sample")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of ops")
    parser.add_argument("--devices", default=None, help="cpu,cuda (default: all available)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--profile", default=None, help="cProfile op:engine:path (* = any)")
    parser.add_argument(
        "--stat", choices=("median", "min", "both"), default="median", help="what the table shows"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = (
        args.devices.split(",")
        if args.devices
        else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    )
    ops = [o for o in args.ops.split(",") if o]
    if "cuda" in devices:
        # the compiled pointer reader built first, as any process after a machine's first has
        # it (Graph.execute's bound call takes it only when it is at hand, never building it)
        from dnntune.backend import native

        reader = native.pointer_reader() is not None
        print(f"compiled pointer reader: {'built' if reader else 'not available'}")
    results: dict[str, list[dict[str, Any]]] = {}
    for device in devices:
        rows = []
        for engine in engines_for(device):
            for op in ops:
                row = measure_op(op, device, engine, args.calls, args.rounds, args.profile)
                if row is not None:
                    rows.append(row)
        rows.sort(key=operator.itemgetter("op"))
        results[device] = rows
        for stat in ("median", "min") if args.stat == "both" else (args.stat,):
            print_table(device, rows, stat)
    out_dir = os.environ.get("OUT")
    if out_dir:
        payload = {
            "benchmark": "execute_overhead",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "calls_per_sample": args.calls,
            "rounds": args.rounds,
            "results": results,
        }
        path = Path(out_dir) / "execute_overhead.json"
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
