"""One graph, five ways, under the same conditions: the per-graph half of ``run.py``.

For a graph file this module builds, in one process and on one set of buffers
(``reference.make_inputs``):

(a) ``eager``: the graph as the torch calls a user writes (``_eager.translate``);
(b) ``compile``: ``torch.compile(eager, mode="max-autotune-no-cudagraphs")``, its first call
    timed as the compile wall time (with a per-graph timeout);
(c) ``heuristic``: dnntune's out-of-the-box plan (``create_execution_plans([A])`` +
    ``build_plans(HEURISTICS_CHOICE)``);
(d) ``tuned``: ``add_all_engines`` + ``autotune`` (its wall time is the tuning cost), the winner
    written to the run's override file;

checks each first output against ``dnntune.reference``, then times the four side by side in
interleaved rounds (same warmup, same cache mode, medians of CUDA-event samples; plans are
timed through ``Plan.execute`` on a pack normalized once), and last (e) rebuilds the graph
from scratch with ``DNNTUNE_HEUR_CONFIG_PATH`` pointing at the override file to see whether the
heuristics alone pick the tuned plan, how long that build takes, and that nothing was timed.

Every expected failure becomes data in the row (``error`` fields); nothing here raises for a
graph that a variant cannot run.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from _eager import EagerProgram, translate

import dnntune as dt
from dnntune import reference
from dnntune.backend.cache_flush import CacheFlusher
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import order_engines
from dnntune.backend.registry import get_registry
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.bench.metrics import graph_metrics
from dnntune.bench.stats import summarize
from dnntune.bench.timing import TimingOptions, time_callable
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind

__all__ = ["VARIANTS", "MeasureOptions", "Session", "category_of", "measure_graph"]

VARIANTS = ("eager", "compile", "heuristic", "tuned")
COMPILE_MODE = "max-autotune-no-cudagraphs"


@dataclass
class MeasureOptions:
    modes: tuple[str, ...] = ("warm", "cold")
    warmup: int = 10
    iters: int = 60
    rounds: int = 3
    compile: bool = True
    compile_timeout_s: float = 90.0
    compile_budget_s: float = 240.0
    tune_warmup: int = 3
    tune_max_iters: int = 30
    tune_candidate_timeout_s: float = 2.0
    tune_engines: tuple[str, ...] = ()
    verify: bool = True
    seed: int = 0


@dataclass
class Session:
    """What lives across graphs: the device, the override file, the compile time spent."""

    handle: Handle
    options: MeasureOptions
    overrides_path: Path
    ridge_flop_per_byte: float
    compile_spent_s: float = 0.0
    flushers: dict[str, CacheFlusher | None] = field(default_factory=dict)

    def flusher(self, mode: str) -> CacheFlusher | None:
        if mode != "cold":
            return None
        if "cold" not in self.flushers:
            self.flushers["cold"] = CacheFlusher(self.handle.device)
        return self.flushers["cold"]

    def synchronize(self) -> None:
        self.handle.synchronize()


def category_of(graph: OpGraph) -> str:
    """The suite category of a graph, from its core operation (and M for GEMMs)."""
    node = graph.core_node()
    kind = node.kind
    if kind is OpKind.MATMUL:
        c = node.outputs["c_tensor_uid"]
        rows = math.prod(c.dims[:-1]) if c is not None else 0
        return "gemm" if rows >= 256 else "gemm_decode"
    return {
        OpKind.CONV_FPROP: "conv_fprop",
        OpKind.CONV_DGRAD: "conv_dgrad",
        OpKind.CONV_WGRAD: "conv_wgrad",
        OpKind.SDPA: "sdpa",
        OpKind.LAYERNORM: "norm",
        OpKind.RMSNORM: "norm",
        OpKind.BATCHNORM_INFERENCE: "batchnorm",
        OpKind.BATCHNORM: "batchnorm",
        OpKind.RESAMPLE: "pool",
        OpKind.REDUCTION: "reduction",
        OpKind.POINTWISE: "pointwise",
    }.get(kind, "other")


# ---- helpers ------------------------------------------------------------------------------------
class CompileTimeout(BaseException):
    """A BaseException, so that library code catching Exception (Inductor's autotuner treats
    a failing choice that way) cannot swallow it."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise CompileTimeout in the main thread after ``seconds`` (no-op where unsupported)."""
    usable = seconds > 0 and hasattr(signal, "setitimer")
    if usable:

        def _fire(signum: int, frame: Any) -> None:
            raise CompileTimeout(f"compile took longer than {seconds:g} s")

        try:
            previous = signal.signal(signal.SIGALRM, _fire)
        except ValueError:  # not the main thread
            usable = False
    if not usable:
        yield
        return
    # Re-fire every few seconds in case something swallowed the first one.
    signal.setitimer(signal.ITIMER_REAL, seconds, 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _CountingTimer:
    """Wraps a handle's timer and counts timed spans (zero means nothing was benchmarked)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.calls = 0

    def synchronize(self) -> None:
        self.inner.synchronize()

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        self.calls += 1
        return float(self.inner.time_ms(fn, repeats))


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 400 else text[:400] + " ..."


def _workspace(handle: Handle, size: int) -> torch.Tensor | None:
    return torch.empty(size, dtype=torch.uint8, device=handle.device) if size > 0 else None


def _check(
    graph: OpGraph, outputs: dict[int, torch.Tensor], expected: dict[int, torch.Tensor] | None
) -> dict[str, Any]:
    """Compare every output with the reference (``verified`` None when there is none)."""
    if expected is None:
        return {"verified": None, "max_abs_error": None, "check": "no reference"}
    try:
        return _compare_outputs(graph, outputs, expected)
    except Exception as exc:  # a comparison that cannot run leaves the variant unchecked
        return {"verified": None, "max_abs_error": None, "check": f"not checked: {_error(exc)}"}


def _compare_outputs(
    graph: OpGraph, outputs: dict[int, torch.Tensor], expected: dict[int, torch.Tensor]
) -> dict[str, Any]:
    worst, message = 0.0, ""
    for t in graph.output_tensors():
        assert t.uid is not None
        if t.uid not in outputs or t.uid not in expected:
            continue
        got = outputs[t.uid].reshape(expected[t.uid].shape)
        result = reference.compare(got, expected[t.uid], reference.tolerance_for(graph, t))
        worst = max(worst, result.max_abs_error)
        if not result.ok:
            return {
                "verified": False,
                "max_abs_error": result.max_abs_error,
                "check": f"{t.name}: {result.message}",
            }
        message = result.message
    return {"verified": True, "max_abs_error": worst, "check": message}


def _plan_outputs(graph: OpGraph, pack: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    return {t.uid: pack[t.uid] for t in graph.output_tensors() if t.uid is not None}


def _zero_outputs(graph: OpGraph, pack: dict[int, torch.Tensor]) -> None:
    for t in _plan_outputs(graph, pack).values():
        t.zero_()


# ---- the variants -------------------------------------------------------------------------------
@dataclass
class _Runner:
    run: Callable[[], object]
    info: dict[str, Any]


def _eager(
    session: Session,
    graph: OpGraph,
    pack: dict[int, torch.Tensor],
    expected: dict[int, torch.Tensor] | None,
) -> tuple[EagerProgram | None, tuple[torch.Tensor, ...], dict[str, Any]]:
    info: dict[str, Any] = {"ok": False}
    try:
        program = translate(graph)
        info["source"] = program.source
        args = program.args(pack)
        start = time.perf_counter()
        with torch.no_grad():
            out = program.fn(*args)
        session.synchronize()
        info["first_call_ms"] = (time.perf_counter() - start) * 1e3
        info.update(_check(graph, program.outputs(out), expected))
        info["ok"] = True
        return program, args, info
    except Exception as exc:
        info["error"] = _error(exc)
        return None, (), info


def _compile(
    session: Session,
    graph: OpGraph,
    program: EagerProgram,
    args: tuple[torch.Tensor, ...],
    expected: dict[int, torch.Tensor] | None,
) -> tuple[Callable[[], object] | None, dict[str, Any]]:
    opts = session.options
    info: dict[str, Any] = {"ok": False, "mode": COMPILE_MODE}
    if session.compile_spent_s >= opts.compile_budget_s:
        info["error"] = f"skipped: compile budget of {opts.compile_budget_s:g} s spent"
        return None, info
    import torch._dynamo

    torch._dynamo.reset()  # every graph compiles from scratch (and never hits the recompile cap)
    compiled = torch.compile(program.fn, mode=COMPILE_MODE, dynamic=False)
    start = time.perf_counter()
    try:
        with _deadline(opts.compile_timeout_s), torch.no_grad():
            out = compiled(*args)
            session.synchronize()
    except BaseException as exc:  # a compile failure or timeout is one row's data
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["error"] = _error(exc)
        info["compile_s"] = time.perf_counter() - start
        session.compile_spent_s += info["compile_s"]
        torch._dynamo.reset()
        return None, info
    info["compile_s"] = time.perf_counter() - start
    session.compile_spent_s += info["compile_s"]
    info.update(_check(graph, program.outputs(out), expected))
    info["ok"] = True

    def run() -> object:
        with torch.no_grad():
            return compiled(*args)

    return run, info


def _heuristic(
    session: Session,
    path: Path,
    pack: dict[int, torch.Tensor],
    expected: dict[int, torch.Tensor] | None,
) -> tuple[_Runner | None, dict[str, Any]]:
    handle = session.handle
    info: dict[str, Any] = {"ok": False}
    try:
        g = dt.Graph.load(path)
        g.build_operation_graph(handle)
        start = time.perf_counter()
        g.create_execution_plans([dt.HeuristicMode.A])
        g.check_support()
        g.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
        info["build_ms"] = (time.perf_counter() - start) * 1e3
        plan = g.active_plan
        assert plan is not None
        info["plan"] = plan.name
        info["engine"] = plan.engine.name
        npack = normalize_variant_pack(g, pack, handle)
        workspace = _workspace(handle, plan.workspace_size)
        stream = handle.stream
        _zero_outputs(g, npack)
        start = time.perf_counter()
        plan.execute(npack, workspace, stream)
        session.synchronize()
        info["first_call_ms"] = (time.perf_counter() - start) * 1e3
        info.update(_check(g, _plan_outputs(g, npack), expected))
        info["ok"] = True
        return _Runner(lambda: plan.execute(npack, workspace, stream), info), info
    except Exception as exc:
        info["error"] = _error(exc)
        return None, info


def _result_summary(r: dt.AutotuneResult) -> dict[str, Any]:
    return {
        "engine": r.engine_name,
        "plan": r.plan_name,
        "succeeded": r.succeeded,
        "rank": r.rank,
        "min_time_ms": r.min_time_ms if r.succeeded else None,
        "median_time_ms": r.median_time_ms if r.succeeded else None,
        "verified": r.verified,
        "compile_time_ms": r.compile_time_ms,
        "error": r.error_message or None,
    }


def _tuned(
    session: Session,
    path: Path,
    pack: dict[int, torch.Tensor],
    expected: dict[int, torch.Tensor] | None,
) -> tuple[_Runner | None, dict[str, Any]]:
    handle, opts = session.handle, session.options
    info: dict[str, Any] = {"ok": False}
    config = dt.AutotuneConfig(
        mode=dt.TuneMode.STANDARD,
        strategy=dt.AutotuneStrategy.RUN_UNTIL_STABLE,
        warmup_iterations=opts.tune_warmup,
        max_iterations=opts.tune_max_iters,
        window_size=min(3, opts.tune_max_iters),
        engine_id_filter=[dt.engine_name_or_id(e) for e in opts.tune_engines],
        verify=True,
        candidate_timeout_s=opts.tune_candidate_timeout_s,
    )
    storage = dt.AutotuneStorageConfig(file_path=str(session.overrides_path))
    g = dt.Graph.load(path)
    results: list[dt.AutotuneResult] = []
    start = time.perf_counter()
    try:
        g.build_operation_graph(handle)
        g.add_all_engines()
        ws_size = g.get_estimated_max_workspace_size()
        workspace = _workspace(handle, ws_size)
        results = g.autotune(
            handle, pack, workspace, workspace_size=ws_size, config=config, storage_config=storage
        )
    except dt.AutotuneError as exc:
        results = list(exc.results)
        info["error"] = _error(exc)
    except Exception as exc:
        info["error"] = _error(exc)
    info["tuning_s"] = time.perf_counter() - start
    info["candidates"] = [_result_summary(r) for r in results]
    plan = g.active_plan
    if "error" in info or plan is None:
        info.setdefault("error", "autotune chose no plan")
        return None, info
    info["plan"] = plan.name
    info["engine"] = plan.engine.name
    try:
        if plan.workspace_size > ws_size:
            workspace = _workspace(handle, plan.workspace_size)
        npack = normalize_variant_pack(g, pack, handle)
        stream = handle.stream
        _zero_outputs(g, npack)
        plan.execute(npack, workspace, stream)
        session.synchronize()
        info.update(_check(g, _plan_outputs(g, npack), expected))
        info["ok"] = True
        return _Runner(lambda: plan.execute(npack, workspace, stream), info), info
    except Exception as exc:
        info["error"] = _error(exc)
        return None, info


def _warm_start(
    session: Session, path: Path, pack: dict[int, torch.Tensor], tuned_plan: str | None
) -> dict[str, Any]:
    """A fresh graph built on the override file alone: build time, plan, nothing timed."""
    info: dict[str, Any] = {"ok": False}
    if not session.overrides_path.is_file():
        info["error"] = "no override file was written"
        return info
    saved = os.environ.get("DNNTUNE_HEUR_CONFIG_PATH")
    os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = str(session.overrides_path)
    try:
        handle = dt.create_handle(session.handle.device)
        timer = _CountingTimer(handle.timer)
        handle.set_timer(timer)
        start = time.perf_counter()
        g = dt.Graph.load(path)
        g.build_operation_graph(handle)
        g.create_execution_plans([dt.HeuristicMode.A])
        g.check_support()
        g.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
        info["build_ms"] = (time.perf_counter() - start) * 1e3
        info["plan"] = g.get_plan_name()
        plan = g.active_plan
        assert plan is not None
        info["engine"] = plan.engine.name
        info["picked_tuned"] = tuned_plan is not None and info["plan"] == tuned_plan
        applicable = get_registry().applicable(g, handle)
        if applicable:
            info["policy"] = order_engines(g, handle, applicable, dt.HeuristicMode.A).policy
        npack = normalize_variant_pack(g, pack, handle)
        workspace = _workspace(handle, plan.workspace_size)
        start = time.perf_counter()
        plan.execute(npack, workspace, handle.stream)
        handle.synchronize()
        info["first_call_ms"] = (time.perf_counter() - start) * 1e3
        info["timed_spans"] = timer.calls
        info["ok"] = True
    except Exception as exc:
        info["error"] = _error(exc)
    finally:
        if saved is None:
            os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
        else:
            os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = saved
    return info


# ---- timing -------------------------------------------------------------------------------------
def _time_variants(
    session: Session, runs: dict[str, Callable[[], object]], mode: str
) -> dict[str, dict[str, Any]]:
    """Interleaved rounds: each variant gets the same warmup and sample count per round."""
    opts = session.options
    rounds = max(1, opts.rounds)
    per_round = max(1, math.ceil(opts.iters / rounds))
    timing = TimingOptions(warmup=opts.warmup, iters=per_round, cache_mode=mode)
    flusher = session.flusher(mode)
    kernel: dict[str, list[float]] = {k: [] for k in runs}
    host: dict[str, list[float]] = {k: [] for k in runs}
    errors: dict[str, str] = {}
    names = list(runs)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            if name in errors:
                continue
            try:
                with torch.no_grad():
                    # the runs' return values are dropped; time_callable only calls them
                    run = cast(Callable[[], None], runs[name])
                    result = time_callable(run, session.handle, timing, flusher)
            except Exception as exc:
                errors[name] = _error(exc)
                continue
            kernel[name] += result.kernel_samples_ms
            host[name] += result.host_samples_ms
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in errors or not kernel[name]:
            out[name] = {"error": errors.get(name, "no samples")}
            continue
        k, h = summarize(kernel[name]), summarize(host[name])
        out[name] = {
            "median_ms": k.median_ms,
            "min_ms": k.min_ms,
            "mean_ms": k.mean_ms,
            "cov": k.cov,
            "n": k.n,
            "host_median_ms": h.median_ms,
        }
    return out


# ---- one graph ----------------------------------------------------------------------------------
def measure_graph(session: Session, path: Path) -> dict[str, Any]:
    """Measure one graph file; returns its row (``status`` ok or error, never raises)."""
    started = time.perf_counter()
    row: dict[str, Any] = {"file": path.name, "status": "error"}
    try:
        _measure(session, path, row)
        row["status"] = "ok"
    except Exception as exc:
        row["error"] = _error(exc)
        row["traceback"] = traceback.format_exc(limit=6)
    finally:
        row["elapsed_s"] = time.perf_counter() - started
        gc.collect()
        if session.handle.is_cuda:
            torch.cuda.empty_cache()
    return row


def _measure(session: Session, path: Path, row: dict[str, Any]) -> None:
    handle, opts = session.handle, session.options
    graph = dt.Graph.load(path)
    graph.validate()
    row["graph"] = graph.name
    row["category"] = category_of(graph)
    metrics = graph_metrics(graph)
    row["flops"], row["io_bytes"] = metrics.flops, metrics.io_bytes
    intensity = metrics.flops / metrics.io_bytes if metrics.io_bytes else math.inf
    row["flop_per_byte"] = intensity
    row["bound"] = "compute" if intensity >= session.ridge_flop_per_byte else "memory"
    graph.build_operation_graph(handle)
    pack = reference.make_inputs(graph, handle.device, seed=opts.seed)
    expected: dict[int, torch.Tensor] | None = None
    if opts.verify:
        inputs = {t.uid: pack[t.uid] for t in graph.input_tensors() if t.uid is not None}
        try:
            expected = reference.run(graph, inputs)
        except Exception as exc:
            row["reference_error"] = _error(exc)

    variants: dict[str, dict[str, Any]] = {}
    runs: dict[str, Callable[[], object]] = {}
    program, args, variants["eager"] = _eager(session, graph, pack, expected)
    if program is not None:
        fn = program.fn

        def eager_run() -> object:
            return fn(*args)

        runs["eager"] = eager_run
    if not opts.compile:
        variants["compile"] = {"ok": False, "error": "skipped (--skip-compile)"}
    elif program is None:
        variants["compile"] = {"ok": False, "error": "skipped: no eager function to compile"}
    else:
        compiled, variants["compile"] = _compile(session, graph, program, args, expected)
        if compiled is not None:
            runs["compile"] = compiled
    heuristic, variants["heuristic"] = _heuristic(session, path, pack, expected)
    if heuristic is not None:
        runs["heuristic"] = heuristic.run
    tuned, variants["tuned"] = _tuned(session, path, pack, expected)
    if tuned is not None:
        runs["tuned"] = tuned.run
    row["variants"] = variants
    del expected

    row["timing"] = (
        {mode: _time_variants(session, runs, mode) for mode in opts.modes} if runs else {}
    )
    row["warm_start"] = _warm_start(session, path, pack, variants["tuned"].get("plan"))
