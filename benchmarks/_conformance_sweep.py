"""The sweep of ``benchmarks/conformance.py``: its phases and their share of the time budget,
and :class:`Sweep`, which generates the cases and checks every plan of each (first call, after
100 launches, after tuning, in a new process)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

from _conformance_report import log


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc``'s traceback, as file:line in function."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}"


#: the sweep's command line (its child processes run it again)
SCRIPT = Path(__file__).resolve().parent / "conformance.py"
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
        from _conformance_plans import Outcome, PlanSpec, Problem, shifted_case

        try:
            shifted = shifted_case(case.index)
            return Problem.make(case.doc(), self.handle, seed=self.args.seed, shifted=shifted)
        except Exception as exc:
            spec = PlanSpec("REFERENCE", {}, ["reference"])
            self.record(
                case,
                spec,
                "first_call",
                Outcome(
                    "error",
                    f"inputs/reference raised {type(exc).__name__}: {exc} (at {_where(exc)})",
                ),
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
        # the solver-config pass only where Triton runs: elsewhere (the CPU) it has nothing to
        # check, and the knob pass gets the whole phase instead of KNOB_PASS_SHARE of it (the
        # CPU sweep of session 24 reached 184 of 312 cells' variants for that reason)
        triton_here = "TRITON_ENGINE" in self.engines and "TRITON_ENGINE" not in self.unavailable
        wanted_passes = ((False, self.args.knob_pass), (True, self.args.solver_configs))
        passes = tuple(
            solver for solver, wanted in wanted_passes if wanted and (triton_here or not solver)
        )
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
