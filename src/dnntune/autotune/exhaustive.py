"""autotune_exhaustive_sweep (RFC 0013 section 6.4): every applicable engine, and the ranking.

:func:`run_exhaustive_sweep` is :func:`~dnntune.autotune.session.run_autotune` in EXHAUSTIVE
mode with BENCHMARK_UNPRIMED over the graph's plan specs (every applicable engine when none were
added), ranked by robust time. A complete sweep (no filter, no deselection, no knob variants, no
candidate excluded) is written to the exact-match ranking cache
(:func:`dnntune.overrides.exact_cache.write_ranking`), which later runs follow without timing; a
sweep timed while the CPU was busy is not written (``CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU``,
reported only where a quiet sweep would have been written: a disabled cache, an unkeyable graph
or a partial sweep say so instead, since sweeping again on a quiet machine would not change them).
The call returns every candidate's result, what became of the cache write and the winning plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.autotune.failures import BUDGET
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.plan_specs import PlanSpecCollection, engine_configs
from dnntune.autotune.preconditions import check_config, check_workspace
from dnntune.autotune.ranking import by_robust_time
from dnntune.autotune.session import run_autotune
from dnntune.backend.handle import Handle
from dnntune.backend.plans import allocate_workspace
from dnntune.errors import BadStateError, InvalidValueError, NotSupportedError
from dnntune.overrides.exact_cache import cache_key, cache_path, write_ranking
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneResult,
    CacheWriteOutcome,
    PrimingFailurePolicy,
    TuneMode,
)

if TYPE_CHECKING:
    import torch

    from dnntune.backend.engine import Plan
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = ["run_exhaustive_sweep"]

_log = logging.getLogger(__name__)


def _sweep_is_complete(
    deselect: DeselectCriteria,
    specs: PlanSpecCollection,
    results: Sequence[AutotuneResult],
    config: AutotuneConfig,
) -> tuple[bool, str]:
    if config.engine_id_filter:
        return False, "engine_id_filter is set"
    if deselect.engine_ids or deselect.workspace_limit is not None:
        return False, "deselect_*() criteria are set"
    engines = [s.engine_id for s in specs]
    if any(s.knob_settings for s in specs) or len(set(engines)) != len(engines):
        return False, "plan specs carry knob variants"
    skipped = sum(1 for r in results if r.failure_kind == BUDGET)
    if skipped:
        return False, (
            f"time_budget_s={config.time_budget_s:g} left no time for {skipped} candidate(s)"
        )
    if any(r.excluded_by_caller for r in results):
        return False, "some candidates were excluded (workspace limit)"
    return True, ""


def _write_ranking(
    graph: OpGraph,
    handle: Handle,
    results: list[AutotuneResult],
    sampled: list[int],
    complete: bool,
) -> CacheWriteOutcome:
    """:func:`write_ranking`, which reports an unwritable cache as DECLINED_DISABLED; anything
    else it raises (a ranking file it cannot parse) is reported the same way: the cache is a
    by-product, and the sweep's results and winner must not be lost to it."""
    try:
        return write_ranking(graph, handle, results, sampled, complete)
    except Exception as exc:
        where = "?"
        with contextlib.suppress(Exception):  # (unkeyable: write_ranking says so itself)
            where = str(cache_path(cache_key(graph, handle)))
        _log.warning(
            "autotune: exhaustive sweep of %s: the exact-match ranking cache %s could not be "
            "written (%s: %s); the ranking is not kept",
            graph.name,
            where,
            type(exc).__name__,
            str(exc)[:200],
        )
        return CacheWriteOutcome.DECLINED_DISABLED


def run_exhaustive_sweep(
    graph: OpGraph,
    plan_set: PlanSet,
    handle: Handle,
    variant_pack: Mapping[Any, Any],
    workspace: torch.Tensor | None,
    workspace_size: int | None,
    config: AutotuneConfig | None = None,
) -> tuple[list[AutotuneResult], CacheWriteOutcome, Plan]:
    """EXHAUSTIVE + BENCHMARK_UNPRIMED over the plan specs (every applicable engine if none
    were added), ranked by robust time unless ``config.ranking_fn`` is given; a complete sweep
    is written to the exact-match ranking cache.

    ``workspace_size=None`` means the workspace's size, or (no workspace) a workspace of the
    estimated maximum allocated here.
    """
    base = check_config(config)
    config = dataclasses.replace(
        base,
        mode=TuneMode.EXHAUSTIVE,
        priming_failure_policy=PrimingFailurePolicy.BENCHMARK_UNPRIMED,
    )
    if not isinstance(handle, Handle):
        raise InvalidValueError(
            f"autotune_exhaustive_sweep: handle must be a Handle, got {handle!r}"
        )
    if plan_set.handle is None:
        raise BadStateError("autotune_exhaustive_sweep: call build_operation_graph(handle) first")
    if plan_set.plans is not None:
        raise BadStateError(
            "autotune_exhaustive_sweep: the graph has execution plans; the sweep runs on the "
            "plan-spec path (EXHAUSTIVE), which is mutually exclusive with compiled plans"
        )
    specs = plan_set.specs
    if specs is None or len(specs) == 0:
        configs = engine_configs(graph, handle)
        if not configs:
            raise NotSupportedError(
                f"autotune_exhaustive_sweep: no engine applies to graph {graph.name!r} on "
                f"{handle.device}; see `dnntune engines`"
            )
        specs = PlanSpecCollection(graph, handle)
        specs.add_engine_configs(configs)
        plan_set.specs = specs
    if workspace_size is None:
        if workspace is not None:
            workspace_size = check_workspace(workspace, None)
        else:
            workspace_size = specs.estimated_max_workspace_size()
            workspace = allocate_workspace(workspace_size, handle.device)
    start = time.perf_counter()
    outcome = run_autotune(
        graph,
        plan_set,
        handle,
        variant_pack,
        workspace,
        workspace_size,
        config,
        None,
        ranking_key=by_robust_time,
    )
    results = outcome.results
    complete, why = _sweep_is_complete(plan_set.deselect, specs, results, config)
    if not complete:
        _log.info("autotune: exhaustive sweep is partial (%s); ranking cache not written", why)
    sampled: list[int] = []
    for r in results:
        if r.engine_id not in sampled:
            sampled.append(r.engine_id)
    busy = outcome.summary is not None and outcome.summary.timed_while_busy
    if busy and complete:
        # what would keep even a quiet sweep's ranking out (a disabled cache, an unkeyable
        # graph) is reported first: write_ranking checks those before completeness, so asked
        # with complete=False it writes nothing and names them, else says "partial"
        written = _write_ranking(graph, handle, results, sampled, False)
        if written is CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP:
            written = CacheWriteOutcome.NOT_ATTEMPTED_BUSY_CPU
            assert outcome.summary is not None
            _log.info(
                "autotune: exhaustive sweep of %s timed while the CPU was busy (its threads "
                "waited for a core %.0f%% of the time); its ranking is not written to the "
                "exact-match cache, which later runs would follow without timing; sweep again "
                "with nothing else running",
                graph.name,
                100.0 * (outcome.summary.timing_cpu_wait_share or 0.0),
            )
    else:
        written = _write_ranking(graph, handle, results, sampled, complete)
    _log.info(
        "autotune: exhaustive sweep done in %.1f s - winner %s, ranking cache: %s",
        time.perf_counter() - start,
        outcome.winner.name,
        written.value,
    )
    return results, written, outcome.winner
