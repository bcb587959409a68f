"""Tune one graph, or a library of graphs, into an engine-override file, and say what it bought.

This is the library half of ``dnntune tune`` (the CLI only parses, shows and exits). For each
graph, :func:`tune_graph`:

1. builds the graph and makes inputs (``reference.make_inputs``);
2. asks the heuristics for the out-of-the-box plan (:func:`heuristic_plan`: the policy chain
   asked once, its first supported plan built), a value beside the graph's own plans
   (``backend.plan_choice.choose_plan``), so the tuned graph's state is untouched;
3. runs ``add_all_engines`` + ``add_suggested_variants`` + ``autotune``; the session confirms
   the winner against the heuristic plan (a candidate like the others) in fresh interleaved
   rounds after the sweep (seed 003: the sweep warms the device, so a heuristic number from
   before it would flatter tuning), and keeps the heuristic plan when the winner does not beat
   it beyond noise (``dnntune.autotune.confirm``);
4. if the session could not compare them (the heuristic's candidate failed while tuning), the
   same confirmation runs here on the two finished plans;
5. only then writes the graph's entry to the override file (so an interrupted library keeps
   every graph done so far, and nothing unconfirmed); a winner that lost the step-4
   confirmation is not written: the heuristics keep choosing the heuristic plan;
6. reports winner, runner-up, margin, the decision, the speedup over the heuristic from the
   confirmation's rounds, the tuning wall time, and after how many calls tuning has paid for
   itself.

Expected failures (a graph no engine supports, every candidate failing) are data: the report
carries ``error`` and ``ok`` is False. Only programming errors raise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dnntune._rfc_values import budget_error
from dnntune.autotune.confirm import Confirmation, confirm_winner, execute_sampler
from dnntune.autotune.variants import add_tuning_variants
from dnntune.autotune.verdicts import DEFAULT_FAILED, NO_DEFAULT
from dnntune.backend.engine import engine_name_or_id
from dnntune.backend.estimates import deferred_workspace_size
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.plan_choice import PlanChoice, choose_plan
from dnntune.backend.plans import allocate_workspace
from dnntune.errors import AutotuneError, DnnTuneError, InvalidValueError
from dnntune.frontend import Graph
from dnntune.measure import contention
from dnntune.overrides.writer import write_autotune_winner
from dnntune.reference import make_inputs
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneStorageConfig,
    AutotuneStrategy,
    PrimingFailurePolicy,
    TuneMode,
)
from dnntune.workflows.tune_report import GraphTuneReport, cost_of

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "GraphTuneReport",
    "TuneOptions",
    "confirm_plans",
    "heuristic_plan",
    "tune_graph",
    "tune_graphs",
]

_log = logging.getLogger(__name__)


@dataclass
class TuneOptions:
    """How to tune: the knobs of ``dnntune tune``, turned into an AutotuneConfig."""

    mode: TuneMode = TuneMode.STANDARD
    strategy: AutotuneStrategy = AutotuneStrategy.RUN_UNTIL_STABLE
    warmup_iterations: int = 1
    timed_iterations: int = 10
    max_iterations: int = 100
    #: engine names or ids (decimal or 0x hex); empty = every applicable engine
    engines: Sequence[str | int] = ()
    cache_mode: Literal["warm", "cold"] = "warm"
    verify: bool = True
    #: the clock candidates are ranked on (``AutotuneConfig.ranking_metric``)
    ranking_metric: Literal["latency", "device", "throughput"] = "latency"
    priming_failure_policy: PrimingFailurePolicy = PrimingFailurePolicy.ABORT_ON_PRIMING_FAILURE
    #: seed of the random inputs (the same inputs for every candidate and for the heuristic)
    seed: int = 0
    #: heuristic mode of the out-of-the-box plan the winner is compared with
    heuristic_mode: HeuristicMode = HeuristicMode.A
    #: also try each engine's small knob spaces, one knob at a time (e.g. TORCH_ENGINE with
    #: CUDA-graph replay); knobs with many values are left to the engine's own search
    sweep_knobs: bool = False
    #: refuse a graph whose inputs and outputs need more bytes than this, before allocating
    #: them (``reference.check_pack_size``); None: no limit. The CLI's ``--max-input-gb``.
    max_input_bytes: int | None = None
    #: wall-time budget of each graph's autotune() in seconds (``AutotuneConfig.time_budget_s``;
    #: None: no budget). The CLI's ``--budget-s``.
    time_budget_s: float | None = None
    #: wall-time budget of a whole run in seconds: :func:`tune_graphs` gives each graph an
    #: equal share of what is left (at most ``time_budget_s``). The CLI's ``--run-budget-s``.
    run_budget_s: float | None = None

    def autotune_config(self) -> AutotuneConfig:
        """The AutotuneConfig these options stand for (validated)."""
        config = AutotuneConfig(
            mode=self.mode,
            strategy=self.strategy,
            warmup_iterations=self.warmup_iterations,
            timed_iterations=self.timed_iterations,
            max_iterations=self.max_iterations,
            engine_id_filter=[engine_name_or_id(e) for e in self.engines],
            cache_mode=self.cache_mode,
            verify=self.verify,
            ranking_metric=self.ranking_metric,
            priming_failure_policy=self.priming_failure_policy,
            baseline=self.heuristic_mode,
            time_budget_s=self.time_budget_s,
        )
        if config.strategy is AutotuneStrategy.RUN_UNTIL_STABLE:
            # a small --max-iters must not trip the RFC's max_iterations >= window_size check
            config.window_size = min(config.window_size, max(config.max_iterations, 2))
        config.validate()
        bad_run = budget_error("run_budget_s", self.run_budget_s)
        if self.run_budget_s is not None and bad_run is not None:
            raise InvalidValueError(bad_run)
        return config


def heuristic_plan(graph: OpGraph, handle: Handle, mode: HeuristicMode) -> PlanChoice:
    """The heuristic choice for ``graph`` on ``handle`` in ``mode``, built as a value beside
    whatever plans the graph holds (one query of the policy chain; its decision is
    ``.decision``). Raises as ``Graph.build`` does when no plan can be built."""
    return choose_plan(graph, handle, modes=[mode])


def tune_graph(
    graph: Graph,
    handle: Handle,
    options: TuneOptions | None = None,
    output: str | Path | None = None,
    overwrite: bool = False,
    source: str = "",
) -> GraphTuneReport:
    """Autotune ``graph`` on ``handle`` and compare the winner with the heuristic pick.

    Args:
        graph: a graph (validated or not) without compiled plans (one that holds them from
            ``create_execution_plans``/``build`` is refused in ``report.error``); it ends up
            holding the winner for ``execute``.
        handle: device, stream and timer to tune on.
        options: how to tune (default: TuneOptions()).
        output: engine-override file the winner is written to (None: write nothing).
        overwrite: clear ``output`` before writing this graph's winner.
        source: where the graph came from (a path), for the report.

    Returns:
        A GraphTuneReport; ``report.ok`` is False and ``report.error`` says why when tuning
        failed for an expected reason (unsupported graph, every candidate failing).
    """
    opts = options or TuneOptions()
    config = opts.autotune_config()
    report = GraphTuneReport(graph_name=graph.name, source=source, device=str(handle.device))
    try:
        graph.build_operation_graph(handle)
        report.graph_key = graph.key()
    except DnnTuneError as exc:
        report.error = str(exc)
        return report
    if graph.plan_set.plans is not None:
        # tuning adds plan specs, which a graph with compiled plans refuses (RFC 6.2): say so
        # here, in tune_graph's terms, not as the add_engine_configs() error it would hit
        report.error = (
            f"tune_graph: graph {graph.name!r} already holds execution plans "
            "(create_execution_plans/build); tuning adds plan specs, and the two paths are "
            "mutually exclusive on one Graph: tune a fresh copy, "
            "tune_graph(dnntune.Graph.from_json(graph.to_json()), ...), or rank its compiled "
            "plans with graph.autotune(handle, pack, workspace)"
        )
        return report

    try:
        pack = make_inputs(graph, handle.device, seed=opts.seed, max_bytes=opts.max_input_bytes)
    except DnnTuneError as exc:
        report.error = f"cannot make inputs: {exc}"
        return report

    heuristic: PlanChoice | None = None
    try:
        heuristic = heuristic_plan(graph, handle, opts.heuristic_mode)
        report.heuristic_plan = heuristic.name
    except DnnTuneError as exc:
        report.heuristic_error = str(exc)
        _log.info("tune: %s: no heuristic plan to compare with: %s", graph.name, exc)

    start_ns = time.perf_counter_ns()
    try:
        graph.add_all_engines()
        budgeted = config.time_budget_s is not None  # plans built in the search (estimates)
        add_tuning_variants(graph, sweep=opts.sweep_knobs, budgeted=budgeted)
        workspace_size = graph.get_estimated_max_workspace_size()
        if budgeted:
            workspace_size = deferred_workspace_size(workspace_size, handle.device.type)
        workspace = allocate_workspace(workspace_size, handle.device)
        report.results = graph.autotune(
            handle,
            pack,
            workspace,
            workspace_size=workspace_size,
            config=config,
        )
    except AutotuneError as exc:
        report.results = list(exc.results)
        report.error = str(exc)
    except DnnTuneError as exc:
        report.error = str(exc)
    report.tuning_time_ms = (time.perf_counter_ns() - start_ns) / 1e6
    report.cost = cost_of(graph.last_autotune_summary)
    if report.error or report.winner is None:
        report.error = report.error or "no candidate succeeded"
        return report
    summary = graph.last_autotune_summary
    report.confirmation = summary.confirmation if summary is not None else None
    if heuristic is not None and _needs_own_confirmation(report):
        bounded = confirm_config(config, float(report.cost.get("budget_used_s") or 0.0))
        report.confirmation = _confirm_here(report, graph, heuristic, handle, pack, bounded)
        # tuning's cost includes this confirmation (the break-even too)
        report.tuning_time_ms = (time.perf_counter_ns() - start_ns) / 1e6
    report.take_confirmed_times()
    if output is not None and report.write_winner:
        _write(report, graph, output, overwrite, config)
    return report


def _needs_own_confirmation(report: GraphTuneReport) -> bool:
    """The session did not compare the winner with the heuristic plan, though one exists:
    its candidate failed while tuning for a reason other than a wrong answer, or it was not a
    candidate (an engine filter left it out, and the session's default was another plan)."""
    c = report.confirmation
    if report.same_as_heuristic:
        return False
    compared = c is not None and c.verdict not in (NO_DEFAULT, DEFAULT_FAILED)
    if compared and c is not None and c.default == report.heuristic_plan:
        return False
    wrong = any(r.is_default and r.failure_kind == "verification" for r in report.results)
    return not wrong


def _confirm_here(
    report: GraphTuneReport,
    tuned: Graph,
    heuristic: PlanChoice,
    handle: Handle,
    pack: dict[int, Any],
    config: AutotuneConfig,
) -> Confirmation | None:
    """The session's confirmation, on the two finished plans; a winner that does not beat the
    heuristic plan beyond noise is not written."""
    try:
        c = confirm_plans(tuned, heuristic, handle, pack, config)
    except DnnTuneError as exc:
        report.heuristic_error = f"confirmation failed: {exc}"
        return report.confirmation
    _count_confirmation(report.cost, c.time_ms)
    if c.kept_default:
        report.write_winner = False
        _log.info(
            "tune: %s: %s did not beat the heuristic plan %s beyond noise (%s); not written",
            report.graph_name,
            report.winner_plan,
            report.heuristic_plan,
            c.verdict,
        )
    return c


def confirm_config(config: AutotuneConfig, used_s: float) -> AutotuneConfig:
    """``config`` for a confirmation run after an autotune() call that used ``used_s`` of its
    ``time_budget_s``: its wall time is capped as the session caps its own (what is left of
    the budget, at least the confirmation's share, at most ``confirm_budget_ms``); unchanged
    without a budget."""
    total = config.time_budget_s
    if total is None:
        return config
    left_s = max(total - used_s, total * config.budget_confirm_share)
    return dataclasses.replace(
        config, confirm_budget_ms=min(config.confirm_budget_ms, left_s * 1e3)
    )


def _count_confirmation(cost: dict[str, Any], confirm_ms: float) -> None:
    """Add a confirmation run after the session to its cost figures (and to the budget used)."""
    if not cost:
        return
    cost["confirm_ms"] = float(cost.get("confirm_ms") or 0.0) + confirm_ms
    cost["total_ms"] = float(cost.get("total_ms") or 0.0) + confirm_ms
    if cost.get("time_budget_s") is not None:
        cost["budget_used_s"] = float(cost.get("budget_used_s") or 0.0) + confirm_ms / 1e3


def confirm_plans(
    tuned: Graph | PlanChoice,
    heuristic: Graph | PlanChoice,
    handle: Handle,
    pack: Mapping[Any, Any],
    config: AutotuneConfig | None = None,
) -> Confirmation:
    """Confirm a finished tuned plan against the heuristic plan, as ``autotune()`` does inside
    its session (:func:`dnntune.autotune.confirm.confirm_winner`): fresh interleaved rounds on
    the same buffers, until the tuned plan is faster beyond noise, or not.

    Args:
        tuned: the tuned choice: a graph whose active plan it is, or a plan value
            (:func:`~dnntune.backend.plan_choice.choose_plan`).
        heuristic: the heuristic choice (:func:`heuristic_plan`, or a graph built on it).
        handle: the handle both run on.
        pack: the variant pack both run on.
        config: the clock, cache mode and ``confirm_*`` fields (default: AutotuneConfig()).
            ``confirm_budget_ms`` is on the clock a time budget is (the handle timer's
            ``wall_s`` where it has one, as ``autotune()``'s), as is the result's ``time_ms``.
    """
    size = max(_workspace_size(tuned), _workspace_size(heuristic))
    workspace = allocate_workspace(size, handle.device)
    clock = getattr(handle.timer, "wall_s", None)
    return confirm_winner(
        execute_sampler(handle, lambda: tuned.execute(handle, pack, workspace), config),
        execute_sampler(handle, lambda: heuristic.execute(handle, pack, workspace), config),
        config,
        winner=_plan_name(tuned),
        default=_plan_name(heuristic),
        clock=clock if callable(clock) else time.perf_counter,
        cpu_wait=lambda: contention.timer_wait_s(handle.timer),
    )


def _plan_name(plan: Graph | PlanChoice) -> str:
    return plan.name if isinstance(plan, PlanChoice) else plan.get_plan_name()


def _workspace_size(plan: Graph | PlanChoice) -> int:
    return plan.workspace_size if isinstance(plan, PlanChoice) else plan.get_workspace_size()


def _write(
    report: GraphTuneReport,
    graph: Graph,
    output: str | Path,
    overwrite: bool,
    config: AutotuneConfig,
) -> None:
    """Write the confirmed decision (rank 0 of the results) to the override file."""

    storage = AutotuneStorageConfig(
        file_path=str(output), delete_all_existing_file_content=overwrite
    )
    try:
        write_autotune_winner(graph, report.results, storage, config)
    except DnnTuneError as exc:
        report.error = f"writing {output}: {exc}"
        return
    report.written_to = str(output)


#: a graph's budget is never below this (a spent run budget still tunes the heuristic plan)
MIN_GRAPH_BUDGET_S = 0.001


def _graph_share(opts: TuneOptions, start: float, done: int, total: int | None) -> float:
    """This graph's budget: what is left of the run's, split over the graphs left."""
    assert opts.run_budget_s is not None
    left = opts.run_budget_s - (time.perf_counter() - start)
    graphs_left = max(1, (total or done + 1) - done)
    share = max(MIN_GRAPH_BUDGET_S, left / graphs_left)
    return min(share, opts.time_budget_s if opts.time_budget_s is not None else math.inf)


def tune_graphs(
    graphs: Iterable[tuple[str, Graph | Exception]],
    handle: Handle,
    options: TuneOptions | None = None,
    output: str | Path | None = None,
    overwrite: bool = False,
    on_start: Callable[[str], None] | None = None,
    total: int | None = None,
) -> Iterator[GraphTuneReport]:
    """Tune graphs one after another into one override file, yielding each report as it ends.

    ``graphs`` yields ``(source, graph)`` pairs; a pair whose second item is an exception (a
    file that failed to load) yields a failed report and the library goes on. With
    ``overwrite``, the file is cleared by the first graph that writes a winner, so a bad first
    graph does not leave stale entries behind. Each winner is in the file when its report is
    yielded: stopping the iteration (or Ctrl-C) keeps everything tuned so far.

    With ``options.run_budget_s``, each graph's budget is an equal share of what is left of it
    over the graphs not yet tuned (``total`` of them in all; at most ``options.time_budget_s``).
    ``total`` defaults to ``len(graphs)`` where ``graphs`` has a length (a list): without it the
    first graph of a list was given the whole run budget and the others 1 ms each (new-user
    audit, session 61). A generator without ``total`` counts each graph as the last, so each
    may spend all that is left.
    """
    clear_pending = overwrite
    if total is None and isinstance(graphs, Sized):
        total = len(graphs)
    opts = options or TuneOptions()
    # bad options are the caller's error, raised once: inside the loop each graph's report
    # read "internal error: InvalidValueError ..." (new-user audit, session 56)
    opts.autotune_config()
    start = time.perf_counter()
    for done, (source, item) in enumerate(graphs):
        if opts.run_budget_s is not None:
            options = dataclasses.replace(
                opts, time_budget_s=_graph_share(opts, start, done, total)
            )
        if on_start is not None:
            on_start(source)
        if isinstance(item, Exception):
            yield GraphTuneReport(graph_name=Path(source).stem, source=source, error=str(item))
            continue
        try:
            report = tune_graph(
                item, handle, options, output, overwrite=clear_pending, source=source
            )
        except Exception as exc:  # one graph's bug must not stop the library
            _log.debug("tune: %s raised", source, exc_info=True)
            report = GraphTuneReport(
                graph_name=item.name,
                source=source,
                error=f"internal error: {type(exc).__name__}: {exc}",
            )
        if report.written_to:
            clear_pending = False
        yield report
