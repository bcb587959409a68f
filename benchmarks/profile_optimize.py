"""Where ``dnntune.torch.optimize``'s seconds go on a real model (issues 23 and 25).

The models benchmark reports optimize's wall time beside its tuning time (the autotune calls):
on the H200 in session 22, bert_base took 14.8 s of which 6.1 s were tuning, resnet50 32.3 s
of which 23.4 s. The rest (tracing, grouping, plan builds outside autotune, the in-context
checks, the recordings) counts against the "0.1x of max-autotune's compile time" target as
much as the tuning does. This script runs ``optimize(copy, inputs, policy, cuda_graph="auto")``
per model under cProfile, from empty dnntune caches, and prints the wall time, the report's
tuning time, and the functions with the most cumulative and own time (dnntune's first).

    PYTHONPATH=src:benchmarks python benchmarks/profile_optimize.py --models bert_base,vit_b16

Writes ``<out>/profile_optimize_<model>.txt`` (``--out``, default ``$OUT`` or the current
directory).

``--sample-threads`` runs ``optimize`` without cProfile and reads every thread's Python stack
every 2 ms instead: the innermost frames seen most often, per thread. cProfile sees only its
own thread and charges a call into a compiled extension that it does not report (the cuDNN
frontend's pybind methods) to the Python frame around it: on the H100 in session 46 it put
3.6-4.9 s in ``CudnnProblem._notes``, a lookup in a vector, inside an ``optimize`` of 10.4-10.7
s wall, where the samples showed the main thread waiting on Triton's compiler processes
instead. (A thread that holds the interpreter in one long C call is seen only once it lets go:
the sampler waits for it too.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _models_zoo import SPECS, make_setting

import dnntune.torch as dtt
from dnntune.autotune.failures import BUDGET
from dnntune.torch import runtime
from dnntune.workflows.tune_report import cost_of, plan_label


def record_tunes(calls: list[dict[str, Any]]) -> Callable[[], None]:
    """Wrap dnntune.torch's per-layer tune (``runtime._tune``) to record, per autotune call,
    its graph, wall time, where the time went (compile, timing, re-check, confirmation) and
    each candidate's compile time and clock; returns the undo. (cProfile sees only the thread
    it runs in: this sees the tuning wherever it runs.)"""
    original = runtime._tune

    def recorded(build: Any, handle: Any, config: Any, inputs: Any) -> Any:
        start = time.perf_counter()
        out = original(build, handle, config, inputs)
        graph = build.graph
        calls.append(
            {
                "graph": graph.name,
                "wall_ms": (time.perf_counter() - start) * 1e3,
                "cost": cost_of(graph.last_autotune_summary),
                "candidates": [
                    (plan_label(r), r.compile_time_ms, r.min_time_ms, _state(r))
                    for r in graph.last_autotune_results
                ],
            }
        )
        return out

    runtime._tune = recorded
    return lambda: setattr(runtime, "_tune", original)


#: the steps of a signature's first sight timed per graph (``runtime``'s own names)
STEPS = (
    "_tune",
    "_checked_heuristic",
    "_untuned",
    "_heuristic",
    "_pytorch_op",
    "check_plan",
    "_tuned_earlier",
    "_from_override_file",
    "_checked_stored",
)


def record_steps(steps: list[tuple[str, str, float]]) -> Callable[[], None]:
    """Time each of :data:`STEPS` per call as (step, graph name, wall ms), wherever it runs
    (nested steps count in each: ``_untuned`` holds its ``_heuristic``); returns the undo."""
    originals = {name: getattr(runtime, name) for name in STEPS}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            first = args[0]
            graph = getattr(first, "graph", first)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = (time.perf_counter() - start) * 1e3
                steps.append((name, str(getattr(graph, "name", "?")), ms))

        return run

    for name, fn in originals.items():
        setattr(runtime, name, timed(name, fn))

    def undo() -> None:
        for name, fn in originals.items():
            setattr(runtime, name, fn)

    return undo


def steps_table(steps: list[tuple[str, str, float]]) -> str:
    """Per step, its calls and wall ms in all; then the slowest single calls."""
    lines = ["## first sights of signatures: steps (calls, ms in all; nested steps in each)"]
    total: dict[str, list[float]] = {}
    for name, _, ms in steps:
        total.setdefault(name, []).append(ms)
    for name, values in sorted(total.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{name:22} {len(values):5d} {sum(values):10.0f}")
    lines.append("slowest calls:")
    for name, graph, ms in sorted(steps, key=lambda s: -s[2])[:25]:
        lines.append(f"    {name:22} {graph[:60]:60} {ms:8.0f}")
    return "\n".join(lines) + "\n\n"


def _state(r: Any) -> str:
    """ "ok", or why a candidate has no time: skipped by the budget (not built), or failed."""
    if r.succeeded:
        return "ok"
    return "  skipped" if r.failure_kind == BUDGET else "   failed"


def tune_table(calls: list[dict[str, Any]]) -> str:
    """The autotune calls, slowest first: wall, compile, timing, re-check, confirmation (ms),
    then the candidates by compile time."""
    lines = ["## autotune calls (ms): wall, compile, timing, re-check, confirm; candidates"]
    by_engine: dict[str, float] = {}
    for call in sorted(calls, key=lambda c: -c["wall_ms"]):
        cost = call["cost"]
        parts = [cost.get(k) or 0.0 for k in ("compile_ms", "timing_ms", "recheck_ms")]
        parts.append(cost.get("confirm_ms") or 0.0)
        lines.append(
            f"{call['graph'][:60]:60} {call['wall_ms']:8.0f} "
            + " ".join(f"{v:8.0f}" for v in parts)
        )
        for name, compile_ms, clock_ms, state in sorted(call["candidates"], key=lambda c: -c[1]):
            engine = name.split("[")[0]
            by_engine[engine] = by_engine.get(engine, 0.0) + compile_ms
            if state == "ok":
                state = f"{clock_ms * 1e3:9.1f} us"
            lines.append(f"    {name[:70]:70} compile {compile_ms:8.0f} ms {state}")
    total = sum(c["wall_ms"] for c in calls)
    lines.append(f"total {total:.0f} ms in {len(calls)} calls; compile ms by engine:")
    for engine, ms in sorted(by_engine.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {engine:24} {ms:8.0f}")
    return "\n".join(lines) + "\n\n"


class ThreadSamples:
    """Every thread's innermost Python frames, read every ``interval_s`` while it runs (a
    context manager): per thread name, how often each stack of ``depth`` frames was seen."""

    def __init__(self, interval_s: float = 0.002, depth: int = 4) -> None:
        self.interval_s, self.depth = interval_s, depth
        self.counts: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> ThreadSamples:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _stack(self, frame: Any) -> str:
        parts: list[str] = []
        while frame is not None and len(parts) < self.depth:
            code = frame.f_code
            where = code.co_filename.split("site-packages/")[-1].split("/src/")[-1]
            parts.append(f"{where}:{frame.f_lineno}({code.co_name})")
            frame = frame.f_back
        return " <- ".join(parts)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    seen = self.counts.setdefault(names.get(ident, str(ident)), {})
                    stack = self._stack(frame)
                    seen[stack] = seen.get(stack, 0) + 1
            time.sleep(self.interval_s)

    def table(self, rows: int) -> str:
        lines = [f"## thread samples (every {self.interval_s * 1e3:g} ms; innermost first)"]
        for name, seen in sorted(self.counts.items(), key=lambda kv: -sum(kv[1].values())):
            lines.append(f"thread {name}: {sum(seen.values())} samples")
            for stack, n in sorted(seen.items(), key=lambda kv: -kv[1])[:rows]:
                lines.append(f"{n:7d} {stack}")
        return "\n".join(lines) + "\n\n"


def profile_one(name: str, args: argparse.Namespace, out: Path) -> str:
    (out / f"overrides_{name}.json").unlink(missing_ok=True)
    setting = make_setting(args)
    work = SPECS[name].build(setting)
    model = copy.deepcopy(work.model)
    prof = cProfile.Profile()
    calls: list[dict[str, Any]] = []
    steps: list[tuple[str, str, float]] = []
    undo_steps = record_steps(steps)
    undo = record_tunes(calls)
    samples = ThreadSamples() if args.sample_threads else None
    start = time.perf_counter()
    with samples or contextlib.nullcontext():
        if samples is None:
            prof.enable()
        try:
            report = dtt.optimize(
                model,
                work.inputs,
                policy=args.policy,
                overrides=out / f"overrides_{name}.json",  # its own: every layer tunes
                cuda_graph=args.cuda_graph,
                time_budget_s=args.tune_budget_s,
            )
        finally:
            prof.disable()
            undo()
            undo_steps()
    wall = time.perf_counter() - start
    text = io.StringIO()
    tuning = report.tuning_time_ms / 1e3
    prefetch = "no prefetch" if args.no_prefetch else "prefetch"
    how = "with thread samples" if samples is not None else "under cProfile"
    text.write(
        f"# {name}: optimize {wall:.2f} s {how} ({prefetch}), tuning {tuning:.2f} s "
        f"({report.autotune_calls} autotune calls), {len(report.swapped)} module(s) swapped\n\n"
    )
    if report.example_time is not None:
        text.write(f"{report.example_time.describe()}\n\n")
    text.write(steps_table(steps))
    text.write(tune_table(calls))
    if samples is not None:
        text.write(samples.table(args.rows // 4))
        body = text.getvalue()
        (out / f"profile_optimize_{name}.txt").write_text(body)
        return body.splitlines()[0]
    stats = pstats.Stats(prof, stream=text)
    text.write("## cumulative, dnntune\n")
    stats.sort_stats("cumulative").print_stats("dnntune", args.rows)
    text.write("## cumulative, all\n")
    stats.sort_stats("cumulative").print_stats(args.rows)
    text.write("## own time\n")
    stats.sort_stats("tottime").print_stats(args.rows // 2)
    body = text.getvalue()
    (out / f"profile_optimize_{name}.txt").write_text(body)
    return body.splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert_base", help="comma-separated model names")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--policy", default="tune")
    parser.add_argument(
        "--cuda-graph", default="auto", type=lambda v: {"true": True, "false": False}.get(v, v)
    )
    parser.add_argument(
        "--tune-budget-s",
        type=float,
        default=None,
        help="optimize's time_budget_s (as models.py's --tune-budget-s); default: none",
    )
    parser.add_argument("--rows", type=int, default=60, help="functions per table")
    parser.add_argument(
        "--no-prefetch",
        action="store_true",
        help="do not start building the compiled helpers when optimize begins (the behaviour "
        "before session 22: the first recording builds them); for a side-by-side comparison "
        "run each way in its own process with its own empty DNNTUNE_CACHE_DIR",
    )
    parser.add_argument(
        "--sample-threads",
        action="store_true",
        help="no cProfile: read every thread's stack every 2 ms instead (see the docstring)",
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.no_prefetch:
        from dnntune.backend import native

        native.prefetch = lambda: None
    for name in args.models.split(","):
        print(profile_one(name, args, args.out), flush=True)


if __name__ == "__main__":
    main()
