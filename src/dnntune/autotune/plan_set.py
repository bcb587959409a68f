"""A graph's set of plans: the one object the ``Graph`` facade owns and the runtime reads.

A ``Graph`` holds either plan specs (``add_engine_*()``: engine ids with knob settings,
nothing compiled) or an execution-plan collection (``create_execution_plans()``: compiled by
``build_plans``), never both, plus the caller's deselect criteria and the handle the graph
was built for. The facade hands this object to :func:`dnntune.autotune.session.run_autotune`,
which reads it, may add the plan specs of an exhaustive sweep, and records what the call cost
in :attr:`PlanSet.summary` (also when the call raised), so no module reaches into ``Graph``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dnntune.autotune.cost import AutotuneSummary
from dnntune.autotune.plan_specs import PlanSpecCollection
from dnntune.backend.handle import Handle
from dnntune.backend.plans import DeselectCriteria, PlanCollection

__all__ = ["PlanSet"]


@dataclass(eq=False)
class PlanSet:
    """Plan specs or compiled plans, deselect criteria and the handle of one graph."""

    #: the handle of build_operation_graph(); None until the graph is built
    handle: Handle | None = None
    #: the plan-spec path (add_engine_*()); mutually exclusive with ``plans``
    specs: PlanSpecCollection | None = None
    #: the compiled-plan path (create_execution_plans(), build_plans())
    plans: PlanCollection | None = None
    #: deselect_workspace_greater_than() and deselect_engines()
    deselect: DeselectCriteria = field(default_factory=DeselectCriteria)
    #: what the last autotune() over this set cost; recorded also when the call raised
    summary: AutotuneSummary | None = None

    @property
    def has_specs(self) -> bool:
        return self.specs is not None and len(self.specs) > 0
