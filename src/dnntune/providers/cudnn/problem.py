"""One graph lowered to cuDNN for one device and heuristic mode: cuDNN's plan list and builds.

A :class:`CudnnProblem` is what cuDNN's own frontend calls a graph after
``validate -> build_operation_graph -> create_execution_plans -> check_support``. Plans are
built lazily by index and shared by every dnntune Plan that uses the problem, each executing
its own index (``execute_plan_at_index``). Problems are cached per graph key, uid numbering,
device, heuristic mode and deselected numerical notes (``cudnn.allow_tf32=0`` leaves TF32
engines out of float32 convolutions and matmuls), failures included, so support checks, knob
queries and builds of the same graph lower it once.

A plan whose build compiled a kernel is kept on disk (:mod:`dnntune.providers.cudnn.plan_store`)
and loaded, not built, by later processes: such a plan runs from its own frontend graph
(:meth:`CudnnProblem.runner`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from dnntune.errors import NotSupportedError
from dnntune.graph.signature import graph_key
from dnntune.providers.cudnn._runtime import cudnn_handle, load_cudnn
from dnntune.providers.cudnn.find_db import parse_engine_tag
from dnntune.providers.cudnn.lowering import LoweringError, lower_graph, uid_signature
from dnntune.providers.cudnn.plan_store import StoredBuilds
from dnntune.providers.cudnn.support import FP32_MATMUL_TF32, has_fp32_matmul, known_fault_reason

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph

__all__ = [
    "HEUR_MODES",
    "CudnnProblem",
    "clear_problem_cache",
    "deselect_numeric_notes",
    "get_problem",
]

_log = logging.getLogger(__name__)

#: dnntune heur mode -> cuDNN heuristic modes queried, in order (the lists are concatenated and
#: deduplicated by plan name, so A's ranking comes first and FALLBACK adds the rest)
HEUR_MODES: dict[str, tuple[str, ...]] = {
    "a": ("A", "FALLBACK"),
    "b": ("B", "FALLBACK"),
    "fallback": ("FALLBACK",),
}

_CACHE_SIZE = 256
_cache: OrderedDict[tuple[Any, ...], CudnnProblem | NotSupportedError] = OrderedDict()
_cache_lock = threading.Lock()


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:600] + ("..." if len(text) > 600 else "")


class CudnnProblem:
    """cuDNN's view of one graph: the frontend graph, its plans, their builds and workspaces."""

    def __init__(
        self,
        graph: OpGraph,
        device_index: int,
        heur_mode: str,
        excluded_notes: tuple[str, ...] = (),
    ) -> None:
        import torch

        cudnn = load_cudnn()
        self.device_index = device_index
        self.heur_mode = heur_mode
        #: numerical notes whose engine configs are deselected (``cudnn.allow_tf32=0``)
        self.excluded_notes = tuple(excluded_notes)
        if self.excluded_notes and has_fp32_matmul(graph):
            raise NotSupportedError(FP32_MATMUL_TF32)
        modes = HEUR_MODES[heur_mode]
        # If a secondary mode breaks the query (it happens, cudnn-frontend issue #75), retry
        # with the primary mode alone before declining the graph.
        attempts = [modes, modes[:1]] if len(modes) > 1 else [modes]
        failure: Exception | None = None
        unsupported = False  # check_support failed (not the heuristics query)
        with torch.cuda.device(device_index):
            handle = cudnn_handle(device_index, 0)
            for attempt in attempts:
                try:
                    lowered = lower_graph(cudnn, graph, handle)
                except LoweringError as exc:
                    raise NotSupportedError(str(exc)) from None
                except Exception as exc:  # cuDNN refused an op while we built the graph
                    raise NotSupportedError(f"cuDNN: {_short(exc)}") from None
                g = lowered.graph
                try:
                    g.validate()
                    g.build_operation_graph()
                except Exception as exc:
                    raise NotSupportedError(f"cuDNN: {_short(exc)}") from None
                try:
                    g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in attempt])
                except Exception as exc:
                    failure = exc
                    continue
                # deselected configs stay in the list (indices stay cuDNN's) but never build
                deselect_numeric_notes(cudnn, g, self.excluded_notes)
                try:
                    g.check_support()
                except Exception as exc:
                    failure, unsupported = exc, True
                    continue
                self.modes_used = attempt
                break
            else:
                assert failure is not None
                if self.excluded_notes and unsupported:
                    raise NotSupportedError(
                        f"cuDNN offers no plan for this graph without the numerical notes "
                        f"{', '.join(self.excluded_notes)} (float32 math, TF32 excluded by "
                        f"cudnn.allow_tf32=0); set cudnn.allow_tf32=1 to allow TF32 plans: "
                        f"{_short(failure)}"
                    )
                raise NotSupportedError(f"cuDNN: {_short(failure)}")
        self.lowered = lowered
        self.graph: Any = lowered.graph
        self.io_uids = lowered.io_uids
        self.scalar_pointers = lowered.scalar_pointers()
        self.plan_count = int(g.get_execution_plan_count())
        self._names = [str(g.get_plan_name_at_index(i)) for i in range(self.plan_count)]
        first: dict[str, int] = {}
        for i, name in enumerate(self._names):
            first.setdefault(name, i)
        self._candidates = tuple(first.values())
        self._workspace: dict[int, int] = {}
        self._errors: dict[int, str] = {}
        for i, name in enumerate(self._names):
            # known to write into an input or to be wrong here: listed (indices stay
            # cuDNN's), never built
            why = known_fault_reason(graph, parse_engine_tag(name)[0])
            if why is not None:
                self._errors[i] = f"cuDNN plan {name} is refused: {why}"
        self._lock = threading.Lock()
        #: plan index -> the frontend graph its plan was loaded into from the plan store, the
        #: plan's behavior notes (a loaded graph answers no per-plan query) and the
        #: serialization it was loaded from
        self._loaded: dict[int, tuple[Any, tuple[str, ...], bytes]] = {}
        self._stored = StoredBuilds.of(graph, device_index, heur_mode, self.excluded_notes, handle)

    # ---- PlanSource ---------------------------------------------------------------------
    @property
    def candidates(self) -> tuple[int, ...]:
        """cuDNN plan indices, one per distinct engine tag, in heuristic order."""
        return self._candidates

    def name_at(self, index: int) -> str:
        return self._names[index]

    def build(self, index: int) -> int:
        """Build cuDNN plan ``index`` once; return its workspace bytes (NotSupportedError)."""
        ws = self._workspace.get(index)
        if ws is not None:
            return ws
        with self._lock:
            if index in self._workspace:
                return self._workspace[index]
            if index in self._errors:
                raise NotSupportedError(self._errors[index])
            import torch

            try:
                with torch.cuda.device(self.device_index):
                    ws = self._build(index)
            except Exception as exc:
                name = self._names[index]
                why = _short(exc)
                if self.excluded_notes and "deselect" in why.lower():
                    why = (
                        f"deselected: it has one of the numerical notes "
                        f"{', '.join(self.excluded_notes)} (TF32 for float32; "
                        f"cudnn.allow_tf32=1 allows it)"
                    )
                self._errors[index] = f"cuDNN plan {name} did not build: {why}"
                raise NotSupportedError(self._errors[index]) from None
            self._workspace[index] = ws
            return ws

    def _build(self, index: int) -> int:
        """Load plan ``index`` from the plan store, or build it (and store it if its build was
        slow); its workspace bytes."""
        name = self._names[index]
        stored = self._stored
        loaded = stored.load(load_cudnn(), name) if stored is not None else None
        if loaded is not None:
            graph, notes, workspace, blob = loaded
            self._loaded[index] = (graph, notes, blob)
            return workspace
        start = time.perf_counter()
        self.graph.build_plan_at_index(index)
        ws = int(self.graph.get_workspace_size_plan_at_index(index))
        if stored is not None:  # serializes the plan just built (the frontend's candidate)
            stored.keep(self.graph, name, time.perf_counter() - start, self._notes(index))
        return ws

    def built_workspace(self, index: int) -> int | None:
        """Plan ``index``'s workspace bytes if it is built (or loaded) already, else None."""
        return self._workspace.get(index)

    @property
    def stores_plans(self) -> bool:
        """Whether built plans are kept in the plan store (and found there by other processes)."""
        return self._stored is not None

    def needs_build(self, index: int) -> bool:
        """Plan ``index`` is neither built, nor refused, nor in the plan store."""
        if index in self._workspace or index in self._errors:
            return False
        return self._stored is None or not self._stored.has(self._names[index])

    def loaded(self, index: int) -> bool:
        """Plan ``index`` was loaded from the plan store."""
        return index in self._loaded

    def serialized(self, index: int) -> bytes | None:
        """The frontend's serialization of built plan ``index`` (its backend JSON, compiled
        kernel included), or None where it cannot be had. A plan built here is made the
        frontend's candidate again first (no rebuild: the frontend keeps built plans)."""
        loaded = self._loaded.get(index)
        if loaded is not None:
            return loaded[2]
        with self._lock:
            if index not in self._workspace:
                return None
            try:
                import torch

                with torch.cuda.device(self.device_index):
                    self.graph.build_plan_at_index(index)
                    return bytes(self.graph.serialize())
            except Exception as exc:  # an engine whose plans the frontend cannot serialize
                _log.debug("cuDNN plan %s not serialized: %s", self._names[index], exc)
                return None

    def runner(self, index: int) -> tuple[Any, int]:
        """The frontend's ``_execute_plan_at_index`` of the graph that holds built plan
        ``index``, and the plan's index there (a plan loaded from the store is index 0 of its
        own graph)."""
        loaded = self._loaded.get(index)
        if loaded is not None:
            return loaded[0]._execute_plan_at_index, 0
        return self.graph._execute_plan_at_index, index

    def _notes(self, index: int) -> list[str]:
        """The behavior notes of built plan ``index`` (none where the frontend cannot tell)."""
        try:
            return [n.name for n in self.graph.get_behavior_notes_for_plan_at_index(index)]
        except Exception:  # older frontends or unbuilt plans: the notes are optional
            return []

    # ---- facts --------------------------------------------------------------------------
    def plan_facts(self, index: int) -> dict[str, Any]:
        """What identifies plan ``index`` across runs: tag, cuDNN engine id, knobs, notes."""
        name = self._names[index]
        engine, knobs = parse_engine_tag(name)
        loaded = self._loaded.get(index)
        notes = list(loaded[1]) if loaded is not None else self._notes(index)
        return {
            "cudnn_plan_name": name,
            "cudnn_plan_index": index,
            "cudnn_engine_id": engine,
            "cudnn_knobs": knobs,
            "cudnn_behavior_notes": notes,
            "cudnn_heur_modes": [m.lower() for m in self.modes_used],
            "cudnn_excluded_numeric_notes": list(self.excluded_notes),
            "cudnn_plan_count": self.plan_count,
            "cudnn_distinct_plans": len(self._candidates),
            # built in an earlier process and loaded from the plan store (no compile here)
            "cudnn_plan_loaded": loaded is not None,
        }

    def execute(
        self, index: int, pointers: dict[int, int], workspace_ptr: int, handle: int
    ) -> None:
        run, at = self.runner(index)
        run(pointers, workspace_ptr, at, handle)


def deselect_numeric_notes(cudnn: Any, graph: Any, notes: tuple[str, ...]) -> None:
    """Deselect ``graph``'s engine configs that carry any of ``notes`` (names of
    ``cudnn.numerical_note`` members), between ``create_execution_plans`` and
    ``check_support``; a frontend that cannot do it is refused, never silently ignored."""
    if not notes:
        return
    enum = getattr(cudnn, "numerical_note", None)
    method = getattr(graph, "deselect_numeric_notes", None)
    if enum is None or method is None or not all(hasattr(enum, n) for n in notes):
        raise NotSupportedError(
            "this nvidia-cudnn-frontend cannot deselect engine configs by numerical note, so "
            "TF32 plans of a float32 graph cannot be excluded; set cudnn.allow_tf32=1 or "
            "upgrade nvidia-cudnn-frontend (1.0 or later)"
        )
    method([getattr(enum, n) for n in notes])


def get_problem(
    graph: OpGraph, device_index: int, heur_mode: str, excluded_notes: tuple[str, ...] = ()
) -> CudnnProblem:
    """The cached problem for ``graph`` (NotSupportedError, also cached, when cuDNN declines);
    one per set of ``excluded_notes`` (a deselection changes the frontend graph's plans)."""
    if not graph.is_validated:
        graph.validate()
    key = (graph_key(graph), uid_signature(graph), device_index, heur_mode, excluded_notes)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    if hit is None:
        try:
            hit = CudnnProblem(graph, device_index, heur_mode, excluded_notes)
        except NotSupportedError as exc:
            hit = exc
        with _cache_lock:
            _cache[key] = hit
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, NotSupportedError):
        raise NotSupportedError(str(hit))
    return hit


def clear_problem_cache() -> None:
    with _cache_lock:
        _cache.clear()
