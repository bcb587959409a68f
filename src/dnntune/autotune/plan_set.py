"""A graph's set of plans: the one object the ``Graph`` facade owns and the runtime reads.

A ``Graph`` holds either plan specs (``add_engine_*()``: engine ids with knob settings,
nothing compiled) or an execution-plan collection (``create_execution_plans()``: compiled by
``build_plans``), never both, plus the caller's deselect criteria and the handle the graph
was built for. The facade hands this object to :func:`dnntune.autotune.session.run_autotune`,
which reads it, may add the plan specs of an exhaustive sweep, and records what the call cost
in :attr:`PlanSet.summary` (also when the call raised), so no module reaches into ``Graph``.

A workflow that has already built one of the specs' plans on the same graph and handle (the
bench row's heuristic plan, before ``--oracle`` tunes its engine) hands it over in
:attr:`PlanSet.prebuilt`, so the call does not compile it a second time.

Plan sets are values: a workflow that tunes another set of candidates for the same graph (one
rank's share of them, one engine's knob variants) builds its own with :meth:`PlanSet.for_specs`
and passes it to ``run_autotune`` beside the graph, instead of cloning the graph to get a
second facade.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dnntune.autotune.cost import AutotuneSummary
from dnntune.autotune.plan_specs import PlanSpecCollection
from dnntune.backend.engine import Plan
from dnntune.backend.handle import Handle
from dnntune.backend.plans import DeselectCriteria, PlanCollection
from dnntune.graph.ir import OpGraph
from dnntune.rfc import PlanSpec

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
    #: plans already built for this graph and handle (a bench row's heuristic plan): a plan
    #: spec that would build one of them again (same engine, same resolved knob values) takes
    #: it instead of a compile, before any priming; ignored under ``isolate`` (a worker
    #: process builds its own)
    prebuilt: tuple[Plan, ...] = ()

    @classmethod
    def for_specs(
        cls,
        graph: OpGraph,
        handle: Handle,
        specs: Iterable[PlanSpec] = (),
        deselect: DeselectCriteria | None = None,
    ) -> PlanSet:
        """A plan set of ``graph`` on ``handle`` on the plan-spec path, holding ``specs`` (in
        order; each validated as ``add_engine`` validates it) and nothing compiled.

        Raises:
            InvalidValueError: a spec names an unknown engine or a bad knob.
        """
        collection = PlanSpecCollection(graph, handle)
        for spec in specs:
            collection.add_engine(spec.engine_id, list(spec.knob_settings))
        return cls(handle=handle, specs=collection, deselect=deselect or DeselectCriteria())

    @property
    def has_specs(self) -> bool:
        return self.specs is not None and len(self.specs) > 0
