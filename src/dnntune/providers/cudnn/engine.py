"""CUDNN_ENGINE: dnntune graphs run as cuDNN frontend graphs, on the plan cuDNN ranks first,
the plan a knob names, or the plan its own search found fastest (remembered in a find db).

Knobs: ``cudnn.heur_mode`` (which heuristics list the plans), ``cudnn.engine_config`` (-1:
heuristic choice or find-db record; i: the i-th distinct plan), ``cudnn.allow_tf32`` (float32
convolutions and matmuls only; 0, the default: TF32 engine configs are deselected, so the plan
computes in float32 and passes float32 tolerances; 1: TF32 plans allowed, checked against a
tolerance the caller loosens, as with ``torch.allow_tf32``), ``global.workspace_size_limit``
and ``global.benchmarking``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune import settings
from dnntune.backend.engine import Engine, Plan
from dnntune.backend.estimates import builds_allowed
from dnntune.backend.knobs import (
    BENCHMARKING,
    WORKSPACE_SIZE_LIMIT,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValue,
    KnobValueType,
    StringConstraint,
    benchmarking_knob,
    workspace_limit_knob,
)
from dnntune.errors import DnnTuneError, NotSupportedError
from dnntune.graph.signature import graph_key
from dnntune.providers.cudnn._runtime import (
    load_cudnn,
    versions,
)
from dnntune.providers.cudnn.find_db import FindDb, FindDbKey, parse_engine_tag
from dnntune.providers.cudnn.parallel_build import build_ahead
from dnntune.providers.cudnn.plan import CudnnPlan
from dnntune.providers.cudnn.problem import HEUR_MODES, get_problem
from dnntune.providers.cudnn.search import make_search
from dnntune.providers.cudnn.selection import select_plan
from dnntune.providers.cudnn.support import (
    excluded_numeric_notes,
    has_fp32_dot,
    unsupported_reason,
)
from dnntune.providers.engine_output import captured_engine_output

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["ALLOW_TF32", "ENGINE_CONFIG", "HEUR_MODE", "CudnnEngine", "CudnnPlan"]

_log = logging.getLogger(__name__)

HEUR_MODE = "cudnn.heur_mode"
ENGINE_CONFIG = "cudnn.engine_config"
ALLOW_TF32 = "cudnn.allow_tf32"
_MAX_PLANS = 2**31 - 1
#: every tune times cuDNN's heuristic plans 1..SUGGESTED_PLANS-1 beside its first choice
#: (``suggested_variants``). On session 24's H200 suite graphs, plans 0-5 held most of what
#: cuDNN's own search (EXHAUSTIVE's priming) found, at a fraction of its cost: best of the six
#: against the first choice 1.075x / 1.069x / 1.083x / 1.126x / 1.102x on conv dgrad 3x3, conv
#: 3x3, conv 1x1 s2, the BERT-large QKV GEMM and a SiLU-gated GEMM (the search: 1.047x /
#: 1.046x / 1.081x / 1.116x / 1.067x), 1.289x on a 1x1 conv where the search found 1.003x;
#: timing the six took 0.1-0.5 s a graph, the search 0.2-13 s
#: (benchmarks/results/h200_2026-12-03_s24/cudnn_engine_configs.json)
SUGGESTED_PLANS = 6


_ALLOW_TF32_KNOB = Knob(
    ALLOW_TF32,
    "float32 convolutions and matmuls: 0 only plans that compute in float32 (cuDNN's engine "
    "configs with the TENSOR_CORE or DOWN_CONVERT_INPUTS numerical note deselected); 1 also "
    "TF32 tensor-core plans (faster, about 1e-3 relative error: verify with a looser "
    "tolerance). fp16/bf16 graphs are unaffected",
    KnobValueType.INT64,
    0,
    IntConstraint(0, 1),
    tf32=True,
)


def _backend_version() -> int | None:
    """The loaded cuDNN's version (e.g. 91900), for the support rules that depend on it; None
    where it cannot be read (those rules are then left to cuDNN)."""
    try:
        return int(versions()["cudnn_backend"])
    except Exception:  # a frontend without backend_version, or a fake in tests
        return None


class CudnnEngine(Engine):
    """Graphs lowered to ``cudnn.pygraph`` (nvidia-cudnn-frontend); plans are cuDNN's plans."""

    name = "CUDNN_ENGINE"
    compile_cost = 2.0  # one cuDNN frontend graph build
    provider = "cudnn"
    devices = ("cuda",)

    # ---- applicability ------------------------------------------------------------------
    def check_available(self) -> None:
        load_cudnn()

    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        if not handle.is_cuda:
            raise NotSupportedError(f"CUDNN_ENGINE needs CUDA; the handle is on {handle.device}")
        self.check_available()
        reason = unsupported_reason(graph, _backend_version())
        if reason:
            raise NotSupportedError(reason)
        get_problem(graph, handle.device.index or 0, "a")

    # ---- knobs --------------------------------------------------------------------------
    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        upper = _MAX_PLANS
        if graph is not None:
            count = _distinct_plan_count(graph)
            if count is not None:
                upper = count - 1
        return [
            Knob(
                HEUR_MODE,
                "cuDNN heuristics queried for the plan list: a (mode A, then FALLBACK), "
                "b (mode B, then FALLBACK), fallback",
                KnobValueType.STRING,
                "a",
                StringConstraint(frozenset(HEUR_MODES)),
            ),
            Knob(
                ENGINE_CONFIG,
                "-1: cuDNN's heuristic choice (or the find-db record); i: the i-th plan of "
                "cuDNN's list for this graph (distinct plans, heuristic order)",
                KnobValueType.INT64,
                -1,
                IntConstraint(-1, max(upper, -1)),
                ranked=True,
                plan_key=None if graph is None else _plan_identity(graph),
            ),
            *([_ALLOW_TF32_KNOB] if graph is None or has_fp32_dot(graph) else []),
            workspace_limit_knob(),
            benchmarking_knob(),
        ]

    def suggested_variants(self, graph: OpGraph) -> list[dict[str, KnobValue]]:
        # the next plans of cuDNN's heuristic list (see SUGGESTED_PLANS); none where the list
        # is not known (no GPU, or the graph not supported)
        count = _distinct_plan_count(graph)
        if count is None:
            return []
        return [{ENGINE_CONFIG: i} for i in range(1, min(count, SUGGESTED_PLANS))]

    def plan_count(self, graph: OpGraph, handle: Handle, heur_mode: str = "a") -> int:
        """How many distinct cuDNN plans the graph has (``cudnn.engine_config`` 0..count-1)."""
        return len(get_problem(graph, handle.device.index or 0, heur_mode).candidates)

    @staticmethod
    def _excluded_notes(graph: OpGraph, values: dict[str, Any]) -> tuple[str, ...]:
        return excluded_numeric_notes(graph, bool(values.get(ALLOW_TF32, 0)))

    # ---- building -----------------------------------------------------------------------
    def _values(self, knob_settings: Sequence[KnobSetting]) -> dict[str, Any]:
        self.validate_knobs(knob_settings)
        values = self.resolve_settings(knob_settings)
        forced = settings.force_benchmarking()
        values[BENCHMARKING] = bool(values[BENCHMARKING]) if forced is None else forced
        return values

    def estimate_workspace_size(self, graph: OpGraph, knob_settings: Sequence[KnobSetting]) -> int:
        """Workspace of the plan a heuristic build would pick (0 when it cannot be known)."""
        try:
            import torch

            if not torch.cuda.is_available():
                return 0
            values = self._values(knob_settings)
            problem = get_problem(
                graph,
                torch.cuda.current_device(),
                str(values[HEUR_MODE]),
                self._excluded_notes(graph, values),
            )
            config = int(values[ENGINE_CONFIG])
            if config >= 0:
                index = problem.candidates[config]
                if not builds_allowed():  # a budgeted tune builds it in its turn, if at all
                    return problem.built_workspace(index) or 0
                return problem.build(index)
            limit = int(values[WORKSPACE_SIZE_LIMIT])
            for index in problem.candidates:
                try:
                    ws = problem.build(index)
                except NotSupportedError:
                    continue
                if ws <= limit:
                    return ws
        except (DnnTuneError, IndexError, ImportError):
            return 0
        return 0

    def precompile(
        self, graph: OpGraph, knob_sets: Sequence[Sequence[KnobSetting]], handle: Handle
    ) -> None:
        """Build the plans of the engine configs ``knob_sets`` pin in worker processes, where
        that pays (:func:`~dnntune.providers.cudnn.parallel_build.build_ahead`): a norm's
        20-odd plans each compile a kernel. Never raises."""
        if not handle.is_cuda:
            return
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for knob_settings in knob_sets:
            try:
                values = self._values(knob_settings)
                config = int(values[ENGINE_CONFIG])
                notes = self._excluded_notes(graph, values)
            except (DnnTuneError, ValueError, TypeError):
                continue  # named by its own compile
            if config >= 0 and not values[BENCHMARKING]:
                groups.setdefault((str(values[HEUR_MODE]), notes), []).append(config)
        for (mode, notes), configs in groups.items():
            try:
                problem = get_problem(graph, handle.device.index or 0, mode, notes)
            except DnnTuneError:
                continue
            count = len(problem.candidates)
            indices = [problem.candidates[c] for c in configs if c < count]
            build_ahead(problem, graph, indices)

    def estimate_ahead(
        self, graph: OpGraph, knob_sets: Sequence[Sequence[KnobSetting]], handle: Handle
    ) -> None:
        """The workspace estimates of ``knob_sets`` build their plans: :meth:`precompile`
        (nothing under :func:`~dnntune.backend.estimates.estimates_without_builds`)."""
        if builds_allowed():
            self.precompile(graph, knob_sets, handle)

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        if not handle.is_cuda:
            raise NotSupportedError(f"CUDNN_ENGINE needs CUDA; the handle is on {handle.device}")
        values = self._values(knob_settings)
        heur_mode = str(values[HEUR_MODE])
        limit = int(values[WORKSPACE_SIZE_LIMIT])
        notes = self._excluded_notes(graph, values)
        # what the cuDNN frontend prints from Python while it builds and searches: DEBUG (-vv)
        with captured_engine_output(self.name):
            problem = get_problem(graph, handle.device.index or 0, heur_mode, notes)
            vers = versions()
            db = FindDb.default()
            key = FindDbKey(
                graph_key=graph_key(graph),
                device_key=handle.device_key(),
                cudnn_backend=int(vers["cudnn_backend"]),
                cudnn_frontend=str(vers["cudnn_frontend"]),
                heur_mode=heur_mode,
                workspace_limit=limit,
                excluded_numeric_notes=notes,
            )
            chosen = select_plan(
                problem,
                engine_config=int(values[ENGINE_CONFIG]),
                benchmarking=bool(values[BENCHMARKING]),
                workspace_limit=limit,
                db=db,
                key=key,
                search=make_search(problem, graph, handle),
                # cuDNN's search builds every plan: the runtime-compiled ones in worker processes
                build_ahead=lambda indices: build_ahead(problem, graph, indices),
            )
        metadata: dict[str, Any] = {
            **problem.plan_facts(chosen.index),
            **vers,
            "selection": chosen.how,
            "find_db": chosen.find_db,
            "workspace_bytes": chosen.workspace_bytes,
            "cudnn_allow_tf32": bool(values[ALLOW_TF32]),
        }
        if chosen.median_time_ms is not None:
            metadata["median_time_ms"] = chosen.median_time_ms
        if chosen.timings:
            metadata["search"] = [
                {
                    "cudnn_plan_index": t.index,
                    "cudnn_plan_name": t.name,
                    "workspace_bytes": t.workspace_bytes,
                    "median_ms": t.median_ms if t.ok else None,
                    "error": t.error or None,
                    "round": t.round,
                }
                for t in sorted(chosen.timings, key=lambda t: t.median_ms)
            ]
        _log.debug(
            "CUDNN_ENGINE: graph %s -> cuDNN plan %s (%s, find db %s)",
            graph.name,
            metadata["cudnn_plan_name"],
            chosen.how,
            chosen.find_db,
        )
        return CudnnPlan(
            self, knob_settings, problem, chosen.index, chosen.workspace_bytes, metadata
        )


def _current_device() -> int | None:
    """The current CUDA device's index; None without CUDA."""
    try:
        import torch

        return int(torch.cuda.current_device()) if torch.cuda.is_available() else None
    except Exception:  # no usable CUDA runtime
        return None


def _plan_identity(graph: OpGraph) -> Callable[[Mapping[str, KnobValue]], Hashable | None]:
    """``cudnn.engine_config``'s ``Knob.plan_key`` for ``graph``: the engine config (cuDNN
    engine id and knobs, parsed from the engine tag) that an explicit index names in its heur
    mode's plan list, with the numerical notes deselected (``cudnn.allow_tf32``), so that
    ``(heur_mode, engine_config)`` pairs naming one engine config are one plan whatever their
    index. Read from the problem's plan list (lowering and the heuristics query; no plan is
    built). None (not known without building) for -1 (the heuristic choice or the find-db
    record: the first plan that builds), under ``global.benchmarking`` (a search), without a
    GPU, or where the list cannot be had."""

    def identity(values: Mapping[str, KnobValue]) -> Hashable | None:
        index = int(values.get(ENGINE_CONFIG, -1))
        if index < 0 or values.get(BENCHMARKING) or settings.force_benchmarking():
            return None
        device = _current_device()
        if device is None:
            return None
        notes = excluded_numeric_notes(graph, bool(values.get(ALLOW_TF32, 0)))
        try:
            problem = get_problem(graph, device, str(values.get(HEUR_MODE, "a")), notes)
            tag = problem.name_at(problem.candidates[index])
        except (DnnTuneError, IndexError):
            return None
        engine_id, knobs = parse_engine_tag(tag)
        if engine_id is None:  # an unparsed tag: the tag itself names the config
            return ("cudnn", tag, notes)
        return ("cudnn", engine_id, tuple(sorted(knobs.items())), notes)

    return identity


def _distinct_plan_count(graph: OpGraph) -> int | None:
    """Distinct plans cuDNN offers for ``graph`` on the current GPU (heur mode a), if known."""
    device = _current_device()
    if device is None:
        return None
    try:
        load_cudnn()
        return len(get_problem(graph, device, "a").candidates)
    except (DnnTuneError, ImportError):
        return None
