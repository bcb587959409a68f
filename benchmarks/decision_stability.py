"""Decision stability of ``autotune()``: the same winner run to run, and a winner that holds up.

For each of the first N example graphs (``examples/graphs/*.json``, sorted by name):

1. build the candidates once. ``--path compiled`` (the default): every applicable engine's
   heuristic plan, compiled once, tuned on the compiled-plan path (TORCH_COMPILE_ENGINE is left
   out unless ``--with-compile``: its compile alone would blow the time budget).
   ``--path spec``: plan specs with knob variants (TORCH_ENGINE with CUDA-graph replay and
   channels-last, CUDNN_ENGINE's first engine configs), recompiled by every autotune() call;
2. autotune the graph R times with ``AutotuneConfig()`` defaults (the RFC's plus dnntune's
   verification and interleaved re-check of close contenders), recording each winner, its
   margin over the runner-up and whether it was separated beyond noise;
3. re-time every candidate that succeeded, interleaved round-robin for ``--rounds`` rounds
   (the independent measurement; the median of each candidate's samples, on the clock the
   tuner ranks on: call latency, one execute on an idle device; each sample after two untimed
   runs of the same plan, so it shows the plan's own steady state);
4. report per graph: the independent best and its gap to the runner-up, how many of the R
   tunes chose the most frequent winner, and how many chose a plan within 2 % of the
   independent best.

Targets (issue 8): the same winner in >= 9 of 10 tunes whenever the independent best and
runner-up differ by >= 5 %, and the chosen winner within 2 % of the independent best in
>= 95 % of all tunes.

Usage::

    python benchmarks/decision_stability.py                         # CUDA, 10 graphs x 10
    python benchmarks/decision_stability.py --device cpu --graphs 2 --repeats 2   # smoke run

Prints a table; writes ``$OUT/decision_stability.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import dnntune as dt
from dnntune import measure, reference
from dnntune.autotune import winner_margin
from dnntune.errors import AutotuneError, DnnTuneError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"
COMPILE_ENGINE = "TORCH_COMPILE_ENGINE"
SAME_WINNER_TARGET = 0.9
WITHIN = 0.02
WITHIN_TARGET = 0.95
CLEAR_GAP = 0.05


@dataclass
class GraphRun:
    """Everything measured for one graph."""

    graph: str
    candidates: list[str] = field(default_factory=list)
    winners: list[str] = field(default_factory=list)
    margins: list[float | None] = field(default_factory=list)
    separated: list[bool] = field(default_factory=list)
    tune_ms: list[float] = field(default_factory=list)
    independent_ms: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    build_s: float = 0.0

    @property
    def best(self) -> str | None:
        if not self.independent_ms:
            return None
        return min(self.independent_ms, key=self.independent_ms.__getitem__)

    @property
    def gap(self) -> float | None:
        """Independent runner-up / best - 1 (None with fewer than two candidates)."""
        times = sorted(self.independent_ms.values())
        if len(times) < 2 or times[0] <= 0:
            return None
        return times[1] / times[0] - 1.0

    @property
    def same_winner(self) -> int:
        if not self.winners:
            return 0
        return collections.Counter(self.winners).most_common(1)[0][1]

    @property
    def within(self) -> int:
        """Tunes whose winner is within WITHIN of the independent best."""
        if not self.independent_ms:
            return 0
        best = min(self.independent_ms.values())
        return sum(
            1
            for w in self.winners
            if w in self.independent_ms and self.independent_ms[w] <= best * (1.0 + WITHIN)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "candidates": self.candidates,
            "independent_median_ms": self.independent_ms,
            "best": self.best,
            "gap_best_to_runner_up": self.gap,
            "winners": self.winners,
            "same_winner": self.same_winner,
            "within_2pct": self.within,
            "margins": self.margins,
            "separated": self.separated,
            "tune_ms": self.tune_ms,
            "build_s": self.build_s,
            "errors": self.errors,
        }


# ---- candidates ------------------------------------------------------------------------------
def _spec_variants(g: dt.Graph, device: str, with_compile: bool) -> list[dt.EngineVariant]:
    """Each applicable engine at its defaults, plus a few knob variants where the knob exists."""
    extra: dict[str, list[dict[str, Any]]] = {
        "TORCH_ENGINE": [{"torch.memory_format": "channels_last"}],
        "CUDNN_ENGINE": [{"cudnn.engine_config": i} for i in (0, 1, 2)],
    }
    if device == "cuda":
        extra["TORCH_ENGINE"].append({"torch.cuda_graph": 1})
    variants: list[dt.EngineVariant] = []
    for info in g.get_engine_configs():
        if info.engine_name == COMPILE_ENGINE and not with_compile:
            continue
        variants.append(dt.EngineVariant(info.engine_id, {}))
        knobs = {k.knob_id for k in info.knobs}
        for settings in extra.get(info.engine_name, []):
            if set(settings) <= knobs:
                variants.append(dt.EngineVariant(info.engine_id, settings))
    return variants


def _workspace(nbytes: int, device: str) -> torch.Tensor | None:
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None


def _prepare(path: Path, handle: dt.Handle, args: argparse.Namespace) -> tuple[dt.Graph, Any]:
    """The graph with its candidates built (compiled path) or added (spec path), and inputs."""
    g = dt.Graph.load(path)
    g.build_operation_graph(handle)
    if args.path == "compiled":
        if not args.with_compile:
            g.deselect_engines([COMPILE_ENGINE])
        g.create_execution_plans([dt.HeuristicMode.FALLBACK])
        g.check_support()
        g.build_plans(dt.BuildPlanPolicy.ALL)
    else:
        variants = _spec_variants(g, args.device, args.with_compile)
        if not variants:
            raise DnnTuneError(f"no engine applies to {g.name} on {args.device}")
        g.add_engine_variants(variants)
    return g, reference.make_inputs(g, handle.device, seed=0)


def _tune_once(
    g: dt.Graph, handle: dt.Handle, pack: Any, args: argparse.Namespace, run: GraphRun
) -> list[dt.AutotuneResult]:
    config = dt.AutotuneConfig(candidate_timeout_s=args.timeout_s)
    try:
        if args.path == "compiled":
            ws = _workspace(g.get_autotune_workspace_size(), args.device)
            results = g.autotune(handle, pack, ws, config=config)
        else:
            size = g.get_estimated_max_workspace_size()
            results = g.autotune(handle, pack, _workspace(size, args.device), size, config)
    except AutotuneError as exc:
        run.errors.append(str(exc))
        return list(exc.results)
    summary = g.last_autotune_summary
    margin = winner_margin(results)
    w = results[0]
    run.winners.append(w.plan_name or w.engine_name)
    run.margins.append(margin.margin)
    run.separated.append(margin.separated)
    run.tune_ms.append(summary.total_time_ms if summary is not None else 0.0)
    return results


def _plans_for(
    g: dt.Graph, handle: dt.Handle, results: list[dt.AutotuneResult], path: str
) -> dict[str, dt.Plan]:
    """The succeeded candidates as executable plans, by plan name."""
    plans: dict[str, dt.Plan] = {}
    for r in results:
        if not r.succeeded or not r.plan_name or r.plan_name in plans:
            continue
        if path == "compiled":
            # the compiled-plan path keeps every built plan; results index into it (building
            # an index that is built already selects its plan, compiling nothing)
            plan = g.build_plan_at_index(r.compiled_plan_index).active_plan
        else:
            plan = dt.choose_plan(g, handle, engine=r.engine_id, knobs=r.knob_settings).plan
        if plan is not None:
            plans[r.plan_name] = plan
    return plans


def _independent(
    g: dt.Graph, handle: dt.Handle, pack: Any, plans: dict[str, dt.Plan], rounds: int
) -> dict[str, float]:
    """Median call latency of each plan over ``rounds`` interleaved rounds (rotating order)."""
    size = max((p.workspace_size for p in plans.values()), default=0)
    npack = dt.normalize_variant_pack(g, pack, handle)
    workspace = _workspace(size, str(handle.device.type))

    def sampler(plan: dt.Plan) -> Callable[[], float]:
        def run() -> None:
            with handle.stream_context():
                plan.execute(npack, workspace, handle.stream)

        # two untimed runs first, as the tuner's re-check does: each sample is taken in the
        # plan's own steady state, not in the state the previous plan left behind
        return lambda: measure.steady_sample(lambda: measure.latency_sample(handle.timer, run), run)

    taken = measure.interleaved_rounds(
        {name: sampler(plan) for name, plan in plans.items()}, rounds, rotate=True
    )
    return {name: statistics.median(s) for name, s in taken.samples_ms.items()}


def measure_graph(path: Path, handle: dt.Handle, args: argparse.Namespace) -> GraphRun:
    run = GraphRun(path.stem)
    start = time.perf_counter()
    try:
        g, pack = _prepare(path, handle, args)
    except DnnTuneError as exc:
        run.errors.append(f"build: {exc}")
        return run
    run.build_s = time.perf_counter() - start
    last: list[dt.AutotuneResult] = []
    for _ in range(args.repeats):
        results = _tune_once(g, handle, pack, args, run)
        if any(r.succeeded for r in results):
            last = results
    run.candidates = sorted({r.plan_name or r.engine_name for r in last if r.succeeded})
    plans = _plans_for(g, handle, last, args.path)
    if plans:
        run.independent_ms = _independent(g, handle, pack, plans, args.rounds)
    return run


# ---- report ----------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def summarize(runs: list[GraphRun], repeats: int) -> dict[str, Any]:
    tunes = sum(len(r.winners) for r in runs)
    within = sum(r.within for r in runs)
    clear = [r for r in runs if r.gap is not None and r.gap >= CLEAR_GAP]
    stable = [r for r in clear if r.same_winner >= SAME_WINNER_TARGET * len(r.winners)]
    rate = within / tunes if tunes else None
    return {
        "graphs": len(runs),
        "tunes": tunes,
        "within_2pct": within,
        "within_2pct_rate": rate,
        "graphs_gap_ge_5pct": len(clear),
        "graphs_gap_ge_5pct_stable": len(stable),
        "same_winner_target_met": len(stable) == len(clear),
        "within_target_met": rate is not None and rate >= WITHIN_TARGET,
        "repeats": repeats,
    }


def print_table(runs: list[GraphRun], summary: dict[str, Any]) -> None:
    header = (
        f"{'graph':44} {'cand':>4} {'best (indep.)':30} {'gap':>6} {'same':>5} "
        f"{'<=2%':>5} {'sep':>4} {'tune ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in runs:
        n = len(r.winners)
        tune = statistics.median(r.tune_ms) if r.tune_ms else 0.0
        best = (r.best or "-")[:30]
        print(
            f"{r.graph[:44]:44} {len(r.candidates):>4} {best:30} {_pct(r.gap):>6} "
            f"{r.same_winner:>2}/{n:<2} {r.within:>2}/{n:<2} {sum(r.separated):>4} {tune:>8.1f}"
        )
        for e in r.errors[:2]:
            print(f"    error: {e[:150]}")
    print()
    rate = summary["within_2pct_rate"]
    print(
        f"chosen within 2% of the independent best: {summary['within_2pct']}/{summary['tunes']}"
        f" ({_pct(rate)}; target >= 95%: {'met' if summary['within_target_met'] else 'NOT met'})"
    )
    print(
        f"graphs whose best and runner-up differ by >= 5%: {summary['graphs_gap_ge_5pct']}, "
        f"of which the same winner >= 9/10: {summary['graphs_gap_ge_5pct_stable']} "
        f"(target: all; {'met' if summary['same_winner_target_met'] else 'NOT met'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--graphs", type=int, default=10, help="how many example graphs")
    parser.add_argument("--repeats", type=int, default=10, help="autotune() calls per graph")
    parser.add_argument("--rounds", type=int, default=100, help="independent re-time rounds")
    parser.add_argument("--path", default="compiled", choices=["compiled", "spec"])
    parser.add_argument("--with-compile", action="store_true", help="include torch.compile")
    parser.add_argument("--timeout-s", type=float, default=None, help="candidate_timeout_s")
    parser.add_argument("--graph", action="append", default=[], help="only these (name part)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    paths = sorted(EXAMPLES.glob("*.json"))
    if args.graph:
        paths = [p for p in paths if any(part in p.stem for part in args.graph)]
    paths = paths[: args.graphs]
    handle = dt.create_handle(args.device)
    start = time.perf_counter()
    runs: list[GraphRun] = []
    for path in paths:
        run = measure_graph(path, handle, args)
        runs.append(run)
        print(
            f"[{time.perf_counter() - start:6.1f} s] {run.graph}: winners "
            f"{dict(collections.Counter(run.winners))}, best {run.best}, gap {_pct(run.gap)}",
            flush=True,
        )
    wall_s = time.perf_counter() - start
    summary = summarize(runs, args.repeats)
    print()
    print_table(runs, summary)
    print(f"\nwall time: {wall_s:.1f} s")
    out = os.environ.get("OUT")
    if out:
        device = (
            torch.cuda.get_device_name(handle.device) if handle.is_cuda else platform.processor()
        )
        doc = {
            "benchmark": "decision_stability",
            "device": device,
            "torch": torch.__version__,
            "args": vars(args),
            "summary": summary,
            "graphs": [r.to_dict() for r in runs],
            "wall_s": wall_s,
        }
        target = Path(out) / "decision_stability.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
