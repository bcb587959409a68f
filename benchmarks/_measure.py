"""One graph, five ways (seven with issue 25's), under the same conditions: the per-graph half
of ``run.py``.

For a graph file this module builds, in one process and on one set of buffers
(``reference.make_inputs``):

(a) ``eager``: the graph as the torch calls a user writes (``_eager.translate``);
(b) ``compile``: ``torch.compile(eager, mode="max-autotune-no-cudagraphs")``, its first call
    timed as the compile wall time (with a per-graph timeout);
(c) ``heuristic``: dnntune's out-of-the-box plan (``create_execution_plans([A])`` +
    ``build_plans(HEURISTICS_CHOICE)``);
(d) ``tuned``: ``add_all_engines`` + ``autotune`` (its wall time is the tuning cost), the winner
    written to the run's override file; with ``--heuristic-b`` and ``--exhaustive`` also
    HeuristicMode.B's plan (``heuristic_b``) and an EXHAUSTIVE tune (``exhaustive``, after (d));

checks each first output against ``dnntune.reference``, then times them all side by side in
interleaved rounds (same warmup, same cache mode, medians of CUDA-event samples; plans are
timed through ``Plan.execute`` on a pack normalized once), and last (e) rebuilds the graph
from scratch with ``DNNTUNE_HEUR_CONFIG_PATH`` pointing at the override file to see whether the
heuristics alone pick the tuned plan, how long that build takes, and that nothing was timed.

The variants are built in ``_variants.py``; this module orders them, times them and assembles
the row. Every expected failure becomes data in the row (``error`` fields); nothing here
raises for a graph that a variant cannot run.
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from _session import MeasureOptions, Session, error_text
from _variants import (
    compile_variant,
    eager_variant,
    heuristic_variant,
    tuned_variant,
    warm_start,
)

import dnntune as dt
from dnntune import reference
from dnntune.bench import TimingOptions, graph_metrics, time_callable
from dnntune.graph import OpGraph, OpKind
from dnntune.measure import summarize
from dnntune.measure.clocks import latency_sampler

__all__ = [
    "OPTIONAL_VARIANTS",
    "VARIANTS",
    "MeasureOptions",
    "Session",
    "category_of",
    "measure_graph",
]

VARIANTS = ("eager", "compile", "heuristic", "tuned")
#: the variants of issue 25's comparison, measured when asked (``--exhaustive``, ``--heuristic-b``)
OPTIONAL_VARIANTS = ("heuristic_b", "exhaustive")


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


# ---- timing -------------------------------------------------------------------------------------
def _rounds(
    names: list[str],
    rounds: int,
    take: Callable[[str, int], list[float]],
    describe: Callable[[str, list[float]], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``take(name, round)``'s samples of each name, in interleaved rounds that rotate who goes
    first, then ``describe(name, samples)`` per name; a name whose ``take`` raises is left out
    of the later rounds and described by its error (``{"error": ...}``)."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    errors: dict[str, str] = {}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            if name in errors:
                continue
            try:
                samples[name] += take(name, r)
            except Exception as exc:
                errors[name] = error_text(exc)
    return {
        name: describe(name, samples[name])
        if name not in errors and samples[name]
        else {"error": errors.get(name, "no samples")}
        for name in names
    }


def _time_variants(
    session: Session, runs: dict[str, Callable[[], object]], mode: str
) -> dict[str, dict[str, Any]]:
    """Interleaved rounds: each variant gets the same warmup and sample count per round."""
    opts = session.options
    rounds = max(1, opts.rounds)
    per_round = max(1, math.ceil(opts.iters / rounds))
    timing = TimingOptions(warmup=opts.warmup, iters=per_round, cache_mode=mode)
    flush = session.flush(mode)
    host: dict[str, list[float]] = {k: [] for k in runs}

    def take(name: str, _round: int) -> list[float]:
        with torch.no_grad():
            # the runs' return values are dropped; time_callable only calls them
            run = cast(Callable[[], None], runs[name])
            result = time_callable(run, session.handle, timing, flush)
        host[name] += result.host_samples_ms
        return result.kernel_samples_ms

    def describe(name: str, kernel: list[float]) -> dict[str, Any]:
        k = summarize(kernel)
        return {
            "median_ms": k.median_ms,
            "min_ms": k.min_ms,
            "mean_ms": k.mean_ms,
            "cov": k.cov,
            "n": k.n,
            "host_median_ms": summarize(host[name]).median_ms,
        }

    return _rounds(list(runs), rounds, take, describe)


def _latency_pair(
    session: Session, runs: dict[str, Callable[[], object]]
) -> dict[str, dict[str, Any]]:
    """Call latency (one execute on an idle device, host submit included; warm) of each run,
    in the interleaved rounds of :func:`_time_variants`: the clock
    ``AutotuneConfig.ranking_metric`` defaults to and HeuristicMode.B's labels are timed on.
    Per run its median, or an error."""
    opts, timer = session.options, session.handle.timer
    rounds = max(1, opts.rounds)
    per_round = max(1, math.ceil(opts.iters / rounds))
    samplers = {name: latency_sampler(timer, run) for name, run in runs.items()}

    def take(name: str, r: int) -> list[float]:
        with torch.no_grad():
            for _ in range(opts.warmup if r == 0 else 1):
                runs[name]()
            return [samplers[name]() for _ in range(per_round)]

    def describe(_name: str, samples: list[float]) -> dict[str, Any]:
        stats = summarize(samples)
        return {"median_ms": stats.median_ms, "n": stats.n}

    return _rounds(list(runs), rounds, take, describe)


# ---- one graph ----------------------------------------------------------------------------------
def measure_graph(session: Session, path: Path) -> dict[str, Any]:
    """Measure one graph file; returns its row (``status`` ok or error, never raises)."""
    started = time.perf_counter()
    row: dict[str, Any] = {"file": path.name, "status": "error"}
    try:
        _measure(session, path, row)
        row["status"] = "ok"
    except Exception as exc:
        row["error"] = error_text(exc)
        row["traceback"] = traceback.format_exc(limit=6)
    finally:
        row["elapsed_s"] = time.perf_counter() - started
        gc.collect()
        if session.handle.is_cuda:
            torch.cuda.empty_cache()
    return row


def _measure(session: Session, path: Path, row: dict[str, Any]) -> None:
    handle, opts = session.handle, session.options
    import torch._dynamo

    # Each graph starts with empty Dynamo caches: no compiled code (ours or an engine's) from
    # earlier graphs, and no code object near Dynamo's recompile limit.
    torch._dynamo.reset()
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
            row["reference_error"] = error_text(exc)

    variants: dict[str, dict[str, Any]] = {}
    runs: dict[str, Callable[[], object]] = {}
    program, args, variants["eager"] = eager_variant(session, graph, pack, expected)
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
        compiled, variants["compile"] = compile_variant(session, graph, program, args, expected)
        if compiled is not None:
            runs["compile"] = compiled
    heuristic, variants["heuristic"] = heuristic_variant(session, path, pack, expected)
    if heuristic is not None:
        runs["heuristic"] = heuristic.run
    if opts.heuristic_b:
        learned, variants["heuristic_b"] = heuristic_variant(
            session, path, pack, expected, dt.HeuristicMode.B
        )
        if learned is not None:
            runs["heuristic_b"] = learned.run
    tuned, variants["tuned"] = tuned_variant(session, path, pack, expected)
    if tuned is not None:
        runs["tuned"] = tuned.run
    if opts.exhaustive:
        # after the default tune, never before: what it compiles stays in this process's
        # caches (Triton's kernels, cuDNN's plans), and the default tune's cost is the target
        exhaustive, variants["exhaustive"] = tuned_variant(
            session, path, pack, expected, dt.TuneMode.EXHAUSTIVE, session.exhaustive_overrides_path
        )
        if exhaustive is not None:
            runs["exhaustive"] = exhaustive.run
    row["variants"] = variants
    del expected

    row["timing"] = (
        {mode: _time_variants(session, runs, mode) for mode in opts.modes} if runs else {}
    )
    a_plan = variants["heuristic"].get("plan")
    if (
        "heuristic_b" in runs
        and "heuristic" in runs
        and variants["heuristic_b"].get("plan") != a_plan
    ):
        # B is trained on call latency (dnntune's default clock): where its plan is not A's,
        # the two are also timed on that clock, side by side
        row["latency_b_vs_a"] = _latency_pair(
            session, {"heuristic": runs["heuristic"], "heuristic_b": runs["heuristic_b"]}
        )
    row["warm_start"] = warm_start(session, path, pack, variants["tuned"].get("plan"))
