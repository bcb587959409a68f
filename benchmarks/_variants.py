"""The four ways a graph is run, and the warm start: each built, run once and checked.

(a) ``eager``: the graph as the torch calls a user writes (``_eager.translate``);
(b) ``compile``: ``torch.compile(eager, mode="max-autotune-no-cudagraphs")``, its first call
    timed as the compile wall time (with a per-graph timeout);
(c) ``heuristic``: dnntune's out-of-the-box plan (``create_execution_plans([A])`` +
    ``build_plans(HEURISTICS_CHOICE)``), run through ``Plan.execute`` on a pack normalized once;
(d) ``tuned``: ``add_all_engines`` + ``add_suggested_variants`` + ``autotune`` ranking on the
    clock the table reports (``tune_ranking_metric``, "device" by default: equal conditions),
    its wall time the tuning cost, the winner written to the run's override file;
    ``exhaustive`` (``--exhaustive``): the same in ``TuneMode.EXHAUSTIVE``, after it, into a
    file of its own; ``heuristic_b`` (``--heuristic-b``): (c) with ``HeuristicMode.B``;
(e) ``warm_start``: a fresh graph built with ``DNNTUNE_HEUR_CONFIG_PATH`` pointing at that file:
    build time, the plan it picked, and how many spans were timed (zero: nothing benchmarked).

Each returns its info dict (``error`` set on an expected failure) and, when it can run, the
callable that the timing loop calls.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _eager import EagerProgram, translate
from _session import (
    COMPILE_MODE,
    MeasureOptions,
    Session,
    allocate_workspace,
    check_outputs,
    error_text,
    plan_outputs,
    zero_outputs,
)

import dnntune as dt
from dnntune.autotune import add_knob_variants, add_suggested_variants
from dnntune.graph import OpGraph

__all__ = [
    "CompileTimeout",
    "Runner",
    "compile_variant",
    "deadline",
    "eager_variant",
    "heuristic_variant",
    "tuned_variant",
    "warm_start",
]


class CompileTimeout(BaseException):
    """A BaseException, so that library code catching Exception (Inductor's autotuner treats
    a failing choice that way) cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
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


@dataclass
class Runner:
    run: Callable[[], object]
    info: dict[str, Any]


def eager_variant(
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
        info.update(check_outputs(graph, program.outputs(out), expected))
        info["ok"] = True
        return program, args, info
    except Exception as exc:
        info["error"] = error_text(exc)
        return None, (), info


def compile_variant(
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
    timeout = opts.compile_timeout_s
    if session.deadline is not None:  # near the end of the budget, a compile gets less time
        timeout = min(timeout, max(15.0, session.deadline - start + 30.0))
    info["timeout_s"] = timeout
    try:
        with deadline(timeout), torch.no_grad():
            out = compiled(*args)
            session.synchronize()
    except BaseException as exc:  # a compile failure or timeout is one row's data
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["error"] = error_text(exc)
        info["compile_s"] = time.perf_counter() - start
        session.compile_spent_s += info["compile_s"]
        torch._dynamo.reset()
        return None, info
    info["compile_s"] = time.perf_counter() - start
    session.compile_spent_s += info["compile_s"]
    info.update(check_outputs(graph, program.outputs(out), expected))
    info["ok"] = True

    def run() -> object:
        with torch.no_grad():
            return compiled(*args)

    return run, info


def heuristic_variant(
    session: Session,
    path: Path,
    pack: dict[int, torch.Tensor],
    expected: dict[int, torch.Tensor] | None,
    mode: dt.HeuristicMode = dt.HeuristicMode.A,
) -> tuple[Runner | None, dict[str, Any]]:
    """The plan heuristic ``mode`` picks, nothing timed: A, the static order (the suite's
    ``heuristic``), or B, the learned ranking (``heuristic_b``; where B declines a graph its
    plan is A's, and ``policy`` says which decided)."""
    handle = session.handle
    info: dict[str, Any] = {"ok": False}
    try:
        g = dt.Graph.load(path)
        g.build_operation_graph(handle)
        start = time.perf_counter()
        g.create_execution_plans([mode])
        g.check_support()
        g.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
        info["build_ms"] = (time.perf_counter() - start) * 1e3
        plan = g.active_plan
        assert plan is not None
        info["plan"] = plan.name
        info["engine"] = plan.engine.name
        info["policy"] = _policy(g)
        npack = dt.normalize_variant_pack(g, pack, handle)
        workspace = allocate_workspace(handle, plan.workspace_size)
        stream = handle.stream
        zero_outputs(g, npack)
        start = time.perf_counter()
        plan.execute(npack, workspace, stream)
        session.synchronize()
        info["first_call_ms"] = (time.perf_counter() - start) * 1e3
        info.update(check_outputs(g, plan_outputs(g, npack), expected))
        info["ok"] = True
        return Runner(lambda: plan.execute(npack, workspace, stream), info), info
    except Exception as exc:
        info["error"] = error_text(exc)
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


def tuned_variant(
    session: Session,
    path: Path,
    pack: dict[int, torch.Tensor],
    expected: dict[int, torch.Tensor] | None,
    mode: dt.TuneMode = dt.TuneMode.STANDARD,
    overrides: Path | None = None,
) -> tuple[Runner | None, dict[str, Any]]:
    """``autotune`` in ``mode``, its winner written to ``overrides`` (the session's file by
    default): the suite's ``tuned`` (STANDARD) or ``exhaustive`` variant."""
    handle, opts = session.handle, session.options
    info: dict[str, Any] = {"ok": False, "mode": mode.value}
    config = _tune_config(opts, mode)
    storage = dt.AutotuneStorageConfig(file_path=str(overrides or session.overrides_path))
    g = dt.Graph.load(path)
    results: list[dt.AutotuneResult] = []
    start = time.perf_counter()
    try:
        g.build_operation_graph(handle)
        g.add_all_engines()
        add_suggested_variants(g)
        if opts.tune_sweep_knobs:
            add_knob_variants(g)
        ws_size = g.get_estimated_max_workspace_size()
        workspace = allocate_workspace(handle, ws_size)
        results = g.autotune(
            handle, pack, workspace, workspace_size=ws_size, config=config, storage_config=storage
        )
    except dt.AutotuneError as exc:
        results = list(exc.results)
        info["error"] = error_text(exc)
    except Exception as exc:
        info["error"] = error_text(exc)
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
            workspace = allocate_workspace(handle, plan.workspace_size)
        npack = dt.normalize_variant_pack(g, pack, handle)
        stream = handle.stream
        zero_outputs(g, npack)
        plan.execute(npack, workspace, stream)
        session.synchronize()
        info.update(check_outputs(g, plan_outputs(g, npack), expected))
        info["ok"] = True
        return Runner(lambda: plan.execute(npack, workspace, stream), info), info
    except Exception as exc:
        info["error"] = error_text(exc)
        return None, info


def _policy(g: dt.Graph) -> str | None:
    """The policy that chose the plan: the decision of create_execution_plans' one query."""
    decision = g.plan_set.plans.decision if g.plan_set.plans is not None else None
    return None if decision is None else decision.policy


def _tune_config(opts: MeasureOptions, mode: dt.TuneMode) -> dt.AutotuneConfig:
    """The suite's fixed tuning settings, or (``tune_defaults``) the library's defaults with
    only the clock, the engine filter, verification and the candidate timeout set."""
    common: dict[str, Any] = {
        "mode": mode,
        "engine_id_filter": [dt.engine_name_or_id(e) for e in opts.tune_engines],
        "verify": True,
        "candidate_timeout_s": opts.tune_candidate_timeout_s,
        "ranking_metric": opts.tune_ranking_metric,
    }
    if opts.tune_defaults:
        return dt.AutotuneConfig(**common)
    return dt.AutotuneConfig(
        strategy=dt.AutotuneStrategy.RUN_UNTIL_STABLE,
        warmup_iterations=opts.tune_warmup,
        max_iterations=opts.tune_max_iters,
        window_size=min(3, opts.tune_max_iters),
        **common,
    )


def warm_start(
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
        info["policy"] = _policy(g)
        npack = dt.normalize_variant_pack(g, pack, handle)
        workspace = allocate_workspace(handle, plan.workspace_size)
        start = time.perf_counter()
        plan.execute(npack, workspace, handle.stream)
        handle.synchronize()
        info["first_call_ms"] = (time.perf_counter() - start) * 1e3
        info["timed_spans"] = timer.calls
        info["ok"] = True
    except Exception as exc:
        info["error"] = error_text(exc)
    finally:
        if saved is None:
            os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
        else:
            os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = saved
    return info
