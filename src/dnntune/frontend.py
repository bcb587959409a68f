"""Graph: the user-facing facade (cuDNN-frontend style).

Builder methods come from :class:`dnntune.graph.GraphBuilder` and add IR nodes. Plan methods
delegate to :mod:`dnntune.backend.plans`, autotune methods to :mod:`dnntune.autotune`. Graph
holds only the state the RFC puts on a graph: the handle it was built for, the compiled plans
or the plan specs (mutually exclusive), the deselect criteria and the plan ``execute`` runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnntune.autotune.exhaustive import run_exhaustive_sweep
from dnntune.autotune.plan_set import PlanSet
from dnntune.autotune.plan_specs import PlanSpecCollection, engine_configs
from dnntune.autotune.session import run_autotune
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import HeuristicMode, heuristic_modes
from dnntune.backend.knobs import KnobSetting, KnobValue
from dnntune.backend.pack_binding import PackBinding, bind_pack
from dnntune.backend.plans import BuildPlanPolicy, PlanCollection, no_engine_error
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.errors import AutotuneError, BadStateError, InvalidValueError
from dnntune.graph.builders import GraphBuilder
from dnntune.graph.json_format import (
    graph_to_dict,
    read_graph_text,
)
from dnntune.graph.json_unknown import graph_from_user_json
from dnntune.graph.signature import graph_key
from dnntune.graph.types import DataType
from dnntune.overrides.plan_serialization import deserialize_plan, serialize_plan
from dnntune.overrides.store import atomic_write_text

if TYPE_CHECKING:
    import torch

    from dnntune.autotune.cost import AutotuneSummary
    from dnntune.backend.engine import Plan
    from dnntune.rfc import (
        AutotuneConfig,
        AutotuneResult,
        AutotuneStorageConfig,
        CacheWriteOutcome,
        EngineConfigInfo,
        EngineSweepSpec,
        EngineVariant,
    )

__all__ = ["Graph"]

PackKey = Any  # TensorAttributes or int uid


def _check_handle(what: str, handle: object, workspace: object) -> None:
    """execute()'s slow path: a handle that is not one, or a workspace that is not a tensor,
    is refused by name (an AttributeError deep inside, or a string taken as a workspace)."""
    if not isinstance(handle, Handle):
        raise InvalidValueError(
            f"{what}: expected a Handle (dnntune.create_handle(device)), got {handle!r}"
        )
    import torch

    if workspace is not None and not isinstance(workspace, torch.Tensor):
        raise InvalidValueError(
            f"{what}: workspace must be a torch tensor (torch.uint8) or None, got "
            f"{type(workspace).__name__}"
        )


class Graph(GraphBuilder):
    """An operation graph you build, validate, plan, autotune and execute."""

    def __init__(
        self,
        name: str = "",
        io_data_type: DataType | None = None,
        compute_data_type: DataType | None = None,
        intermediate_data_type: DataType | None = None,
    ) -> None:
        super().__init__(name, io_data_type, compute_data_type, intermediate_data_type)
        #: plan specs or compiled plans, deselect criteria and the handle (dnntune.autotune)
        self._plan_set = PlanSet()
        #: the plan execute() runs (heuristic choice, build_plan_at_index, or autotune winner)
        self._active_plan: Plan | None = None
        #: the graph's revision when the active plan was selected (execute() refuses a plan
        #: of another one: a node added since, whose output it never computes)
        self._plan_revision = -1
        #: execute()'s fast path: the active plan bound to the keys of the last valid pack
        self._binding: PackBinding | None = None
        #: results of the last autotune() call
        self.last_autotune_results: list[AutotuneResult] = []

    # ---- operation graph ----------------------------------------------------------------
    def build_operation_graph(self, handle: Handle) -> Graph:
        """Validate (if needed) and bind the graph to ``handle``'s device."""
        if not isinstance(handle, Handle):
            raise InvalidValueError(f"build_operation_graph: expected a Handle, got {handle!r}")
        if not self.is_validated:
            self.validate()
        self._plan_set.handle = handle
        return self

    @property
    def handle(self) -> Handle:
        if self._plan_set.handle is None:
            raise BadStateError("call build_operation_graph(handle) first")
        return self._plan_set.handle

    @property
    def is_built(self) -> bool:
        return self._plan_set.handle is not None

    @property
    def plan_set(self) -> PlanSet:
        """This graph's plan specs or compiled plans, deselect criteria and handle."""
        return self._plan_set

    @property
    def last_autotune_summary(self) -> AutotuneSummary | None:
        """What the last autotune() call cost (wall time, counts, winner margin); recorded by
        dnntune.autotune also when the call raised."""
        return self._plan_set.summary

    def key(self) -> str:
        """Deterministic signature of the problem (ops, attributes, dims, strides, dtypes)."""
        return graph_key(self)

    # ---- JSON -----------------------------------------------------------------------------
    def to_json(self, indent: int | None = 2) -> str:
        """hipDNN's graph JSON serialization of this graph: strict JSON, with a non-finite
        float written as the string ``"inf"``, ``"-inf"`` or ``"nan"``."""
        return json.dumps(graph_to_dict(self), indent=indent, allow_nan=False)

    def to_dict(self) -> dict[str, Any]:
        return graph_to_dict(self)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> Graph:
        """Load a graph from JSON text or a parsed document (raises GraphFormatError).

        Keys dnntune does not read are kept for the round trip but ignored, so a misspelled one
        means its default (``casual_mask``): they are named in one
        :class:`~dnntune.graph.json_unknown.UnknownFieldWarning`, as ``dnntune run`` warns of
        them (``dnntune validate`` refuses them)."""
        return graph_from_user_json(text, cls, "<string>", "Graph.from_json", stacklevel=2)

    def save(self, path: str | Path) -> None:
        """Write the graph as JSON to ``path``, atomically: a reader sees the old file or the
        new one, never a truncated one (it truncated, then wrote; new-user audit, session 56).
        Raises ConfigFileError when it cannot be written."""
        atomic_write_text(Path(path), self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Graph:
        """Load a graph JSON file (raises GraphFormatError naming the file and JSON path).

        Keys dnntune does not read warn as in :meth:`from_json`, naming the file."""
        p = Path(path)
        return graph_from_user_json(read_graph_text(p), cls, str(p), p, stacklevel=2)

    # ---- deselect criteria (both paths) ---------------------------------------------------
    def deselect_workspace_greater_than(self, workspace: int) -> Graph:
        """Exclude plans whose workspace exceeds ``workspace`` bytes (last call wins)."""
        self._plan_set.deselect.set_workspace_limit(workspace)
        self._binding = None  # the next execute checks the plan against the new criteria
        return self

    def deselect_engines(self, engines: Sequence[str | int]) -> Graph:
        """Exclude engines by name or id (set union across calls); a plan of one already
        built or restored (deserialize_plan) is barred too: execute() refuses it."""
        self._plan_set.deselect.add_engines(engines)
        if self._plan_set.plans is not None:
            self._plan_set.plans.bar_deselected_engines()  # built ones too
        self._binding = None  # the next execute checks the plan against the new criteria
        return self

    # ---- compiled-plan path (cuDNN parity) -------------------------------------------------
    def _plan_collection(self) -> PlanCollection:
        plans = self._plan_set.plans
        if plans is None:
            raise BadStateError("no execution plans: call create_execution_plans(modes) first")
        plans.check_current()
        return plans

    def _require_no_specs(self, what: str) -> None:
        if self._plan_set.has_specs:
            raise BadStateError(
                f"{what}: plan specs were added with add_engine_*(); the plan-spec and "
                "compiled-plan paths are mutually exclusive on one Graph"
            )

    def create_execution_plans(
        self, modes: Sequence[HeuristicMode] | HeuristicMode = (HeuristicMode.FALLBACK,)
    ) -> Graph:
        """Query the heuristics for the applicable engines, ordered (nothing is compiled).

        ``modes``: a list of :class:`HeuristicMode` as cuDNN's frontend takes it
        (``[HeuristicMode.A]``), or one mode."""
        self._require_no_specs("create_execution_plans")
        self._plan_set.plans = PlanCollection.from_heuristics(
            self, self.handle, heuristic_modes(modes), self._plan_set.deselect
        )
        self._active_plan = None
        return self

    def create_execution_plan_ext(
        self,
        engine_id: int | str,
        knob_settings: Sequence[KnobSetting] | Mapping[str, KnobValue] = (),
    ) -> Graph:
        """One plan for an explicit engine and knobs (clears existing plans, as hipDNN does)."""
        self._require_no_specs("create_execution_plan_ext")
        self._plan_set.plans = PlanCollection.from_engine(
            self, self.handle, engine_id, knob_settings, self._plan_set.deselect
        )
        self._active_plan = None
        return self

    def check_support(self) -> Graph:
        """Check that at least one plan's engine supports the graph (raises NotSupportedError)."""
        self._plan_collection().check_support()
        return self

    def build_plans(self, policy: BuildPlanPolicy = BuildPlanPolicy.HEURISTICS_CHOICE) -> Graph:
        """Compile the first supported plan (HEURISTICS_CHOICE) or every plan (ALL)."""
        plans = self._plan_collection()
        plans.build(policy)
        self._select(plans.first_built())
        return self

    def build(
        self,
        handle: Handle,
        modes: Sequence[HeuristicMode] = (HeuristicMode.FALLBACK,),
        policy: BuildPlanPolicy = BuildPlanPolicy.HEURISTICS_CHOICE,
    ) -> Graph:
        """validate, build_operation_graph, create_execution_plans, check_support, build_plans."""
        self.build_operation_graph(handle)
        self.create_execution_plans(modes)
        self.check_support()
        return self.build_plans(policy)

    def get_execution_plan_count(self) -> int:
        return self._plan_collection().count

    def build_plan_at_index(self, index: int) -> Graph:
        """Compile plan ``index`` and make it the plan execute() runs."""
        self._select(self._plan_collection().build_at(index))
        return self

    def execute_plan_at_index(
        self,
        handle: Handle,
        variant_pack: Mapping[PackKey, Any],
        workspace: torch.Tensor | None,
        index: int,
    ) -> None:
        _check_handle("execute_plan_at_index", handle, workspace)
        plans = self._plan_collection()
        pack = normalize_variant_pack(self, variant_pack, handle)
        plans.execute_at(index, pack, workspace, handle)

    def get_workspace_size_plan_at_index(self, index: int) -> int:
        return self._plan_collection().workspace_size_at(index)

    def get_plan_name_at_index(self, index: int) -> str:
        return self._plan_collection().name_at(index)

    def get_autotune_workspace_size(self) -> int:
        """Largest workspace among the compiled plans (what autotune needs on this path)."""
        return self._plan_collection().max_workspace_size()

    def get_workspace_size(self) -> int:
        """Workspace bytes of the plan execute() runs."""
        return self._require_active_plan().workspace_size

    def get_plan_name(self) -> str:
        return self._require_active_plan().name

    def _select(self, plan: Plan | None) -> None:
        """Make ``plan`` the one execute() runs, and bind it to this graph and handle so that
        ``plan.serialize()`` knows what it was built for."""
        self._active_plan = plan
        self._plan_revision = self.revision
        self._binding = None
        if plan is not None and self._plan_set.handle is not None:
            plan.origin = (self, self._plan_set.handle)

    def _require_active_plan(self) -> Plan:
        if self._active_plan is None:
            raise BadStateError(
                "no plan selected: call build_plans(), build_plan_at_index(i) or autotune() first"
            )
        return self._active_plan

    @property
    def active_plan(self) -> Plan | None:
        return self._active_plan

    def execute(
        self,
        handle: Handle,
        variant_pack: Mapping[PackKey, Any],
        workspace: torch.Tensor | None = None,
    ) -> None:
        """Run the selected plan. Keys: TensorAttributes or uids; values: tensors.

        The first call with a set of keys checks the pack in full; later calls with the same
        keys, on the same plan and handle, check each tensor's type, dims, strides, dtype and
        device, and call the plan's bound execute (:meth:`Plan.bind`) directly.
        """
        if self.revision != self._plan_revision:  # (inline: a frame less per call)
            self.check_plan_current("execute()")
        binding = self._binding
        if (
            binding is not None
            and binding.plan is self._active_plan
            and binding.handle is handle
            and binding.plans is self._plan_set.plans
            and binding.run(variant_pack, workspace)
        ):
            return
        _check_handle("execute", handle, workspace)
        plan = self._require_active_plan()
        if self._plan_set.plans is not None:
            self._plan_set.plans.check_not_barred(plan)
        barred = self._plan_set.deselect.engine_reason(plan.engine)
        if barred is not None:  # a restored plan (deserialize_plan) is in no collection
            raise InvalidValueError(f"plan {plan.name}: {barred}")
        pack = normalize_variant_pack(self, variant_pack, handle)
        with handle.stream_context():
            plan.execute(pack, workspace, handle.stream)
        if type(variant_pack) is dict:
            self._binding = bind_pack(self, variant_pack, plan, handle, self._plan_set.plans)

    # ---- plan serialization (full restoration of the selected plan) -----------------------
    def serialize_plan(self) -> str:
        """The selected plan as JSON (engine, knobs, graph key, device); no pickle.

        Restore it later with :meth:`deserialize_plan` on a graph with the same key.
        """

        plan = self._require_active_plan()
        self.check_plan_current("serialize_plan()")
        return serialize_plan(plan, self, self.handle)

    def check_plan_current(self, action: str) -> None:
        """Raise BadStateError when the graph changed since its plan was built (a node or
        tensor added, a tensor edited): the plan computes the graph as it was, and its key
        would name the graph as it is. ``action``: what was asked, for the message."""
        if self.revision != self._plan_revision and self._active_plan is not None:
            raise BadStateError(
                f"graph {self.name!r} changed (a node or tensor was added, or a tensor edited) "
                "since its plan was built; call build_operation_graph(handle), then "
                f"create_execution_plans() and build_plans(), or autotune(), before {action}"
            )

    def deserialize_plan(self, handle: Handle, data: str | bytes | Mapping[str, Any]) -> Graph:
        """Rebuild a serialized plan and make it the plan execute() runs.

        The graph's deselect criteria hold, as for the plans it builds: a plan of an engine
        deselected by deselect_engines(), or one whose workspace exceeds the
        deselect_workspace_greater_than() limit, is refused ("Plan barred").

        Raises:
            InvalidValueError: the data is for another graph key or another device, is not a
                complete serialized plan, or the deselect criteria bar its plan.
            NotSupportedError: the engine cannot run here.
        """

        if not self.is_built or self._plan_set.handle is not handle:
            self.build_operation_graph(handle)
        self._select(deserialize_plan(self, handle, data, self._plan_set.deselect))
        return self

    # ---- plan-spec path (RFC 6.2) ---------------------------------------------------------
    def _spec_collection(self, what: str) -> PlanSpecCollection:

        if not self.is_built:
            raise BadStateError(f"{what}: call build_operation_graph(handle) first")
        if self._plan_set.plans is not None:
            raise BadStateError(
                f"{what}: execution plans already exist (create_execution_plans/build); the "
                "plan-spec and compiled-plan paths are mutually exclusive on one Graph"
            )
        if self._plan_set.specs is None:
            self._plan_set.specs = PlanSpecCollection(self, self.handle)
        return self._plan_set.specs

    def get_engine_configs(
        self, modes: Sequence[HeuristicMode] = (HeuristicMode.FALLBACK,)
    ) -> list[EngineConfigInfo]:
        """Applicable engines for this graph and device, ordered by the heuristics."""

        if not self.is_built:
            raise BadStateError("get_engine_configs: call build_operation_graph(handle) first")
        return engine_configs(self, self.handle, list(modes))

    def add_engine_configs(self, configs: Sequence[EngineConfigInfo]) -> Graph:
        self._spec_collection("add_engine_configs").add_engine_configs(configs)
        return self

    def add_engines(self, engine_ids: Sequence[int | str]) -> Graph:
        self._spec_collection("add_engines").add_engines(engine_ids)
        return self

    def add_engine(
        self,
        engine_id: int | str,
        knob_settings: Sequence[KnobSetting] | Mapping[str, KnobValue] = (),
    ) -> Graph:
        self._spec_collection("add_engine").add_engine(engine_id, knob_settings)
        return self

    def add_engine_variants(self, variants: Sequence[EngineVariant]) -> Graph:
        self._spec_collection("add_engine_variants").add_engine_variants(variants)
        return self

    def add_engine_sweep(self, specs: Sequence[EngineSweepSpec]) -> Graph:
        self._spec_collection("add_engine_sweep").add_engine_sweep(specs)
        return self

    def add_all_engines(self, modes: Sequence[HeuristicMode] = (HeuristicMode.FALLBACK,)) -> Graph:
        """Every applicable engine's default plan, as candidates to tune; NotSupportedError,
        naming each engine's reason, where none applies (an empty list of configs said only
        "no engine configs given"; new-user audit, session 55)."""
        configs = self.get_engine_configs(modes)
        if not configs:
            raise no_engine_error(self, self.handle)
        return self.add_engine_configs(configs)

    def get_estimated_max_workspace_size(self) -> int:
        return self._spec_collection(
            "get_estimated_max_workspace_size"
        ).estimated_max_workspace_size()

    @property
    def plan_specs(self) -> list[Any]:
        return [] if self._plan_set.specs is None else list(self._plan_set.specs)

    # ---- autotune (RFC 6.3) ---------------------------------------------------------------
    def autotune(
        self,
        handle: Handle,
        variant_pack: Mapping[PackKey, Any],
        workspace: torch.Tensor | None = None,
        workspace_size: int | None = None,
        config: AutotuneConfig | None = None,
        storage_config: AutotuneStorageConfig | None = None,
    ) -> list[AutotuneResult]:
        """Benchmark the candidates, keep the winner for execute(), return one result each.

        ``workspace_size=None`` selects the compiled-plan form; an int the general form.
        Raises AutotuneError (with ``.results``) when no candidate can be chosen.
        """

        self.last_autotune_results = []  # never the results of an earlier call
        try:
            outcome = run_autotune(
                self,
                self._plan_set,
                handle,
                variant_pack,
                workspace,
                workspace_size,
                config,
                storage_config,
            )
        except AutotuneError as exc:
            self.last_autotune_results = list(exc.results)
            raise
        self.last_autotune_results = outcome.results
        self._select(outcome.winner)
        return outcome.results

    def autotune_exhaustive_sweep(
        self,
        handle: Handle,
        variant_pack: Mapping[PackKey, Any],
        workspace: torch.Tensor | None = None,
        workspace_size: int | None = None,
        config: AutotuneConfig | None = None,
    ) -> tuple[list[AutotuneResult], CacheWriteOutcome]:
        """EXHAUSTIVE + BENCHMARK_UNPRIMED over every applicable engine; persists the ranking."""

        self.last_autotune_results = []  # never the results of an earlier call
        try:
            results, outcome, winner = run_exhaustive_sweep(
                self, self._plan_set, handle, variant_pack, workspace, workspace_size, config
            )
        except AutotuneError as exc:
            self.last_autotune_results = list(exc.results)
            raise
        self.last_autotune_results = results
        self._select(winner)
        return results, outcome
