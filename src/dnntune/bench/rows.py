"""One benchmark row: an engine's heuristic (out-of-the-box) plan, timed and checked.

Every row of a graph shares one :class:`RowContext`: the same buffers, the reference outputs and
the graph, parsed once. A row's plan is a value built beside it
(:func:`~dnntune.backend.plan_choice.choose_plan`), never a second graph: building a plan reads
the graph and writes nothing into it, so each row starts from the same clean problem.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dnntune import reference
from dnntune.autotune.verification import InputGuard
from dnntune.backend.engine import Engine, Plan, engine_id_hex
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.plan_choice import choose_plan
from dnntune.backend.plans import allocate_workspace
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.bench.metrics import GraphMetrics
from dnntune.bench.timing import PlanTiming
from dnntune.errors import NotSupportedError
from dnntune.frontend import Graph
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict

if TYPE_CHECKING:
    import torch


__all__ = ["Measure", "PlanRunner", "RowContext", "correctness_of", "row_warnings", "timing_fields"]

_log = logging.getLogger(__name__)

#: measure(label, run) -> PlanTiming; the label names the pass ("ootb", "baseline", "tuned")
Measure = Callable[[str, Callable[[], None]], PlanTiming]


@dataclass
class RowContext:
    """What every row of one graph shares: the same buffers and the reference outputs."""

    doc: dict[str, Any]
    handle: Handle
    pack: dict[int, torch.Tensor]
    output_uids: list[int]
    expected: dict[int, torch.Tensor] | None
    metrics: GraphMetrics
    rtol: float | None
    atol: float | None
    measure: Measure
    extra: dict[str, Any] = field(default_factory=dict)
    #: the inputs as made: a row whose plan writes into one fails, and the next row gets
    #: them back (cuDNN 9.19's norm engine 5 poisoned every later row of its graph)
    input_guard: InputGuard | None = None
    #: the graph of ``doc``, validated; every row builds its plans from it (read only). Read
    #: from ``doc`` once, here, when the caller does not hand over the graph it already has.
    graph: OpGraph | None = None

    def __post_init__(self) -> None:
        if self.input_guard is None:
            self.input_guard = InputGuard(self.pack, self.output_uids)
        if self.graph is None:
            # the runner warned of the document's unknown keys; Graph.from_json would again
            self.graph = graph_from_dict(dict(self.doc), Graph)
        if not self.graph.is_validated:
            self.graph.validate()

    @property
    def op_graph(self) -> OpGraph:
        """The graph every row of this context plans from."""
        assert self.graph is not None, "set by __post_init__"
        return self.graph

    def inputs_changed(self) -> str:
        """'' when the rows so far left the inputs alone; else what changed (now restored)."""
        if self.input_guard is None:
            return ""
        self.handle.synchronize()
        return self.input_guard.changed()

    def zero_outputs(self) -> None:
        for uid in self.output_uids:
            self.pack[uid].zero_()


@dataclass
class PlanRunner:
    """A built plan with its normalized pack and workspace: ``run()`` is one lean execute."""

    graph: OpGraph
    plan: Plan
    pack: Mapping[int, torch.Tensor]
    workspace: torch.Tensor | None
    handle: Handle
    build_ms: float

    def run(self) -> None:
        self.plan.execute(self.pack, self.workspace, self.handle.stream)


def build_ootb(ctx: RowContext, engine: Engine) -> PlanRunner:
    """The engine's heuristic plan (default knobs) of the context's graph, built as a value."""

    graph = ctx.op_graph
    start = time.perf_counter()
    plan = choose_plan(graph, ctx.handle, engine=engine.id).plan
    build_ms = (time.perf_counter() - start) * 1e3
    workspace = allocate_workspace(plan.workspace_size, ctx.handle.device)
    pack = normalize_variant_pack(graph, ctx.pack, ctx.handle)
    return PlanRunner(graph, plan, pack, workspace, ctx.handle, build_ms)


def correctness_of(ctx: RowContext, runner: PlanRunner) -> dict[str, Any] | None:
    """Zero the outputs, execute once, compare with the reference (None when not validating)."""
    if ctx.expected is None:
        return None

    ctx.zero_outputs()
    runner.run()
    ctx.handle.synchronize()
    worst: dict[str, Any] = {
        "match": True,
        "max_abs_error": 0.0,
        "mismatches": 0,
        "worst_output_uid": None,
        "message": "",
    }
    clobbered = ctx.inputs_changed()
    if clobbered:
        worst.update(match=False, message=f"the plan {clobbered}")
    outputs = [runner.graph.tensor_by_uid(uid) for uid in ctx.output_uids]
    checked = reference.check_outputs(
        runner.graph, ctx.pack, ctx.expected, outputs, ctx.rtol, ctx.atol
    )
    for o in checked.outputs:
        uid, cmp = o.uid, o.comparison
        worst["rtol"], worst["atol"] = o.tolerance.rtol, o.tolerance.atol
        worst["mismatches"] += cmp.mismatches
        if cmp.max_abs_error >= worst["max_abs_error"] or not cmp.ok:
            worst["max_abs_error"] = max(worst["max_abs_error"], cmp.max_abs_error)
            worst["worst_output_uid"] = uid
        if not cmp.ok:
            worst["match"] = False
            worst["message"] = "; ".join(m for m in (worst["message"], cmp.message) if m)
    return worst


def row_warnings(timing: PlanTiming) -> list[str]:
    """Flags only (samples are never removed): noisy IQR, outliers, capped sampling, a busy
    CPU."""
    out = []
    k = timing.kernel
    if k.n >= 10 and k.median_ms > 0 and k.iqr_ms / k.median_ms > 0.05:
        out.append(f"noisy: IQR {100 * k.iqr_ms / k.median_ms:.1f}% of median")
    if k.median_ms > 0 and k.max_ms > 2 * k.median_ms:
        out.append(f"outlier: max {k.max_ms / k.median_ms:.1f}x median")
    if timing.capped:
        out.append("capped at max_iters before --min-time-ms was reached")
    if timing.timed_while_busy:
        share = 100 * (timing.cpu_wait_share or 0.0)
        out.append(
            f"CPU busy: the timing threads waited for a core {share:.0f}% of the time; these "
            "times are not to be trusted"
        )
    return out


def timing_fields(ctx: RowContext, timing: PlanTiming, workspace_bytes: int) -> dict[str, Any]:
    median = timing.kernel.median_ms
    return {
        **timing.to_dict(),
        "metrics": {
            "flops": ctx.metrics.flops,
            "io_bytes": ctx.metrics.io_bytes,
            "tflops": ctx.metrics.tflops(median),
            "gbps": ctx.metrics.gbps(median),
            "workspace_bytes": workspace_bytes,
        },
    }


def knob_list(settings: tuple[KnobSetting, ...]) -> list[dict[str, Any]]:
    return [{"knob_id": s.knob_id, "value": s.value} for s in settings]


def engine_row(
    ctx: RowContext, engine: Engine, provider: str = "dnntune", label: str | None = None
) -> tuple[dict[str, Any], PlanRunner | None]:
    """Build, time and check ``engine``'s heuristic plan. Errors become an error row."""
    row: dict[str, Any] = {
        "provider": provider,
        "engine": {"id": engine_id_hex(engine.id), "name": label or engine.name},
        "status": "success",
        "verdict": "unchecked",
        "message": "",
        "plan_name": None,
        "knob_settings": [],
        "build_ms": None,
        "timing": None,
        "kernel": None,
        "host": None,
        "metrics": None,
        "correctness": None,
        "warnings": [],
    }
    try:
        runner = build_ootb(ctx, engine)
        row["plan_name"] = runner.plan.name
        row["knob_settings"] = knob_list(runner.plan.knob_settings)
        row["build_ms"] = runner.build_ms
        ctx.zero_outputs()
        timing = ctx.measure("ootb", runner.run)
        row.update(timing_fields(ctx, timing, runner.plan.workspace_size))
        row["warnings"] = row_warnings(timing)
        row["correctness"] = correctness_of(ctx, runner)
    except NotSupportedError as exc:
        # the engine declines this graph in its default configuration (a refusal cuDNN or the
        # engine decides at build, such as CUDNN_ENGINE's float32 matmuls): a result, not an
        # error of the run
        row.update(status="not_supported", verdict="not_supported", message=str(exc))
        return row, None
    except Exception as exc:  # one engine's failure is a row, never the whole run
        _log.info("bench: %s failed: %s", engine.name, exc)
        row.update(status="error", verdict="error", message=f"{type(exc).__name__}: {exc}")
        return row, None
    if row["correctness"] is not None:
        row["verdict"] = "passed" if row["correctness"]["match"] else "failed"
    return row, runner
