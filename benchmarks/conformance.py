"""Conformance sweep: every plan dnntune can run, on generated graphs, against the reference.

Graphs come from ``dnntune.testing.conformance`` (deterministic from ``--seed`` and the case
index: every op kind, fp32/fp16/bf16, every layout, shape classes tiny / tail / wide_row /
many_rows / large). For each graph and engine a plan must either refuse (``InvalidValueError``
or ``NotSupportedError``) or match ``dnntune.reference`` within the dtype's tolerance, under
each condition (phases run in this order, each until its share of ``--time-budget-s``):

1. ``first_call`` and ``after_100_launches`` of every engine's default plan and the heuristic
   (``HeuristicMode.A``) plan, for every case;
2. the same for every plan the tuner can offer (suggested variants, the ``--oracle`` knob
   product, ``--sweep-knobs``, ``global.benchmarking=1``, cuDNN engine configs 0..N-1, every
   Triton solver config with all knobs pinned) on the first ``--variant-cases`` cases of each
   (op, dtype, shape class) cell; the priming plans write the find and perf databases;
3. ``autotune_winner``: ``dnntune.workflows.tune_graph`` (EXHAUSTIVE, sweep knobs, override file)
   on the first ``--tune-cases`` cases of each (op, dtype) pair; then ``after_tuning``: every
   default and heuristic plan of phase 1 rebuilt and re-checked in this process;
4. ``new_process``: the same re-check in a fresh process that reads the same
   ``DNNTUNE_CACHE_DIR`` (and override file).

Usage (H200; one 10-minute call on 8 GPUs)::

    python benchmarks/conformance.py --device cuda --size full --count 1500 --gpus 8 \
        --time-budget-s 480 --out benchmarks/results/conformance
    python benchmarks/conformance.py --replay OUT/failures/<file>.json   # one failing case
    python benchmarks/conformance.py merge OUT1/results.json OUT2/results.json --out OUT

Writes ``OUT/results.json`` (every check), ``OUT/matrix.md`` (per cell checked/refused/wrong,
machine, versions, exact command) and ``OUT/failures/*.json`` (graph JSON + engine + knobs +
condition + what ran before it: replayable). Progress goes to stderr. Exit code 1 when any plan
is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

SCRIPT = Path(__file__).resolve()
#: each phase's share of the time budget (new_process takes what is left); a run of a subset
#: of the phases (``--phases``) splits the budget among them in the same proportions
PHASE_WEIGHT = {"defaults": 0.45, "variants": 0.23, "tuning": 0.17, "new_process": 0.15}
PHASES = tuple(PHASE_WEIGHT)
#: the share of the variants phase that the knob pass may use before the solver-config pass
KNOB_PASS_SHARE = 0.6


def phase_ends(phases: list[str]) -> dict[str, float]:
    """The share of the budget at which each selected phase stops starting new work."""
    total = sum(PHASE_WEIGHT[p] for p in phases)
    ends, running = {}, 0.0
    for phase in PHASES:
        if phase in phases:
            running += PHASE_WEIGHT[phase] / total
            ends[phase] = running
    return ends


def log(message: str) -> None:
    print(f"[conformance {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_and_versions(device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    machine: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    if device == "cuda" and torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
        machine["gpu_count"] = torch.cuda.device_count()
    versions = {
        "python": sys.version.split()[0],
        "dnntune": _version("dnntune"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "cudnn_frontend": _version("nvidia-cudnn-frontend"),
    }
    return machine, versions


# ---- the sweep ----------------------------------------------------------------------------
class Sweep:
    def __init__(self, args: argparse.Namespace) -> None:
        from _conformance_plans import ENGINES

        import dnntune as dt

        self.args = args
        self.phase_end = phase_ends(args.phases)
        self.start = time.monotonic()
        self.handle = dt.create_handle(args.device)
        self.engines = [e for e in (args.engines.split(",") if args.engines else ENGINES)]
        self.records: list[dict[str, Any]] = []
        self.compile_builds = 0
        self.coverage: dict[str, int] = defaultdict(int)
        self.primed: list[int] = []
        self.tuned: list[int] = []
        self.failures = 0
        self.compile_cases: set[int] = set()
        self.compile_variant_cases: set[int] = set()
        self.out = Path(args.out)
        from _conformance_plans import unavailable

        self.unavailable = unavailable(self.engines, self.handle.device.type)
        for name, why in self.unavailable.items():
            log(f"{name} is not applicable here: {why}")
        (self.out / "failures").mkdir(parents=True, exist_ok=True)

    # ---- time -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def before(self, phase: str) -> bool:
        share = self.phase_end.get(phase, 1.0)
        return self.elapsed() < share * self.args.time_budget_s

    # ---- records ----------------------------------------------------------------------------
    def record(self, case: Any, spec: Any, condition: str, outcome: Any, kind: str) -> None:
        rec = {
            **case.tags(),
            "engine": spec.engine,
            "knobs": dict(spec.knobs),
            "sources": list(spec.sources),
            "plan_kind": kind,
            "condition": condition,
            **outcome.to_dict(),
        }
        if outcome.status in ("wrong", "error"):
            rec["failure_file"] = self.write_failure(case, spec, condition, outcome)
            log(f"WRONG {case.name} {spec.label()} {condition}: {outcome.reason[:300]}")
        self.records.append(rec)

    def write_failure(self, case: Any, spec: Any, condition: str, outcome: Any) -> str:
        self.failures += 1
        path = self.out / "failures" / f"{case.name}__{spec.engine}__{self.failures:04d}.json"
        doc = {
            "case": case.tags(),
            "graph": case.doc(),
            "engine": spec.engine,
            "knobs": dict(spec.knobs),
            "condition": condition,
            "outcome": outcome.to_dict(),
            "history": {
                "seed": self.args.seed,
                "size": self.args.size,
                "primed": list(self.primed),
                "tuned": list(self.tuned),
            },
            "device": self.args.device,
            "replay": f"python benchmarks/conformance.py --replay {path} --device "
            f"{self.args.device}",
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")
        graph_path = path.with_suffix(".graph.json")
        graph_path.write_text(case.graph_json + "\n")
        return str(path)

    # ---- one plan -----------------------------------------------------------------------------
    def compile_capped(self, case: Any, spec: Any, kind: str) -> bool:
        """torch.compile costs seconds per plan: its default plan runs on the first case of
        each (op, dtype), its variants on the first case of each op, at most --compile-cap
        builds in all (what was left out is counted in coverage.compile_skipped)."""
        from _conformance_plans import BENCHMARKING, COMPILE

        if spec.engine != COMPILE:
            return False
        subset = self.compile_variant_cases if kind == "variant" else self.compile_cases
        autotunes = spec.knobs.get(BENCHMARKING) or "max-autotune" in str(
            spec.knobs.get("torch_compile.mode", "")
        )
        if autotunes and not self.args.compile_max_autotune:
            self.coverage["compile_max_autotune_skipped"] += 1
            return True
        if case.index not in subset or self.compile_builds >= self.args.compile_cap:
            self.coverage["compile_skipped"] += 1
            return True
        self.compile_builds += 1
        return False

    def check_plan(
        self, case: Any, problem: Any, spec: Any, conditions: tuple[str, ...], kind: str
    ) -> None:
        from _conformance_plans import Outcome, build, check_after_launches, check_first_call

        if self.compile_capped(case, spec, kind):
            return
        built = build(problem, spec)
        if isinstance(built, Outcome):
            self.record(case, spec, conditions[0], built, kind)
            return
        for condition in conditions:
            if condition == "after_100_launches":
                outcome = check_after_launches(problem, built, self.args.launches)
            else:
                outcome = check_first_call(problem, built)
            self.record(case, spec, condition, outcome, kind)

    def check_defaults(self, case: Any, problem: Any, conditions: tuple[str, ...]) -> None:
        """Every applicable engine's default plan of ``case``, under ``conditions``."""
        from _conformance_plans import plan_specs

        for engine in self.engines_for(case, problem):
            for spec in plan_specs(problem.graph, engine, variants=False):
                self.check_plan(case, problem, spec, conditions, "default")

    def check_heuristic(self, case: Any, problem: Any, condition: str) -> None:
        from _conformance_plans import Outcome, PlanSpec, build_heuristic, check_first_call

        built = build_heuristic(problem)
        spec = PlanSpec("HEURISTIC_A", {}, ["heuristic"])
        if isinstance(built, Outcome):
            self.record(case, spec, condition, built, "heuristic")
            return
        spec.sources.append(built.name)
        self.record(case, spec, condition, check_first_call(problem, built), "heuristic")

    def problem(self, case: Any) -> Any:
        from _conformance_plans import Outcome, PlanSpec, Problem

        try:
            return Problem.make(case.doc(), self.handle, seed=self.args.seed)
        except Exception as exc:
            spec = PlanSpec("REFERENCE", {}, ["reference"])
            self.record(
                case,
                spec,
                "first_call",
                Outcome("error", f"inputs/reference raised {type(exc).__name__}: {exc}"),
                "reference",
            )
            return None

    def engines_for(self, case: Any, problem: Any) -> list[str]:
        # an engine for another device or without its dependency is not applicable here (the
        # run says why, once); a graph it does not support is a refusal, through the build path
        return [e for e in self.engines if e not in self.unavailable]

    # ---- phases --------------------------------------------------------------------------------
    def phase_defaults(self, cases: list[Any]) -> list[Any]:

        done = []
        for i, case in enumerate(cases):
            if not self.before("defaults"):
                log(f"defaults: time share used after {i} of {len(cases)} cases")
                break
            problem = self.problem(case)
            if problem is None:
                continue
            self.check_defaults(case, problem, ("first_call", "after_100_launches"))
            self.check_heuristic(case, problem, "first_call")
            done.append(case)
            if i % 25 == 0:
                log(f"defaults: {i + 1}/{len(cases)} {case.name} ({self.elapsed():.0f} s)")
        self.coverage["cases_defaults"] = len(done)
        return done

    def subset(self, cases: list[Any], per: int, key: Any) -> list[Any]:
        seen: dict[Any, int] = defaultdict(int)
        out = []
        for case in cases:
            if seen[key(case)] < per:
                seen[key(case)] += 1
                out.append(case)
        return out

    def phase_variants(self, cases: list[Any]) -> None:
        """Every variant of every engine that supports the graph, on the first cases of each
        cell: first everything but the Triton solver configs (cheap), then those (each a
        compile of about a second), so that a short budget still covers every cell."""
        subset = self.subset(cases, self.args.variant_cases, lambda c: c.cell)
        done: dict[str, int] = defaultdict(int)
        # the knob pass may use at most KNOB_PASS_SHARE of what is left of the phase, so that
        # a budget too short for every cell still checks some solver configs
        end = self.phase_end.get("variants", 1.0) * self.args.time_budget_s
        knob_deadline = self.elapsed() + KNOB_PASS_SHARE * max(0.0, end - self.elapsed())
        passes = (False, True) if self.args.solver_configs else (False,)
        for solver_pass in passes:
            deadline = end if solver_pass or len(passes) == 1 else knob_deadline
            for case in subset[self.args.variant_from :]:
                if self.elapsed() >= deadline:
                    break
                if self.variants_of(case, solver_pass, deadline):
                    done["solver_configs" if solver_pass else "other"] += 1
            log(
                f"variants ({'solver configs' if solver_pass else 'knobs'}): "
                f"{done['solver_configs' if solver_pass else 'other']}/{len(subset)} cases "
                f"({self.elapsed():.0f} s)"
            )
        self.coverage["cases_variants"] = done["other"]
        self.coverage["cases_variants_triton_solver_configs"] = done["solver_configs"]
        self.coverage["cases_variants_planned"] = len(subset)
        self.coverage["cases_variants_from"] = self.args.variant_from

    def variants_of(self, case: Any, solver_pass: bool, deadline: float) -> bool:
        from _conformance_plans import BENCHMARKING, plan_specs, supports

        problem = self.problem(case)
        if problem is None:
            return False
        for engine in self.engines_for(case, problem):
            if supports(problem.graph, self.handle, engine) is not None:
                continue  # its default plan was refused already, with the reason
            for spec in plan_specs(problem.graph, engine, variants=True, handle=self.handle):
                is_solver = spec.sources == ["triton_solver_config"]
                if spec.is_default or is_solver != solver_pass or self.elapsed() >= deadline:
                    continue
                self.check_plan(
                    case, problem, spec, ("first_call", "after_100_launches"), "variant"
                )
                if spec.knobs.get(BENCHMARKING) and case.index not in self.primed:
                    self.primed.append(case.index)
        return self.elapsed() < deadline

    def phase_tuning(self, cases: list[Any]) -> None:
        from _conformance_plans import COMPILE, Outcome, PlanSpec

        import dnntune as dt
        from dnntune import TuneOptions, allocate_workspace, tune_graph

        subset = self.subset(cases, self.args.tune_cases, lambda c: (c.op, c.dtype))
        override = Path(os.environ["DNNTUNE_CACHE_DIR"]) / "conformance_overrides.json"
        engines = [e for e in self.engines if e != COMPILE]
        for case in subset:
            if not self.before("tuning") or self.elapsed() > 0.75 * self.args.time_budget_s:
                break
            problem = self.problem(case)
            if problem is None:
                continue
            usable = [e for e in self.engines_for(case, problem) if e in engines]
            if not usable:
                continue
            options = TuneOptions(
                mode=dt.TuneMode.EXHAUSTIVE,
                engines=usable,
                sweep_knobs=True,
                seed=self.args.seed,
                max_iterations=20,
            )
            graph = dt.Graph.from_json(case.doc())
            report = tune_graph(graph, self.handle, options, output=override)
            self.tuned.append(case.index)
            for result in report.results:
                if result.verified is False:  # the tuner's own check caught a wrong candidate
                    knobs = {s.knob_id: s.value for s in result.knob_settings}
                    wrong = PlanSpec(result.engine_name, knobs, ["autotune candidate"])
                    why = Outcome("wrong", result.error_message, result.max_abs_error)
                    self.record(case, wrong, "autotune_candidate", why, "tuned")
            spec = PlanSpec("AUTOTUNE_WINNER", {}, ["tune_graph EXHAUSTIVE"])
            if report.error or graph.active_plan is None:
                self.record(
                    case, spec, "autotune_winner", Outcome("refused", report.error), "tuned"
                )
                continue
            spec.sources.append(graph.get_plan_name())
            problem.poison_outputs()
            try:
                workspace = allocate_workspace(graph.get_workspace_size(), self.handle.device)
                graph.execute(self.handle, problem.pack, workspace)
                self.handle.synchronize()
                outcome = problem.compare()
            except Exception as exc:
                outcome = Outcome("error", f"execute raised {type(exc).__name__}: {exc}")
            outcome.plan_name = graph.get_plan_name()
            self.record(case, spec, "autotune_winner", outcome, "tuned")
            log(f"tuning: {case.name} -> {outcome.plan_name}: {outcome.status}")
        self.coverage["cases_tuned"] = len(self.tuned)
        if override.exists():
            os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = str(override)

    def recheck(self, cases: list[Any], condition: str, phase: str) -> list[Any]:
        """Rebuild every default and heuristic plan and check its first call."""

        tuned = set(self.tuned) | set(self.primed)
        ordered = [c for c in cases if c.index in tuned] + [
            c for c in cases if c.index not in tuned
        ]
        done = []
        for case in ordered:
            if not self.before(phase):
                break
            problem = self.problem(case)
            if problem is None:
                continue
            self.check_defaults(case, problem, (condition,))
            self.check_heuristic(case, problem, condition)
            done.append(case)
        self.coverage[f"cases_{condition}"] = len(done)
        log(f"{condition}: {len(done)} cases re-checked ({self.elapsed():.0f} s)")
        return done

    def phase_new_process(self, cases: list[Any]) -> None:
        left = self.args.time_budget_s - self.elapsed() - 5
        if left < 20 or not cases:
            log("new_process: no time left")
            return
        sub_out = self.out / "new_process"
        indices = self.out / "new_process_cases.json"
        indices.write_text(json.dumps([c.index for c in cases]))
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--recheck-cases",
            str(indices),
            "--device",
            self.args.device,
            "--size",
            self.args.size,
            "--seed",
            str(self.args.seed),
            "--engines",
            ",".join(self.engines),
            "--time-budget-s",
            str(int(left)),
            "--compile-cap",
            str(max(0, self.args.compile_cap - self.compile_builds)),
            "--out",
            str(sub_out),
        ]
        log(f"new_process: {len(cases)} cases in a fresh process ({int(left)} s)")
        subprocess.run(cmd, env=dict(os.environ), check=False, timeout=left + 60)
        result_file = sub_out / "results.json"
        if result_file.exists():
            sub = json.loads(result_file.read_text())
            self.records.extend(sub["records"])
            self.coverage["cases_new_process"] = sub["run"]["coverage"].get("cases_new_process", 0)

    # ---- result ---------------------------------------------------------------------------------
    def result(self, argv: list[str], cases_total: int) -> dict[str, Any]:
        machine, versions = machine_and_versions(self.args.device)
        return {
            "run": {
                "command": "python benchmarks/conformance.py " + shlex.join(argv),
                "argv": argv,
                "machine": machine,
                "versions": versions,
                "device": self.args.device,
                "size": self.args.size,
                "seed": self.args.seed,
                "shard": self.args.shard,
                "engines": self.engines,
                "not_applicable": self.unavailable,
                "cases": {"total": cases_total},
                "coverage": dict(self.coverage),
                "caps": {
                    "variant_cases_per_cell": self.args.variant_cases,
                    "tune_cases_per_op_dtype": self.args.tune_cases,
                    "torch_compile_builds": self.args.compile_cap,
                    "torch_compile_builds_used": self.compile_builds,
                    "torch_compile_max_autotune": self.args.compile_max_autotune,
                    "launches": self.args.launches,
                    "phases": self.args.phases,
                    "phase_end_shares": self.phase_end,
                },
                "time_budget_s": self.args.time_budget_s,
                "wall_s": self.elapsed(),
                "cache_dir": os.environ.get("DNNTUNE_CACHE_DIR"),
            },
            "records": self.records,
        }


def shard_cases(args: argparse.Namespace) -> list[Any]:
    from dnntune.testing.conformance import generate_case

    k, n = (int(v) for v in args.shard.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--shard {args.shard}: expected k/n with 1 <= k <= n")
    return [generate_case(args.seed, i, args.size) for i in range(args.count) if i % n == k - 1]


def run_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    from _conformance_report import counts, write

    sweep = Sweep(args)
    if args.recheck_cases:
        from dnntune.testing.conformance import generate_case

        indices = json.loads(Path(args.recheck_cases).read_text())
        cases = [generate_case(args.seed, i, args.size) for i in indices]
        sweep.compile_cases = {c.index for c in sweep.subset(cases, 1, lambda c: (c.op, c.dtype))}
        sweep.recheck(cases, "new_process", "all")
        result = sweep.result(argv, len(cases))
        write(result, sweep.out)
        return 0
    cases = shard_cases(args)
    sweep.compile_cases = {c.index for c in sweep.subset(cases, 1, lambda c: (c.op, c.dtype))}
    sweep.compile_variant_cases = {c.index for c in sweep.subset(cases, 1, lambda c: c.op)}
    log(
        f"{len(cases)} cases (shard {args.shard}), engines {sweep.engines}, cache "
        f"{os.environ.get('DNNTUNE_CACHE_DIR')}"
    )
    phases = args.phases
    done = sweep.phase_defaults(cases) if "defaults" in phases else cases
    if "variants" in phases:
        sweep.phase_variants(done)
    rechecked = []
    if "tuning" in phases:
        sweep.phase_tuning(done)
        rechecked = sweep.recheck(done, "after_tuning", "tuning")
    if "new_process" in phases:
        sweep.phase_new_process(rechecked or done)
    result = sweep.result(argv, len(cases))
    write(result, sweep.out)
    total = counts(result["records"])
    log(f"done: {total} -> {sweep.out / 'matrix.md'}")
    return 1 if total["wrong"] else 0


# ---- several GPUs, merge, replay ------------------------------------------------------------
def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` less each of ``flags`` and its value (``--flag v`` or ``--flag=v``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            out.append(arg)
    return out


def run_gpus(args: argparse.Namespace, argv: list[str]) -> int:
    from _conformance_report import counts, merge, write

    procs = []
    outs = []
    for i in range(args.gpus):
        out = Path(args.out) / f"shard{i + 1}"
        outs.append(out / "results.json")
        # --shard k/n with --gpus g: this call runs shards (k-1)*g+1 .. k*g of n*g
        k, n = (int(v) for v in args.shard.split("/"))
        child = _without(argv, ("--gpus", "--shard", "--out"))
        shard = f"{(k - 1) * args.gpus + i + 1}/{n * args.gpus}"
        child = [*child, "--shard", shard, "--out", str(out)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), *child], env=env))
    for p in procs:
        p.wait()
    present = [p for p in outs if p.exists()]
    result = merge(present)
    result["run"]["command"] = "python benchmarks/conformance.py " + shlex.join(argv)
    write(result, Path(args.out))
    total = counts(result["records"])
    log(f"merged {len(present)}/{len(outs)} shards: {total} -> {Path(args.out) / 'matrix.md'}")
    return 1 if total["wrong"] or len(present) < len(outs) else 0


def run_merge(paths: list[str], out: str) -> int:
    from _conformance_report import counts, merge, write

    result = merge([Path(p) for p in paths])
    write(result, Path(out))
    total = counts(result["records"])
    log(f"merged {len(paths)} files: {total} -> {Path(out) / 'matrix.md'}")
    return 1 if total["wrong"] else 0


def replay_items(path: Path) -> list[dict[str, Any]]:
    """What ``--replay FILE`` re-runs: a failures/*.json of this script (one plan), a plain
    graph JSON (every engine's default plan), or a ``dnntune bench -o results.json`` file (each
    failed row, and each oracle plan that failed the reference, with its knobs)."""
    doc = json.loads(path.read_text())
    if "graph" in doc:
        return [doc]
    if "graphs" not in doc:
        return [{"graph": doc, "engine": None, "knobs": {}, "condition": "first_call"}]
    items = []
    for entry in doc["graphs"]:
        graph_path = Path(entry.get("graph_path") or "")
        if not graph_path.exists():
            graph_path = path.parent / graph_path
        for row in entry.get("results", []):
            engine = row["engine"]["name"]
            tuned = row.get("oracle") or {}
            wrong_tuned = (tuned.get("correctness") or {}).get("match") is False
            for knobs, failed in (
                (row.get("knob_settings", []), row.get("verdict") == "failed"),
                (tuned.get("knob_settings", []), wrong_tuned),
            ):
                if failed and graph_path.is_file():
                    items.append(
                        {
                            "graph": json.loads(graph_path.read_text()),
                            "engine": engine,
                            "knobs": {k["knob_id"]: k["value"] for k in knobs},
                            "condition": "first_call",
                            "source": f"{graph_path} ({engine} row of {path})",
                        }
                    )
    return items


def run_replay(args: argparse.Namespace) -> int:
    """Re-run failing cases: each plan's first call and 100 launches, after (for the tuned
    conditions) the same priming and tuning that ran before it in the original process."""
    import dnntune as dt

    items = replay_items(Path(args.replay))
    if not items:
        print(f"replay: nothing failed in {args.replay}")
        return 0
    handle = dt.create_handle(args.device)
    wrong = sum(replay_one(item, handle, args.seed) for item in items)
    print("replay: still wrong" if wrong else "replay: every check passes")
    return 1 if wrong else 0


def _redo_history(history: dict[str, Any], handle: Any, seed: int) -> None:
    """The priming and tuning that ran in the original process before the failing check."""
    from _conformance_plans import BENCHMARKING, PlanSpec, Problem, build

    import dnntune as dt
    from dnntune import TuneOptions, tune_graph
    from dnntune.testing.conformance import generate_case

    case_seed, size = history.get("seed", 0), history.get("size", "small")
    for index in history.get("primed", []):
        other = Problem.make(generate_case(case_seed, index, size).doc(), handle, seed=seed)
        for engine in ("CUDNN_ENGINE", "TRITON_ENGINE", "TORCH_ENGINE"):
            build(other, PlanSpec(engine, {BENCHMARKING: 1}))
        log(f"replay: primed case {index}")
    override = Path(os.environ["DNNTUNE_CACHE_DIR"]) / "conformance_overrides.json"
    for index in history.get("tuned", []):
        g = dt.Graph.from_json(generate_case(case_seed, index, size).doc())
        options = TuneOptions(mode=dt.TuneMode.EXHAUSTIVE, sweep_knobs=True, max_iterations=20)
        tune_graph(g, handle, options, output=override)
        log(f"replay: tuned case {index}")
    if override.exists():
        os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = str(override)


def replay_one(doc: dict[str, Any], handle: Any, seed: int) -> int:
    """Replay one item of :func:`replay_items`; how many checks were wrong."""
    from _conformance_plans import (
        ENGINES,
        Outcome,
        PlanSpec,
        Problem,
        build,
        build_heuristic,
        check_after_launches,
        check_first_call,
        plan_specs,
        unavailable,
    )

    print(f"replay: {doc.get('source') or doc.get('case', {}).get('name', 'graph')}")
    problem = Problem.make(doc["graph"], handle, seed=seed)
    if doc.get("condition") in ("after_tuning", "new_process", "autotune_winner"):
        _redo_history(doc.get("history", {}), handle, seed)
    engine = doc.get("engine")
    if engine and engine not in ("HEURISTIC_A", "AUTOTUNE_WINNER", "REFERENCE"):
        specs = [PlanSpec(engine, doc.get("knobs", {}))]
    else:
        here = [e for e in ENGINES if e not in unavailable(list(ENGINES), handle.device.type)]
        specs = [s for e in here for s in plan_specs(problem.graph, e, variants=False)]
    wrong = 0
    for spec in specs:
        built = build(problem, spec)
        if isinstance(built, Outcome):
            print(f"  {spec.label()}: {built.status}: {built.reason}")
            wrong += built.status in ("wrong", "error")
            continue
        for name, check in (
            ("first_call", check_first_call),
            ("after_100_launches", check_after_launches),
        ):
            outcome = check(problem, built)
            print(f"  {spec.label()} {name}: {outcome.status} {outcome.reason}")
            wrong += outcome.status in ("wrong", "error")
    heuristic = build_heuristic(problem)
    if not isinstance(heuristic, Outcome):
        outcome = check_first_call(problem, heuristic)
        print(f"  heuristic A ({heuristic.name}) first_call: {outcome.status} {outcome.reason}")
        wrong += outcome.status in ("wrong", "error")
    return wrong


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=None, help="cases (default 1500 cuda, 60 cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--size",
        choices=("small", "full"),
        default=None,
        help="shape scale (default: full on cuda, small on cpu)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--engines", default="", help="comma list (default: all four)")
    p.add_argument("--shard", default="1/1", help="k/n: cases with index %% n == k-1")
    p.add_argument("--gpus", type=int, default=0, help="run one shard per GPU and merge")
    p.add_argument("--out", default="conformance-out")
    p.add_argument("--time-budget-s", type=float, default=480.0)
    p.add_argument(
        "--variant-cases",
        type=int,
        default=1,
        help="cases per (op, dtype, shape class) cell that get every variant",
    )
    p.add_argument(
        "--variant-from",
        type=int,
        default=0,
        help="start the variants phase at this case of its subset (to cover the cells that an "
        "earlier run's budget did not reach)",
    )
    p.add_argument(
        "--no-solver-configs",
        dest="solver_configs",
        action="store_false",
        help="leave out the Triton solver-config pass (the knob pass gets the whole phase)",
    )
    p.add_argument(
        "--tune-cases",
        type=int,
        default=1,
        help="cases per (op, dtype) that get a full EXHAUSTIVE autotune",
    )
    p.add_argument(
        "--compile-cap",
        type=int,
        default=None,
        help="most torch.compile plan builds (default 80 cuda, 12 cpu)",
    )
    p.add_argument(
        "--compile-max-autotune",
        action="store_true",
        help="also TORCH_COMPILE_ENGINE's max-autotune variants (minutes per graph on a GPU)",
    )
    p.add_argument("--launches", type=int, default=100)
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="comma list of the phases to run, in order (default all: "
        + ", ".join(PHASES)
        + "); e.g. --phases variants --variant-cases 3 gives a run's budget to the variants",
    )
    p.add_argument(
        "--replay",
        default=None,
        help="re-run a failures/*.json file, a graph JSON, or a `dnntune bench` results.json",
    )
    p.add_argument("--recheck-cases", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    args.size = args.size or ("full" if cuda else "small")
    args.count = args.count if args.count is not None else (1500 if cuda else 60)
    args.compile_cap = args.compile_cap if args.compile_cap is not None else (200 if cuda else 40)
    args.phases = [ph.strip() for ph in args.phases.split(",") if ph.strip()]
    unknown = [ph for ph in args.phases if ph not in PHASES]
    if unknown or not args.phases:
        p.error(f"--phases: unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        m = argparse.ArgumentParser(prog="conformance.py merge")
        m.add_argument("results", nargs="+")
        m.add_argument("--out", required=True)
        margs = m.parse_args(argv[1:])
        return run_merge(margs.results, margs.out)
    args = parse(argv)
    if not args.recheck_cases:
        # a cache dir of its own (the new-process re-check inherits it), so the databases
        # this run reads are the ones it wrote, and no override file from elsewhere applies
        os.environ["DNNTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnntune-conformance-")
        os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
    if args.replay:
        return run_replay(args)
    if args.gpus:
        return run_gpus(args, argv)
    return run_sweep(args, argv)


if __name__ == "__main__":
    sys.exit(main())
