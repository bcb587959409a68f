"""Plans are values: build or select one plan for a graph without touching a ``Graph``.

:func:`choose_plan` answers "which plan would run this graph on this handle", for an explicit
engine with knobs or for a heuristic mode, and returns the plan with the policy's decision
(which policy chose it, and why). It reads the graph and the policy chain and writes
nothing into the ``Graph`` facade, so a workflow that needs a second plan for a graph (the
heuristic plan beside a tuned winner, a stored decision) asks here instead of cloning the
graph through JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dnntune.backend.engine import Plan
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import HeuristicMode, PolicyDecision
from dnntune.backend.knobs import KnobSetting, KnobValue
from dnntune.backend.plans import BuildPlanPolicy, DeselectCriteria, PlanCollection
from dnntune.graph.ir import OpGraph

__all__ = ["PlanChoice", "choose_plan"]


@dataclass(frozen=True)
class PlanChoice:
    """A compiled plan, the collection it was chosen from and the policy's decision."""

    plan: Plan
    collection: PlanCollection

    @property
    def decision(self) -> PolicyDecision | None:
        """The policy chain's decision (None for an explicit engine)."""
        return self.collection.decision


def choose_plan(
    graph: OpGraph,
    handle: Handle,
    *,
    modes: Sequence[HeuristicMode] = (HeuristicMode.FALLBACK,),
    engine: int | str | None = None,
    knobs: Sequence[KnobSetting] | Mapping[str, KnobValue] = (),
    deselect: DeselectCriteria | None = None,
) -> PlanChoice:
    """Build the plan ``engine`` with ``knobs`` (or, without ``engine``, the heuristic choice
    for ``modes``) of ``graph`` on ``handle``, as ``Graph.build`` would, without a Graph.

    Raises:
        NotSupportedError: no engine (or not ``engine``) supports the graph here.
        InvalidValueError: bad knobs for ``engine``.
    """
    if not graph.is_validated:
        graph.validate()
    criteria = deselect or DeselectCriteria()
    if engine is not None:
        plans = PlanCollection.from_engine(graph, handle, engine, knobs, criteria)
    else:
        plans = PlanCollection.from_heuristics(graph, handle, list(modes), criteria)
    plans.check_support()
    plans.build(BuildPlanPolicy.HEURISTICS_CHOICE)
    plan = plans.first_built()
    assert plan is not None, "build(HEURISTICS_CHOICE) compiles a plan or raises"
    plan.origin = (graph, handle)
    return PlanChoice(plan, plans)
