"""The provider contract: an Engine turns a graph plus knob settings into an executable Plan.

Providers own their lowering; nothing outside ``providers/`` knows an engine's internals. An
engine does not know it is being tuned (providers never import ``autotune/``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.backend.knobs import (
    BENCHMARKING,
    Knob,
    KnobSetting,
    KnobValue,
    normalize_settings,
)
from dnntune.errors import BadStateError, InvalidValueError

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "BoundCall",
    "PointerCall",
    "Engine",
    "Plan",
    "VariantPack",
    "engine_id",
    "engine_id_hex",
    "engine_name_or_id",
    "register_plan_serializer",
]

#: uid -> tensor, already validated against the graph
VariantPack = Mapping[int, "torch.Tensor"]
#: a plan's execute with its pack's uids fixed: ``call(tensors, workspace)``, the tensors in the
#: order of the uids given to :meth:`Plan.bind`, already validated, run on the current stream
BoundCall = Callable[[Sequence["torch.Tensor"], "torch.Tensor | None"], None]
#: :meth:`Plan.bind_pointers`'s call: the tensors' data pointers in bound order (a tuple of
#: ints, or 8 bytes each as the native pointer reader gives them) and the workspace
PointerCall = Callable[["tuple[int, ...] | bytes", "torch.Tensor | None"], None]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def engine_id(name: str) -> int:
    """64-bit FNV-1a of the engine name as a signed int64, as hipDNN computes engine ids."""
    h = _FNV_OFFSET
    for byte in name.encode():
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= (1 << 63) else h


def engine_id_hex(engine_id: int) -> str:
    """An engine id as dnntune writes it in hex: its 64-bit two's complement, upper case, 16
    digits (``0x0583DAC6...``). One form for every output: ``engines --json``'s ``id_hex`` was
    lower case where bench results were upper case (docs/bench.md documents ``0x%016X``).
    :func:`engine_name_or_id` reads either case back."""
    return f"0x{engine_id & 0xFFFFFFFFFFFFFFFF:016X}"


def engine_name_or_id(text: str | int) -> int:
    """Parse an engine reference: a name, a decimal id or a ``0x`` hex id (two's complement)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    token = str(text).strip()
    if not token:
        raise InvalidValueError("empty engine name or id")
    try:
        if token.lower().startswith(("0x", "-0x")):
            value = int(token, 16)
            if value >= (1 << 63):
                value -= 1 << 64
            return value
        return int(token, 10)
    except ValueError:
        return engine_id(token)


PlanSerializer = Callable[["Plan", "OpGraph", "Handle"], str]
_plan_serializer: PlanSerializer | None = None


def register_plan_serializer(serializer: PlanSerializer) -> None:
    """Install the function behind ``Plan.serialize`` (``dnntune.overrides`` does, at import;
    the backend never imports it, as with the Config heuristic policy)."""
    global _plan_serializer
    _plan_serializer = serializer


class Plan(abc.ABC):
    """A compiled, executable plan: one engine, fixed knob settings, a workspace size."""

    def __init__(
        self,
        engine: Engine,
        knob_settings: Sequence[KnobSetting],
        workspace_size: int = 0,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.knob_settings: tuple[KnobSetting, ...] = normalize_settings(knob_settings)
        self.workspace_size = int(workspace_size)
        #: provider facts worth recording (e.g. cuDNN's own engine id and knobs for stability)
        self.metadata: dict[str, Any] = dict(metadata or {})
        #: the graph and handle it was selected for (set by the Graph facade)
        self.origin: tuple[OpGraph, Handle] | None = None
        #: True when the plan runs PyTorch's own ops with PyTorch's default settings (no
        #: global flags, no layout conversion, no graph capture): what eager code runs.
        #: ``dnntune.torch`` then trains through PyTorch's op and autograd directly.
        self.runs_eager_ops = False

    def serialize(self) -> str:
        """This plan as JSON (engine, knobs, graph key, device); restore it with
        ``Graph.deserialize_plan(handle, data)``.

        Raises:
            BadStateError: the plan was not selected through a Graph (build_plans, autotune).
        """
        if self.origin is None:
            raise BadStateError(
                f"plan {self.name} was not selected through a Graph; serialize the Graph's "
                "plan (g.serialize_plan() or g.active_plan.serialize())"
            )
        if _plan_serializer is None:
            raise BadStateError("plan serialization needs dnntune.overrides (import dnntune)")
        graph, handle = self.origin
        return _plan_serializer(self, graph, handle)

    @property
    def name(self) -> str:
        """Engine name plus every non-default knob: ``TORCH_ENGINE[torch.allow_tf32=1]``."""
        defaults = {k.knob_id: k.default_value for k in self.engine.knob_list_cache()}
        shown = [s for s in self.knob_settings if defaults.get(s.knob_id) != s.value]
        if not shown:
            return self.engine.name
        return f"{self.engine.name}[{','.join(str(s) for s in shown)}]"

    def knob_value(self, knob_id: str, default: KnobValue | None = None) -> KnobValue | None:
        for s in self.knob_settings:
            if s.knob_id == knob_id:
                return s.value
        return default

    @abc.abstractmethod
    def execute(
        self,
        variant_pack: VariantPack,
        workspace: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        """Run the graph: read inputs from and write outputs into the variant pack's tensors."""

    #: True when ``execute`` reads only the data pointers of the pack's tensors (their dims and
    #: strides are the graph's by contract): a caller may then pass any tensor that starts at
    #: the same address with the graph's layout, e.g. a weight instead of its transposed view
    takes_pointers: bool = False

    def bind(self, uids: Sequence[int]) -> BoundCall:
        """``execute`` with the pack's uids fixed once, for callers that run a plan many times.

        The call takes the tensors in ``uids`` order (every uid ``execute`` reads must be
        there), already validated, and runs on the current stream. Plans override this to skip
        the per-call pack work; the default builds the pack and calls ``execute``.
        """
        keys = tuple(uids)
        execute = self.execute

        def call(tensors: Sequence[torch.Tensor], workspace: torch.Tensor | None) -> None:
            execute(dict(zip(keys, tensors, strict=True)), workspace, None)

        return call

    def bind_pointers(self, uids: Sequence[int]) -> PointerCall | None:
        """:meth:`bind` for a caller that has already read the tensors' data pointers (a
        plan that ``takes_pointers``): the call takes them as a tuple in ``uids`` order, so
        they are not read twice. None where the plan has no such call (the default)."""
        return None

    def __repr__(self) -> str:
        return f"<Plan {self.name} ws={self.workspace_size}>"


class Engine(abc.ABC):
    """One engine of a provider. Subclasses set ``name``, ``provider`` and ``devices``."""

    name: str = ""
    provider: str = ""
    #: device types the engine can run on ("cpu", "cuda")
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: a relative estimate of what building one plan costs (1.0: lowering a graph to eager
    #: PyTorch calls); a tuning budget tries cheap engines first (docs/measurement.md)
    compile_cost: float = 5.0
    #: wall seconds the first build of one plan takes in a fresh process, where it is long
    #: enough to matter to a tuning budget (None: short or unknown). Under a budget, a
    #: candidate whose expected compile does not fit in what is left of the search is skipped
    #: (:func:`dnntune.autotune.search.expected_compile_s`; after a compile of the engine in
    #: this process, that compile's time is the estimate)
    first_compile_s: float | None = None

    @property
    def id(self) -> int:
        return engine_id(self.name)

    def has_call_floor(self, handle: Handle) -> bool:
        """Whether :meth:`call_floor_ms` may know a floor on ``handle`` (cheap: nothing is
        measured). A search builds such an engine's candidates after the others."""
        return False

    def call_floor_ms(self, handle: Handle) -> float | None:
        """A measured lower bound on the time any plan of this engine takes a call on
        ``handle``'s clock (None: none known, the default). A search that has already timed a
        candidate faster than this does not build this engine's candidates: they cannot win
        (:mod:`dnntune.autotune.call_floor`)."""
        return None

    # ---- applicability ------------------------------------------------------------------
    def check_available(self) -> None:
        """Raise NotSupportedError if the provider's dependency is missing (e.g. no triton)."""
        return None

    @abc.abstractmethod
    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        """Return None if this engine can run ``graph`` on ``handle``'s device.

        Raises:
            NotSupportedError: with the reason.
        """

    # ---- knobs --------------------------------------------------------------------------
    @abc.abstractmethod
    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        """Knobs this engine exposes (for ``graph`` if given; all otherwise)."""

    def knob_list_cache(self) -> list[Knob]:
        cached: list[Knob] | None = getattr(self, "_knob_cache", None)
        if cached is None:
            cached = self.knobs(None)
            self._knob_cache = cached
        return cached

    def suggested_variants(self, graph: OpGraph) -> list[dict[str, KnobValue]]:
        """Knob settings besides the defaults that are worth one extra candidate for ``graph``
        in every tuning run (``add_suggested_variants``): few, cheap to build, and likely to
        win on some shapes. Empty by default."""
        return []

    def supports_exhaustive(self, graph: OpGraph | None = None) -> bool:
        """True when the engine has ``global.benchmarking`` (an internal search)."""
        return any(k.knob_id == BENCHMARKING for k in self.knobs(graph))

    def validate_knobs(self, settings: Sequence[KnobSetting], graph: OpGraph | None = None) -> None:
        """Raise InvalidValueError for an unknown knob or a bad value (first problem found)."""
        known = {k.knob_id: k for k in self.knobs(graph)}
        for s in settings:
            knob = known.get(s.knob_id)
            if knob is None:
                allowed = ", ".join(sorted(known)) or "none"
                if graph is not None and any(
                    k.knob_id == s.knob_id for k in self.knob_list_cache()
                ):
                    # a real knob of this engine, offered only for other ops or devices
                    # (torch.memory_format on a matmul): "unknown" would send the user to
                    # check a spelling that is right
                    raise InvalidValueError(
                        f"engine {self.name}: knob {s.knob_id!r} does not apply to this graph "
                        f"(the engine offers it for other operations or devices); its knobs "
                        f"for this graph: {allowed}"
                    )
                raise InvalidValueError(
                    f"engine {self.name}: unknown knob {s.knob_id!r}; its knobs: {allowed}"
                )
            knob.validate(s, self.name)

    def default_settings(self, graph: OpGraph | None = None) -> tuple[KnobSetting, ...]:
        return normalize_settings(
            [KnobSetting(k.knob_id, k.default_value) for k in self.knobs(graph)]
        )

    def resolve_settings(
        self, settings: Sequence[KnobSetting], graph: OpGraph | None = None
    ) -> dict[str, KnobValue]:
        """Defaults overlaid with ``settings``: the values a plan actually uses."""
        values: dict[str, KnobValue] = {k.knob_id: k.default_value for k in self.knobs(graph)}
        values.update({s.knob_id: s.value for s in settings})
        return values

    def settings_unsupported(
        self, graph: OpGraph, settings: Sequence[KnobSetting], handle: Handle
    ) -> str | None:
        """Why a plan with these knob ``settings`` cannot run on ``handle``'s device, found
        without building it (a CUDA-only setting on the CPU), else None: autotune asks it of a
        candidate a time budget leaves out, so that one the device could never run is counted
        as such and not as skipped for the budget. :meth:`compile` raises NotSupportedError
        for the same reason. None by default (nothing is known without a build)."""
        del graph, settings, handle
        return None

    # ---- building -----------------------------------------------------------------------
    def estimate_workspace_size(self, graph: OpGraph, knob_settings: Sequence[KnobSetting]) -> int:
        """Pre-compile workspace estimate in bytes."""
        return 0

    @abc.abstractmethod
    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        """Build a plan. Raises NotSupportedError or ExecutionError on failure."""

    def precompile(
        self, graph: OpGraph, knob_sets: Sequence[Sequence[KnobSetting]], handle: Handle
    ) -> None:
        """Build ahead, together, what :meth:`compile` will need for each of ``knob_sets``
        (autotune calls this before compiling an engine's candidates one by one), so that those
        calls find it built. Best effort, never raises: a setting that fails here fails again,
        and is reported, in its ``compile``. The default does nothing."""
        del graph, knob_sets, handle  # nothing to build ahead

    def estimate_ahead(
        self, graph: OpGraph, knob_sets: Sequence[Sequence[KnobSetting]], handle: Handle
    ) -> None:
        """Called before the workspace estimates of several plan specs of this engine are taken
        one by one (``add_engine_variants``): an engine whose estimates build plans (cuDNN's)
        may build them together here. Best effort, never raises. The default does nothing.
        (Not :meth:`precompile`: autotune's compile-ahead keeps its own rules, such as none
        under a time budget.)"""
        del graph, knob_sets, handle

    def __repr__(self) -> str:
        return f"<Engine {self.name} id={self.id}>"
