"""Run a graph the out-of-the-box way and check it: the heuristic plan against the reference.

This is the library half of ``dnntune run``: build the graph, let the heuristics choose
(``create_execution_plans([A])`` + ``build_plans(HEURISTICS_CHOICE)``; the Config policy picks a
tuned engine when ``DNNTUNE_HEUR_CONFIG_PATH`` names an override file that matches), execute
it on random inputs, compare every output with :mod:`dnntune.reference` within the default
tolerance, and time it. Expected failures are data in the report (``error``), never raised.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dnntune import reference
from dnntune.backend.heuristics import CONFIG_POLICY, HeuristicMode
from dnntune.backend.plans import BuildPlanPolicy, allocate_workspace
from dnntune.errors import DnnTuneError
from dnntune.measure import SampleStats, contention
from dnntune.rfc import AutotuneConfig, AutotuneStrategy
from dnntune.workflows.plan_timing import time_interleaved

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.backend.heuristics import PolicyDecision
    from dnntune.backend.plans import PlanCollection
    from dnntune.frontend import Graph

__all__ = ["GraphRunReport", "run_graph"]

_log = logging.getLogger(__name__)


@dataclass
class GraphRunReport:
    """One graph run on its heuristic plan: which plan, how fast, how close to the reference."""

    graph_name: str
    source: str = ""
    device: str = ""
    #: the plan the heuristics chose, e.g. ``TORCH_ENGINE``
    plan: str = ""
    #: the heuristic policy that chose it (``SelectionHeuristic::Config`` when an override
    #: file or the exact-match cache decided; static ordering otherwise)
    policy: str = ""
    policy_reason: str = ""
    timing: SampleStats | None = None
    #: None: not checked; True/False: every output within tolerance or not
    passed: bool | None = None
    max_abs_error: float | None = None
    #: bytes of the variant pack (every input and output buffer), known before allocating
    input_bytes: int | None = None
    #: the first mismatch, or why the run failed
    error: str = ""
    #: the share of the timing's wall time its threads spent waiting for a CPU core
    #: (:mod:`dnntune.measure.contention`; None: unmeasured)
    cpu_wait_share: float | None = None

    @property
    def timed_while_busy(self) -> bool:
        """The times were measured on an oversubscribed CPU: not to be trusted."""
        return contention.busy(self.cpu_wait_share)

    @property
    def ok(self) -> bool:
        return not self.error and self.passed is not False

    @property
    def time_ms(self) -> float | None:
        return None if self.timing is None else self.timing.min_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph_name,
            "source": self.source,
            "device": self.device,
            "plan": self.plan,
            "policy": self.policy,
            "policy_reason": self.policy_reason,
            "min_time_ms": self.time_ms,
            "median_time_ms": None if self.timing is None else self.timing.median_ms,
            "passed": self.passed,
            "max_abs_error": self.max_abs_error,
            "input_bytes": self.input_bytes,
            "error": self.error,
            "cpu_wait_share": self.cpu_wait_share,
            "timed_while_busy": self.timed_while_busy,
        }


def run_graph(
    graph: Graph,
    handle: Handle,
    warmup_iterations: int = 3,
    timed_iterations: int = 10,
    seed: int = 0,
    mode: HeuristicMode = HeuristicMode.A,
    verify: bool = True,
    source: str = "",
    max_input_bytes: int | None = None,
) -> GraphRunReport:
    """Build ``graph`` on its heuristic plan, check it against the reference and time it.

    Args:
        graph: the graph to run (validated here if needed).
        handle: the device to run on.
        warmup_iterations: untimed executions before timing.
        timed_iterations: timed executions; the report keeps min, median and spread.
        seed: seed of the random inputs.
        mode: heuristic mode asked of the policy chain.
        verify: compare the outputs with :func:`dnntune.reference.run`.
        source: where the graph came from, for the report.
        max_input_bytes: refuse (``error``) a graph whose inputs and outputs need more bytes
            than this, before allocating them; None: no limit.

    Returns:
        A GraphRunReport; ``ok`` is False when the graph could not run or an output is wrong.
    """

    report = GraphRunReport(graph_name=graph.name, source=source, device=str(handle.device))
    try:
        graph.build_operation_graph(handle)
        # what the inputs cost, before any plan is built or any buffer allocated
        report.input_bytes = reference.pack_bytes(graph)
        if max_input_bytes is not None:
            reference.check_pack_size(graph, max_input_bytes)
        graph.create_execution_plans([mode])  # the one query of the policy chain
        decision = graph.plan_set.plans.decision if graph.plan_set.plans is not None else None
        if decision is not None:
            report.policy, report.policy_reason = decision.policy, decision.reason
        graph.check_support()
        graph.build_plans(BuildPlanPolicy.HEURISTICS_CHOICE)
        report.plan = graph.get_plan_name()
        if decision is not None and graph.plan_set.plans is not None:
            _check_config_plan_ran(report, decision, graph.plan_set.plans)
        pack = reference.make_inputs(graph, handle.device, seed=seed)
        workspace = allocate_workspace(graph.get_workspace_size(), handle.device)
        graph.execute(handle, pack, workspace)
        handle.synchronize()
        if verify:
            _verify(report, graph, pack)
        config = AutotuneConfig(
            strategy=AutotuneStrategy.FIXED_AVERAGE,
            warmup_iterations=warmup_iterations,
            timed_iterations=max(timed_iterations, 1),
        )
        clock = getattr(handle.timer, "wall_s", None) or time.perf_counter
        busy = contention.wait_share(lambda: contention.timer_wait_s(handle.timer), clock)
        stats = time_interleaved(
            handle, {"plan": lambda: graph.execute(handle, pack, workspace)}, config
        )
        report.timing = stats["plan"]
        report.cpu_wait_share = busy()
    except DnnTuneError as exc:
        report.error = str(exc)
    return report


#: ``policy`` of a graph whose override-file plan could not be built here: the next candidate
#: ran (the ``run`` table's "chosen by" says ``fallback``)
CONFIG_FALLBACK_POLICY = "SelectionHeuristic::ConfigFallback"


def _check_config_plan_ran(
    report: GraphRunReport, decision: PolicyDecision, plans: PlanCollection
) -> None:
    """When the override file chose the plan but another one was built (the file's knobs
    cannot build here, e.g. ``torch.cuda_graph=1`` on the CPU: its engine's default knobs;
    its engine cannot: the next engine), say so: the report was labelled ``config`` with the
    file's engine in its reason (audit, session 18)."""
    if decision.policy != CONFIG_POLICY or not decision.engines:
        return
    wanted = decision.engines[0]
    entry = next((e for e in plans.entries if e.engine.id == wanted.id), None)
    if entry is not None and entry.stored_failure is not None:
        # its knobs could not build here and its default knobs ran (PlanCollection warned)
        name, why = entry.stored_failure
        report.policy = CONFIG_FALLBACK_POLICY
        report.policy_reason = (
            f"{decision.reason}: that plan ({name}) could not be built here: {why}; ran "
            f"{report.plan}, the engine's default knobs"
        )
        return
    if entry is None or (entry.plan is not None and entry.barred is None):
        return  # the file's plan was built: it is the one that ran (the first built)
    why = entry.barred or entry.support_error or entry.build_error or "not built"
    report.policy = CONFIG_FALLBACK_POLICY
    report.policy_reason = (
        f"{decision.reason}: that plan ({entry.name}) could not be built here: {why}; "
        f"ran the next candidate, {report.plan}"
    )
    _log.warning(
        "%s: the override file's plan %s could not be built here (%s); ran %s instead",
        report.graph_name,
        entry.name,
        why,
        report.plan,
    )


def _verify(report: GraphRunReport, graph: Graph, pack: dict[int, Any]) -> None:

    inputs = {
        uid: t for uid, t in pack.items() if uid not in {o.uid for o in graph.output_tensors()}
    }
    expected = reference.run(graph, inputs)
    checked = reference.check_outputs(graph, pack, expected)
    for o in checked.failed:
        if not report.error:
            report.error = f"output {o.tensor.name!r} (uid {o.uid}): {o.comparison.message}"
            report.passed = False
    report.max_abs_error = checked.max_abs_error
    if report.passed is None:
        report.passed = True
