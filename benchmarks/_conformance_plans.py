"""The plans of one graph that dnntune can run, and one check of a plan against the reference.

Used by ``benchmarks/conformance.py``. A plan is an engine plus knob settings, built through the
public path (``Graph.create_execution_plan_ext`` + ``check_support`` + ``build_plans``). Its
outcome is one of:

* ``ok``: every output matches ``dnntune.reference`` within ``reference.tolerance_for``;
* ``refused``: ``InvalidValueError`` / ``NotSupportedError`` while creating or building it,
  with the reason (an engine may refuse; it may not be wrong);
* ``wrong``: it ran and an output is outside the tolerance;
* ``error``: anything else (a provider raised something other than a refusal while building,
  or the execute raised): a bug, counted with the wrong ones.

Output buffers are filled before a check with NaN (floating outputs) or, for integer and
boolean outputs, a value other than the expected one at every element, so a kernel that leaves
elements unwritten (or relies on zeroed outputs) fails instead of passing by luck.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

import dnntune as dt
from dnntune import Engine, allocate_workspace, get_registry, reference
from dnntune.autotune import knob_variants, sweep_variants
from dnntune.autotune.verification import InputGuard, outputs_alias_inputs
from dnntune.backend.knobs import KnobValue, allows_tf32
from dnntune.errors import InvalidValueError, NotSupportedError

BENCHMARKING = "global.benchmarking"
TRITON = "TRITON_ENGINE"
CUDNN = "CUDNN_ENGINE"
COMPILE = "TORCH_COMPILE_ENGINE"
ENGINES = ("TORCH_ENGINE", COMPILE, CUDNN, TRITON)


@dataclass
class PlanSpec:
    """An engine and knob settings, with where the tuner would offer it."""

    engine: str
    knobs: dict[str, KnobValue] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.engine + json.dumps(sorted(self.knobs.items()))

    @property
    def is_default(self) -> bool:
        return not self.knobs

    def label(self) -> str:
        if not self.knobs:
            return f"{self.engine}[default]"
        return self.engine + "[" + ",".join(f"{k}={v}" for k, v in sorted(self.knobs.items())) + "]"


def unavailable(names: list[str], device: str) -> dict[str, str]:
    """Engines of ``names`` that cannot run here at all (another device, a missing
    dependency), with why: not applicable, so not counted as refusals."""
    out: dict[str, str] = {}
    registry = get_registry()
    for name in names:
        engine = registry.find(name)
        if engine is None:
            out[name] = "not registered"
            continue
        if device not in engine.devices:
            out[name] = f"runs on {'/'.join(engine.devices)}, not {device}"
            continue
        try:
            engine.check_available()
        except NotSupportedError as exc:
            out[name] = str(exc)
    return out


def supports(graph: dt.Graph, handle: dt.Handle, name: str) -> str | None:
    """None if engine ``name`` supports ``graph`` on ``handle``, else why not."""
    registry = get_registry()
    return registry.why_not(registry.get(name), graph, handle)


def _add(specs: dict[str, PlanSpec], engine: str, knobs: dict[str, KnobValue], source: str) -> None:
    spec = PlanSpec(engine, dict(knobs))
    spec = specs.setdefault(spec.key, spec)
    if source not in spec.sources:
        spec.sources.append(source)


def _triton_configs(graph: dt.Graph) -> list[dict[str, KnobValue]]:
    """Every config TRITON_ENGINE's solver would search for ``graph``, each knob pinned."""
    from dnntune.providers.triton.patterns import match_graph
    from dnntune.providers.triton.solvers import device_limits, solver_for

    try:
        match = match_graph(graph)
    except NotSupportedError:
        return []
    solver = solver_for(match)
    return [
        {f"triton.{name}": value for name, value in config.items()}
        for config in solver.candidates(match, device_limits(), {})
    ]


#: at most this many cuDNN engine configs per graph (cuDNN lists a few dozen at most)
MAX_CUDNN_CONFIGS = 128


def _cudnn_configs(
    engine: Engine, graph: dt.Graph, handle: dt.Handle
) -> list[dict[str, KnobValue]]:
    """``cudnn.engine_config`` 0..N-1: every distinct cuDNN plan of the graph."""
    try:
        count = int(engine.plan_count(graph, handle))  # type: ignore[attr-defined]
    except Exception:  # not supported or no cuDNN: the default plan says why
        return []
    return [{"cudnn.engine_config": i} for i in range(min(count, MAX_CUDNN_CONFIGS))]


def plan_specs(
    graph: dt.Graph, engine_name: str, variants: bool, handle: dt.Handle | None = None
) -> list[PlanSpec]:
    """The default plan of ``engine_name``; with ``variants`` every plan the tuner can offer:

    the engine's suggested variants (every tuning run), the ``dnntune bench --oracle`` knob
    product (``knob_variants``), the ``--sweep-knobs`` one-knob-at-a-time set, its internal
    search (``global.benchmarking=1``, EXHAUSTIVE mode's priming), cuDNN's engine configs
    0..N-1 and every config of the Triton solver with all of its knobs pinned.
    """
    specs: dict[str, PlanSpec] = {}
    _add(specs, engine_name, {}, "default")
    if not variants:
        return list(specs.values())
    engine = get_registry().get(engine_name)
    for knobs in engine.suggested_variants(graph):
        _add(specs, engine_name, knobs, "suggested")
    for knobs in knob_variants(engine, graph):
        _add(specs, engine_name, knobs, "oracle")
    for knobs in sweep_variants(engine, graph):
        _add(specs, engine_name, knobs, "sweep_knobs")
    if engine.supports_exhaustive(graph):
        _add(specs, engine_name, {BENCHMARKING: 1}, "exhaustive_priming")
    if engine_name == CUDNN and handle is not None:
        for knobs in _cudnn_configs(engine, graph, handle):
            _add(specs, engine_name, knobs, "cudnn_engine_config")
    if engine_name == TRITON:
        for knobs in _triton_configs(graph):
            _add(specs, engine_name, knobs, "triton_solver_config")
    return list(specs.values())


class _BuildWarnings(logging.Handler):
    """Collects 'plan ... failed to build' warnings: a provider raised a non-refusal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _capture_build_warnings() -> Iterator[_BuildWarnings]:
    handler = _BuildWarnings()
    logger = logging.getLogger("dnntune.backend.plans")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@dataclass
class Outcome:
    status: str  # ok | refused | wrong | error | skipped
    reason: str = ""
    max_abs_error: float | None = None
    mismatches: int = 0
    build_ms: float | None = None
    plan_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "max_abs_error": self.max_abs_error,
            "mismatches": self.mismatches,
            "build_ms": self.build_ms,
            "plan_name": self.plan_name,
        }


@dataclass
class Problem:
    """One graph's inputs and reference outputs, shared by all of its plans."""

    doc: dict[str, Any]
    graph: dt.Graph
    pack: dict[int, torch.Tensor]
    expected: dict[int, torch.Tensor]
    handle: dt.Handle
    guard: InputGuard | None = None
    #: (buffer, front margin bytes, back margin bytes) of every tensor's buffer
    margins: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)

    @classmethod
    def make(
        cls, doc: dict[str, Any], handle: dt.Handle, seed: int = 0, shifted: bool = False
    ) -> Problem:
        """``shifted``: every buffer starts one element past a 16-byte boundary (where its
        element is smaller), as a view ``x[..., 1:]`` or ``buf[1:].view(...)`` does: plans are
        built for aligned addresses (a cuDNN GEMM returned wrong numbers on such views)."""
        graph = dt.Graph.from_json(doc)
        graph.validate()
        made = reference.make_inputs(graph, handle.device, seed=seed)
        # every buffer sits inside a larger one whose margins hold a known byte: a plan that
        # writes outside its output (or into an input, the cuDNN norm engine 5 case) is wrong
        margins: list[tuple[torch.Tensor, int, int]] = []
        pack = {uid: _guarded(t, margins, shifted) for uid, t in made.items()}
        outputs = {t.uid for t in graph.output_tensors()}
        inputs = {uid: t for uid, t in pack.items() if uid not in outputs}
        expected = reference.run(graph, inputs)
        guard = InputGuard(pack, outputs, outputs_alias_inputs(graph, pack))
        return cls(doc, graph, pack, expected, handle, guard, margins)

    def poison_outputs(self) -> None:
        """Fill every output so that no element holds its expected value: NaN for floating
        outputs; for integer and boolean ones the expected value plus one (wrapping) or its
        negation, so an element a plan leaves unwritten fails even where the answer is 0."""
        for uid, want in self.expected.items():
            buf = self.pack[uid]
            if buf.is_floating_point():
                buf.fill_(float("nan"))
                continue
            expected = want.to(device=buf.device).reshape(buf.shape)
            if buf.dtype == torch.bool:
                buf.copy_(~expected.bool())
            else:
                buf.copy_(expected.to(buf.dtype) + 1)

    def compare(self, tf32: bool = False) -> Outcome:
        """Compare the pack's output buffers, as they are now, with the reference; inputs and
        the margins around every buffer must be untouched (both are put back if not).
        ``tf32``: the plan set a ``Knob.tf32`` knob (float32 dots in TF32, half's tolerance)."""
        self.handle.synchronize()
        clobbered = self.guard.changed() if self.guard is not None else ""
        if clobbered:
            return Outcome("wrong", f"the plan {clobbered}")
        outside = [
            i for i, (raw, m, b) in enumerate(self.margins) if not _margins_intact(raw, m, b)
        ]
        if outside:
            for raw, m, b in self.margins:
                raw[:m].fill_(_MARGIN_BYTE)
                raw[raw.numel() - b :].fill_(_MARGIN_BYTE)
            return Outcome(
                "wrong", f"the plan wrote outside its buffers ({len(outside)} margin(s))"
            )
        check = reference.check_outputs(self.graph, self.pack, self.expected, tf32=tf32)
        for failed in check.failed[:1]:
            c = failed.comparison
            where = f"output {failed.tensor.name!r} (uid {failed.uid})"
            return Outcome("wrong", f"{where}: {c.message}", c.max_abs_error, c.mismatches)
        return Outcome("ok", "", check.max_abs_error)


_MARGIN = 4096
_MARGIN_BYTE = 0xAB


def _guarded(
    t: torch.Tensor, margins: list[tuple[torch.Tensor, int, int]], shifted: bool = False
) -> torch.Tensor:
    """``t``'s values in a new buffer of the same layout, with _MARGIN bytes of _MARGIN_BYTE
    on each side (kept in ``margins`` to check); ``shifted``: one element more in front, so
    that the tensor starts off a 16-byte boundary where its element is smaller."""
    nbytes = t.untyped_storage().nbytes()
    front = _MARGIN + (t.element_size() if shifted and t.element_size() < 16 else 0)
    raw = torch.full((front + _MARGIN + nbytes,), _MARGIN_BYTE, dtype=torch.uint8, device=t.device)
    body = raw[front : front + nbytes].view(t.dtype) if nbytes else raw[:0].view(t.dtype)
    # copy the storage byte for byte: a broadcast input (a stride of 0 over a dimension of
    # more than one element) cannot be the destination of an element-wise copy
    src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    raw[front : front + nbytes].copy_(src)
    view = torch.as_strided(body, t.shape, t.stride(), body.storage_offset() + t.storage_offset())
    margins.append((raw, front, _MARGIN))
    return view


def shifted_case(index: int) -> bool:
    """Whether case ``index`` runs on buffers one element off a 16-byte boundary (a quarter
    of the cases: ``Problem.make(shifted=True)``)."""
    return index % 4 == 3


def _margins_intact(raw: torch.Tensor, front: int, back: int) -> bool:
    return bool((raw[:front] == _MARGIN_BYTE).all() and (raw[-back:] == _MARGIN_BYTE).all())


@dataclass
class BuiltPlan:
    graph: dt.Graph
    workspace: torch.Tensor | None
    build_ms: float
    name: str
    #: a ``Knob.tf32`` knob is set: checked with TF32's tolerance
    tf32: bool = False


def build(problem: Problem, spec: PlanSpec) -> BuiltPlan | Outcome:
    """Build ``spec`` on a fresh Graph of the same JSON; a refusal or a crash is an Outcome."""
    start = time.perf_counter()
    g = dt.Graph.from_json(problem.doc)
    with _capture_build_warnings() as warned:
        try:
            g.build_operation_graph(problem.handle)
            g.create_execution_plan_ext(spec.engine, spec.knobs)
            g.check_support()
            g.build_plans()
        except (InvalidValueError, NotSupportedError) as exc:
            ms = (time.perf_counter() - start) * 1e3
            if warned.messages:  # the provider raised something that is not a refusal
                return Outcome("error", "build raised: " + "; ".join(warned.messages), None, 0, ms)
            return Outcome("refused", f"{type(exc).__name__}: {exc}", None, 0, ms)
        except Exception as exc:
            ms = (time.perf_counter() - start) * 1e3
            return Outcome("error", f"build raised {type(exc).__name__}: {exc}", None, 0, ms)
    workspace = allocate_workspace(g.get_workspace_size(), problem.handle.device)
    tf32 = allows_tf32(get_registry().get(spec.engine).knobs(problem.graph), spec.knobs)
    ms = (time.perf_counter() - start) * 1e3
    return BuiltPlan(g, workspace, ms, g.get_plan_name(), tf32)


def build_heuristic(problem: Problem) -> BuiltPlan | Outcome:
    """The heuristic plan (``HeuristicMode.A``, ``HEURISTICS_CHOICE``): what ``dnntune run``
    and a user's first ``execute`` get, including a tuned pick from an override file."""
    start = time.perf_counter()
    g = dt.Graph.from_json(problem.doc)
    try:
        g.build(problem.handle, [dt.HeuristicMode.A], dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    except (InvalidValueError, NotSupportedError) as exc:
        return Outcome("refused", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return Outcome("error", f"build raised {type(exc).__name__}: {exc}")
    workspace = allocate_workspace(g.get_workspace_size(), problem.handle.device)
    return BuiltPlan(g, workspace, (time.perf_counter() - start) * 1e3, g.get_plan_name())


def run_once(problem: Problem, plan: BuiltPlan) -> Outcome | None:
    """Execute once and synchronize; an Outcome only when the execute raised."""
    try:
        plan.graph.execute(problem.handle, problem.pack, plan.workspace)
        problem.handle.synchronize()
    except Exception as exc:
        return Outcome("error", f"execute raised {type(exc).__name__}: {exc}")
    return None


def check_first_call(problem: Problem, plan: BuiltPlan) -> Outcome:
    problem.poison_outputs()
    return _finish(run_once(problem, plan) or problem.compare(plan.tf32), plan)


def check_after_launches(problem: Problem, plan: BuiltPlan, launches: int = 100) -> Outcome:
    """``launches`` back-to-back executes (timed as a whole), then the last one's outputs."""
    problem.poison_outputs()
    try:
        start = time.perf_counter()
        for _ in range(launches):
            plan.graph.execute(problem.handle, problem.pack, plan.workspace)
        problem.handle.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1e3
    except Exception as exc:
        return _finish(Outcome("error", f"execute raised {type(exc).__name__}: {exc}"), plan)
    out = _finish(problem.compare(plan.tf32), plan)
    if out.status == "ok":
        out.reason = f"{launches} launches in {elapsed_ms:.1f} ms"
    return out


def _finish(outcome: Outcome, plan: BuiltPlan) -> Outcome:
    outcome.build_ms = plan.build_ms
    outcome.plan_name = plan.name
    return outcome
