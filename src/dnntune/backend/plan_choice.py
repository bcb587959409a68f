"""Plans are values: build or select one plan for a graph without touching a ``Graph``.

:func:`choose_plan` answers "which plan would run this graph on this handle", for an explicit
engine with knobs or for a heuristic mode, and returns the plan with the policy's decision
(which policy chose it, and why). It reads the graph and the policy chain and writes
nothing into the ``Graph`` facade, so a workflow that needs a second plan for a graph (the
heuristic plan beside a tuned winner, a stored decision, one engine's out-of-the-box plan)
asks here instead of cloning the graph through JSON. A :class:`PlanChoice` runs like the
facade's plan does (:meth:`PlanChoice.execute`, with the same fast path), so a choice and a
``Graph`` can be timed side by side on equal terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dnntune.backend.engine import Plan
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import HeuristicMode, PolicyDecision
from dnntune.backend.knobs import KnobSetting, KnobValue
from dnntune.backend.pack_binding import PackBinding, bind_pack
from dnntune.backend.plans import BuildPlanPolicy, DeselectCriteria, PlanCollection
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.graph.ir import OpGraph

if TYPE_CHECKING:
    import torch

__all__ = ["PlanChoice", "choose_plan"]


@dataclass(eq=False)
class PlanChoice:
    """A compiled plan, the collection it was chosen from and the policy's decision."""

    plan: Plan
    collection: PlanCollection
    #: execute()'s fast path: the plan bound to the keys of the last valid pack
    _binding: PackBinding | None = field(default=None, init=False, repr=False)

    @property
    def decision(self) -> PolicyDecision | None:
        """The policy chain's decision (None for an explicit engine)."""
        return self.collection.decision

    @property
    def graph(self) -> OpGraph:
        """The graph the plan was built for."""
        return self.collection.graph

    @property
    def name(self) -> str:
        """The plan's name, e.g. ``TORCH_ENGINE[torch.allow_tf32=1]``."""
        return self.plan.name

    @property
    def workspace_size(self) -> int:
        return self.plan.workspace_size

    def execute(
        self,
        handle: Handle,
        variant_pack: Mapping[Any, Any],
        workspace: torch.Tensor | None = None,
    ) -> None:
        """Run the plan as ``Graph.execute`` runs a graph's plan: the first pack with a set of
        keys is checked in full; later packs with the same keys (a ``dict``, on the same
        handle) go to the plan's bound call after a per-tensor layout check.

        Raises:
            BadStateError: the graph changed (a tensor or node added, a tensor edited) since
                the plan was built for it.
        """
        collection = self.collection
        if collection.graph.revision != collection.revision:
            collection.check_current()  # raises: a plan for the old graph
        binding = self._binding
        if (
            binding is not None
            and binding.handle is handle
            and binding.run(variant_pack, workspace)
        ):
            return
        graph = collection.graph
        pack = normalize_variant_pack(graph, variant_pack, handle)
        with handle.stream_context():
            self.plan.execute(pack, workspace, handle.stream)
        if type(variant_pack) is dict:
            self._binding = bind_pack(graph, variant_pack, self.plan, handle, collection)


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

    The policy chain is asked once (none for an explicit engine); its decision comes back in
    :attr:`PlanChoice.decision`, so a caller never asks again.

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
