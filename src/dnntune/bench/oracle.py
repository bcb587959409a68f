"""``--oracle``: how much speed the heuristic plan leaves on the table, per engine row.

Order of passes (seed 003; pinned by a unit test): the OOTB row is timed first; then this
engine is autotuned (``engine_id_filter`` = this engine, every knob variant) in a plan set of
its own beside the row context's graph (``PlanSet``; the graph itself is only read); then,
under identical conditions (same buffers, outputs zeroed), the heuristic plan is re-timed (the
warm baseline) and the tuned plan is timed right after. The speedup compares those two, so
warmup history cannot fake a gain. A tuning failure is recorded as ``oracle_error`` and never
changes the OOTB row.

The tune does not build the row's plan again: the OOTB plan goes to ``autotune()`` as the
plan of this engine's default-knob spec (``PlanSet.prebuilt``), so the default every variant
must beat is the very plan the row timed, and a build per row is saved (for
TORCH_COMPILE_ENGINE, an Inductor compile). Under ``exhaustive`` it is the unprimed default;
primed candidates are built from their search as before.

Tune mode (``--oracle-mode``): ``standard`` tunes the engine's plans and knob variants, where a
provider's own search (``Knob.search_values``: torch.compile's max-autotune) is not a variant;
``exhaustive`` primes every candidate with the engine's own search first (cuDNN's
benchmarking, torch.compile's max-autotune), tens of seconds per graph on a GPU.

Never worse than the default: inside ``autotune()`` this engine's default-knob plan (the OOTB
row's plan) is the default every variant must beat in fresh interleaved rounds, on the device
clock (``ranking_metric="device"``), the kernel basis the delta reports
(``dnntune.autotune.confirm``); a variant that does not is not the tuned plan. The row's
``oracle`` block records the verdict (``decision``, ``kept_default``) and the confirmation's
own speedup and noise.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dnntune.autotune.failures import UNSUPPORTED
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.plan_specs import PlanSpecCollection
from dnntune.autotune.session import run_autotune
from dnntune.autotune.variants import knob_variants
from dnntune.autotune.verdicts import WINNER_IS_DEFAULT
from dnntune.backend.engine import Engine
from dnntune.backend.estimates import deferred_workspace_size, estimates_without_builds
from dnntune.backend.knobs import BENCHMARKING, KnobValue
from dnntune.backend.plans import allocate_workspace
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.bench.rows import (
    PlanRunner,
    RowContext,
    correctness_of,
    knob_list,
    timing_fields,
)
from dnntune.bench.timing import PlanTiming
from dnntune.errors import AutotuneError
from dnntune.rfc import AutotuneConfig, AutotuneStrategy, EngineVariant, TuneMode
from dnntune.workflows.tune_report import cost_of

__all__ = ["oracle_delta", "oracle_error", "oracle_variants", "run_oracle"]

_log = logging.getLogger(__name__)


def oracle_delta(
    baseline: PlanTiming | None,
    tuned: PlanTiming | None,
    valid: bool = True,
    same_plan: bool = False,
) -> dict[str, Any] | None:
    """baseline median / tuned median (kernel basis); None without both sides or if invalid.

    ``same_plan``: tuning kept the heuristic plan (its knobs won, or no variant beat them
    beyond noise), so the two timings are of one plan and their ratio is the clock's noise:
    the speedup is 1.0 (``same_plan`` True; both medians stay as measured)."""
    if baseline is None or tuned is None or not valid:
        return None
    b, t = baseline.kernel.median_ms, tuned.kernel.median_ms
    if b <= 0 or t <= 0:
        return None
    return {
        "basis": "kernel",
        "baseline_median_ms": b,
        "tuned_median_ms": t,
        "delta_ms": 0.0 if same_plan else b - t,
        "speedup": 1.0 if same_plan else b / t,
        "same_plan": same_plan,
    }


def oracle_error(exc: Exception) -> str:
    """``oracle_error`` for a tune that raised: the error, then the engine's own failure.

    When no candidate succeeds, ``autotune()``'s message only counts the failures ("see each
    result's error_message"), and the row keeps no results to see, so the reason (a wrong
    output, an execute error) was lost. Seed 003 reports the target engine's own failure: the
    first candidate that was tried and failed, not one a caller-side filter rejected
    (``excluded_by_caller``) or a variant this device cannot run (``unsupported``)."""
    text = f"{type(exc).__name__}: {exc}"
    results = exc.results if isinstance(exc, AutotuneError) else []
    tried = [r for r in results if not r.succeeded and r.error_message]
    tried = [r for r in tried if not r.excluded_by_caller] or tried
    own = [r for r in tried if r.failure_kind != UNSUPPORTED] or tried
    if not own:
        return text
    first = own[0]
    return f"{text}. {first.plan_name or first.engine_name}: {first.error_message}"


def oracle_variants(
    engine: Engine, graph: Any, mode: TuneMode = TuneMode.STANDARD
) -> list[dict[str, KnobValue]]:
    """The knob variants the oracle tunes ``engine`` over, beside its default-knob spec.

    Never a value that runs the engine's own search (``Knob.search_values``: torch.compile's
    max-autotune, Triton's tuning policies 3 and 4) or writes or deletes its persistent records
    (``Knob.persistent_values``: Triton's policies 3-5): searching is EXHAUSTIVE's priming,
    and a perf db changed mid-run changes the plans of the rows after it. Under STANDARD, also
    none that provably builds the default's plan or another variant's (``distinct``:
    ``Knob.default_plan_values``, such as a Triton pin of the value the default config has or
    policies 1 and 2, which decide as the default does; ``Knob.plan_key``, such as a cuDNN
    ``(heur_mode, engine_config)`` pair naming an engine config already in the sweep). Under
    EXHAUSTIVE every candidate is primed with a search, where a pin's search covers another
    space than the default's, so the duplicates are kept. The oracle ranks on the device clock
    (:func:`_tune`), so under STANDARD also none that launches the default's kernels and
    changes only their submission (``Knob.same_kernel_values``: torch.compile's
    reduce-overhead, the same kernels replayed through a CUDA graph)."""
    return knob_variants(engine, graph, distinct=mode is TuneMode.STANDARD, device_clock=True)


def _tune(
    ctx: RowContext,
    engine: Engine,
    warmup: int,
    budget_s: float | None = None,
    mode: TuneMode = TuneMode.STANDARD,
    ootb: PlanRunner | None = None,
) -> tuple[PlanRunner, dict[str, Any]]:

    graph = ctx.op_graph
    # building the plan specs counts (wall time and budget): their workspace estimates build
    # plans (cuDNN builds each engine config, a runtime compile for a norm), which
    # autotune()'s own summary does not see
    setup_start = time.perf_counter()
    specs = PlanSpecCollection(graph, ctx.handle)
    specs.add_engine(engine.id)
    # standard: only variants that build distinct plans, none that searches or writes the
    # engine's records (see oracle_variants); exhaustive primes each candidate with a search
    # anyway, and a pin's search covers another space than the default's
    variants = [EngineVariant(engine.id, v) for v in oracle_variants(engine, graph, mode)]
    if variants:
        # under --budget-s the variants' plans are built when the search reaches them, if it
        # does, not all of them for their workspace estimates first (backend.estimates)
        with estimates_without_builds(budget_s is not None):
            specs.add_engine_variants(variants)
    # the row's heuristic plan is the default-knob spec's plan, built moments ago on this graph
    # and handle: the tune takes it rather than building it again (for TORCH_COMPILE_ENGINE,
    # an Inductor compile per row)
    prebuilt = (ootb.plan,) if ootb is not None else ()
    plans = PlanSet(handle=ctx.handle, specs=specs, prebuilt=prebuilt)
    ws_size = specs.estimated_max_workspace_size()
    if budget_s is not None and variants:
        ws_size = deferred_workspace_size(ws_size, ctx.handle.device.type)
    workspace = allocate_workspace(max(ws_size, 0), ctx.handle.device)
    config = AutotuneConfig(
        # standard: this engine's plans and knob variants; exhaustive: each primed with the
        # engine's own search first (cuDNN's benchmarking, torch.compile's max-autotune)
        mode=mode,
        engine_id_filter=[engine.id],
        warmup_iterations=max(1, warmup),
        strategy=AutotuneStrategy.RUN_UNTIL_STABLE,
        # rank and confirm on the clock the oracle reports (oracle_delta's kernel basis): on
        # the call-latency clock, host-bound rows of the H200 run confirmed torch.compile
        # modes whose kernels were 2-3x slower (speedup 0.35x-0.82x in the same row)
        ranking_metric="device",
        rtol=ctx.rtol,
        atol=ctx.atol,
        # what the setup left of the budget (the first candidate always runs)
        time_budget_s=None
        if budget_s is None
        else max(budget_s - (time.perf_counter() - setup_start), 1e-3),
    )
    setup_ms = (time.perf_counter() - setup_start) * 1e3
    outcome = run_autotune(graph, plans, ctx.handle, ctx.pack, workspace, ws_size, config)
    tuning_ms = (time.perf_counter() - setup_start) * 1e3
    results, plan = outcome.results, outcome.winner
    if plan.engine.id != engine.id:
        raise RuntimeError(f"autotune chose no plan of {engine.name}")
    summary = plans.summary
    conf = summary.confirmation if summary is not None else None
    # a variant the engine cannot run here (unsupported) was not tried, as tune counts it
    eligible = [r for r in results if not r.excluded_by_caller and r.failure_kind != UNSUPPORTED]
    ok = [r for r in eligible if r.succeeded]
    winner = ok[0]
    info = {
        "status": "ok",
        "plan_name": plan.name,
        "knob_settings": knob_list(plan.knob_settings),
        "rank": winner.rank,
        "compiled_plan_index": winner.compiled_plan_index,
        "sweep_min_time_ms": winner.min_time_ms,
        "candidates_benchmarked": len(ok),
        "candidates_total": len(eligible),
        "candidates_failed": len(eligible) - len(ok),
        "tuning_available": len(eligible) > 1,
        "exhaustive_supported": any(k.knob_id == BENCHMARKING for k in engine.knobs(graph)),
        "tuning_wall_ms": tuning_ms,
        "mode": config.mode.value,
        "decision": conf.verdict if conf is not None else None,
        "kept_default": conf.kept_default if conf is not None else False,
        "confirmation": conf.to_dict() if conf is not None else None,
        # where the tuning time went (compile, priming, timing, re-check, confirmation), the
        # budget and the candidates it skipped
        "cost": {**cost_of(summary), "setup_ms": setup_ms},
        "candidates_skipped_budget": sum(1 for r in results if r.failure_kind == "budget"),
    }
    pack = normalize_variant_pack(graph, ctx.pack, ctx.handle)
    # The plan may need more than the estimate (post-compile); give it what it asks for.
    if plan.workspace_size > ws_size:
        workspace = allocate_workspace(plan.workspace_size, ctx.handle.device)
    return PlanRunner(graph, plan, pack, workspace, ctx.handle, tuning_ms), info


def run_oracle(
    ctx: RowContext,
    engine: Engine,
    ootb: PlanRunner,
    row: dict[str, Any],
    warmup: int,
    budget_s: float | None = None,
    mode: TuneMode = TuneMode.STANDARD,
) -> None:
    """Add ``oracle``, ``oracle_delta`` and ``oracle_error`` to ``row`` (never raises);
    ``mode``: the tune mode (``--oracle-mode``)."""
    row["oracle"] = None
    row["oracle_delta"] = None
    row["oracle_error"] = None
    try:
        tuned_runner, info = _tune(ctx, engine, warmup, budget_s, mode, ootb)
        ctx.zero_outputs()
        baseline = ctx.measure("baseline", ootb.run)
        ctx.zero_outputs()
        tuned = ctx.measure("tuned", tuned_runner.run)
        fields = timing_fields(ctx, tuned, tuned_runner.plan.workspace_size)
        info.update(
            kernel=fields["kernel"],
            host=fields["host"],
            tflops=fields["metrics"]["tflops"],
            baseline_kernel=baseline.kernel.to_dict(),
            baseline_host=baseline.host.to_dict(),
            baseline_tflops=ctx.metrics.tflops(baseline.kernel.median_ms),
        )
        info["correctness"] = correctness_of(ctx, tuned_runner)
        ootb_ok = row.get("correctness") is None or row["correctness"]["match"]
        tuned_ok = info["correctness"] is None or info["correctness"]["match"]
        row["oracle"] = info
        same = info["kept_default"] or info["decision"] == WINNER_IS_DEFAULT
        row["oracle_delta"] = oracle_delta(
            baseline, tuned, valid=ootb_ok and tuned_ok, same_plan=same
        )
    except Exception as exc:  # a tuning failure is recorded, never fatal
        row["oracle_error"] = oracle_error(exc)
        _log.info("bench: oracle for %s failed: %s", engine.name, row["oracle_error"])
