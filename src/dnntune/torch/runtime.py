"""Plans for PyTorch calls: build a graph per call signature, pick its plan, cache it (LRU).

A :class:`Kernel` (:mod:`dnntune.torch.kernel`) is what a functional op runs on every call
after the first: a built plan, the uids of its inputs in call order, and the layout of the
outputs to allocate. Nothing graph-related happens on the hot path; a signature seen before
runs the prepared call the :class:`NativeMemo` holds for it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dnntune.autotune.preconditions import writer_available
from dnntune.autotune.variants import add_tuning_variants
from dnntune.backend.engine import Plan
from dnntune.backend.estimates import deferred_workspace_size
from dnntune.backend.handle import Handle, create_handle
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.plan_choice import choose_plan
from dnntune.backend.plans import allocate_workspace
from dnntune.backend.registry import get_registry
from dnntune.errors import ConfigFileError, DnnTuneError, ExecutionError
from dnntune.frontend import Graph
from dnntune.graph.signature import graph_key
from dnntune.graph.tensor import TensorAttributes
from dnntune.overrides.format import OverrideEntry
from dnntune.overrides.match import metadata_graph_key
from dnntune.overrides.policy import entry_knobs, match_override_file
from dnntune.providers._torch.first_call import arguments_requiring_grad
from dnntune.providers.torch_eager import NAME as TORCH_ENGINE
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneStorageConfig,
    AutotuneStrategy,
    TuneMode,
)
from dnntune.torch._budget import (
    Phase,
    phase,
    race,
    search_seconds_left,
    tuning_budget,
    verify,
)
from dnntune.torch._changing_shapes import new_signature
from dnntune.torch._kernel_cache import KernelCache, runtime_stats, tally
from dnntune.torch._memo import (  # re-exported: the ops and tests import them from here
    NATIVE,
    NativeMemo,
    _current_module,
    module_plans,
    native_memo,
    using_module,
)
from dnntune.torch._plan_check import check_plan, pack_of
from dnntune.torch._support import callers_rng_kept, warn_once
from dnntune.torch.config import TorchConfig, current
from dnntune.torch.kernel import Kernel

__all__ = [
    "NATIVE",
    "GraphBuild",
    "Kernel",
    "KernelCache",
    "NativeMemo",
    "module_plans",
    "native_memo",
    "kernel_for",
    "runtime_stats",
    "tuning_budget",
    "using_module",
]

_log = logging.getLogger(__name__)


@dataclass
class GraphBuild:
    """A graph made for one call signature: inputs in call order, outputs to allocate."""

    graph: Graph
    inputs: list[TensorAttributes]
    outputs: list[TensorAttributes]


_cache = KernelCache()


def _record(kernel: Kernel) -> Kernel:
    name = _current_module.get()
    if name is not None:
        module_plans.setdefault(name, set()).add(_plan_label(kernel))
    return kernel


_REPLACED = re.compile(r"the heuristic plan (\S+) failed verification")


def _plan_label(kernel: Kernel) -> str:
    """The plan's name, as ``optimize``'s report lists it per module, and, where it replaced a
    heuristic plan that failed its first-call check, which one (the report's count alone did
    not say which layers: session 38's timm EfficientNet-B0, 14 replaced)."""
    replaced = _REPLACED.search(kernel.source)
    if replaced is None:
        return kernel.plan.name
    return f"{kernel.plan.name} (the heuristic plan {replaced.group(1)} failed its check)"


_handles: dict[str, Handle] = {}
_handles_lock = threading.Lock()


def cache() -> KernelCache:
    return _cache


def handle_for(device: torch.device) -> Handle:
    name = str(device) if device.type == "cpu" else f"cuda:{device.index or 0}"
    with _handles_lock:
        handle = _handles.get(name)
        if handle is None:
            handle = create_handle(name)
            _handles[name] = handle
        return handle


def _override_entry(build: GraphBuild, config: TorchConfig) -> OverrideEntry | None:
    path = config.override_path()
    if path is None or not path.exists():
        return None
    try:
        found = match_override_file(build.graph, path)
    except ConfigFileError as exc:
        # said once (a log line went unseen: "cached" then ran the heuristics' plans while
        # the report read as if the stored ones were in use; new-user audit, session 15)
        # what the writer does with it: a file that is not JSON is moved aside
        # (``<name>.corrupt-<time>``) and a new one written; another format is left alone
        then = (
            "its entries are not used; tuned choices are written to a new file there (a file "
            "that is not JSON is moved aside as <name>.corrupt-<time>) or, if it cannot be "
            "replaced, kept for this process only"
            if config.policy == "tune"
            else "layers take the heuristics' plans (fix or remove the file)"
        )
        warn_once(
            ("override file", str(path)),
            f"dnntune.torch: override file {path} is unusable ({exc}); {then}",
            stacklevel=2,
        )
        return None
    return None if found is None else found[0].entry


def _build_entry(build: GraphBuild, handle: Handle, entry: OverrideEntry) -> Plan | None:
    engine = get_registry().find(entry.engine_name)
    if engine is None:
        return None
    return _build_exact(build.graph, handle, engine.id, tuple(entry_knobs(entry, build.graph)))


def _from_override_file(build: GraphBuild, handle: Handle, config: TorchConfig) -> Plan | None:
    entry = _override_entry(build, config)
    return None if entry is None else _build_entry(build, handle, entry)


def _tuned_earlier(build: GraphBuild, handle: Handle, config: TorchConfig) -> Plan | None:
    """The winner an earlier "tune" wrote to the override file for this graph on this device,
    under the same clock and mode (its ``autotune_metadata``), built as it is: a new process
    does not tune the same layer again. An entry without that metadata (written by hand, or by
    another clock or machine) is tuned over."""
    entry = _override_entry(build, config)
    if entry is None:
        return None
    meta = entry.metadata or {}
    if meta.get("ranking_metric") != config.ranking_metric or meta.get("mode") != config.mode:
        return None
    if meta.get("device") != handle.device_signature().get("name"):
        return None
    tuned_on = metadata_graph_key(meta)
    if tuned_on is not None and tuned_on != graph_key(build.graph):
        return None  # the entry is another layer's that shares this one's core node
    return _build_entry(build, handle, entry)


def _build_exact(
    graph: Graph, handle: Handle, engine_id: int, knobs: Sequence[KnobSetting]
) -> Plan | None:
    try:
        return choose_plan(graph, handle, engine=engine_id, knobs=list(knobs)).plan
    except DnnTuneError as exc:
        _log.info("dnntune.torch: stored decision %s unusable here: %s", engine_id, exc)
        return None


def _pytorch_op(graph: Graph, handle: Handle) -> Plan | None:
    """TORCH_ENGINE's plan at its defaults (PyTorch's own op, ``Plan.runs_eager_ops``), or
    None where it does not run the graph."""
    try:
        return choose_plan(graph, handle, engine=TORCH_ENGINE).plan
    except DnnTuneError as exc:
        _log.info("dnntune.torch: PyTorch's op cannot run %s here: %s", graph.name, exc)
        return None


def _heuristic(graph: Graph, handle: Handle) -> Plan:
    graph.build(handle, [HeuristicMode.A])
    plan = graph.active_plan
    assert plan is not None
    return plan


def _checked_heuristic(
    build: GraphBuild, handle: Handle, inputs: Sequence[torch.Tensor], config: TorchConfig
) -> tuple[Plan, str]:
    """The heuristic plan, checked on its first call (:func:`check_plan`) before it is kept;
    PyTorch's op where it fails.

    A provider's heuristic pick is not proof of a right answer: cuDNN's heuristic plan for a
    half-precision convolution with a residual epilogue and an NCHW filter beside a
    channels-last input returned errors of 5 to 33 (H200, session 35), and a model whose
    layers run such plans is wrong with nothing to show for it. One run per signature (plans
    are built once per signature; the reference runs in float32 on the GPU) keeps such a plan
    out."""
    plan = _heuristic(build.graph, handle)
    ok, why = check_plan(build, handle, inputs, config, plan)
    if ok is None and why:
        name = build.graph.name
        _log.info("dnntune.torch: %s: heuristic plan %s not checked: %s", name, plan.name, why)
        return plan, f"heuristic (not checked: {why})"
    if ok is not False:
        return plan, "heuristic"
    _log.info(
        "dnntune.torch: %s: the heuristic plan %s failed verification (%s); PyTorch's op runs it",
        build.graph.name,
        plan.name,
        why,
    )
    tally("heuristic_rejected")
    ours = _pytorch_op(build.graph, handle)
    if ours is None:
        raise ExecutionError(
            f"{build.graph.name}: the heuristic plan {plan.name} failed verification "
            f"({why}) and PyTorch's op cannot run the graph"
        )
    return ours, f"PyTorch's op (the heuristic plan {plan.name} failed verification)"


def _checked_stored(
    build: GraphBuild,
    handle: Handle,
    inputs: Sequence[torch.Tensor],
    config: TorchConfig,
    plan: Plan | None,
) -> Plan | None:
    """A plan the override file named, checked on its first call here (:func:`check_plan`);
    None where it fails, and the signature is then decided as if the file had no entry for it.
    The file's plans were verified where they were tuned, which may have been another GPU,
    driver or library version than this one (a file tuned on the H200 read on an H100)."""
    if plan is None:
        return None
    ok, why = check_plan(build, handle, inputs, config, plan)
    if ok is not False:
        return plan
    _log.info(
        "dnntune.torch: %s: the override file's plan %s failed verification here (%s); "
        "decided as if the file had no entry for it",
        build.graph.name,
        plan.name,
        why,
    )
    tally("stored_rejected")
    return None


#: knobs dnntune.torch never sweeps: a plan's own CUDA-graph replay cannot run inside the
#: whole-forward capture of ``optimize(cuda_graph=True)``
_NO_SWEEP = frozenset({"torch.cuda_graph"})


#: the source of a skipped signature that runs PyTorch's op
_PYTORCH_SKIPPED = "PyTorch's op (tuning budget spent)"


def _untuned(
    build: GraphBuild,
    handle: Handle,
    inputs: Sequence[torch.Tensor],
    *,
    racing: bool,
    why: str = "tuning budget spent",
) -> tuple[Plan, str]:
    """The plan of a signature the tuning budget's search skipped (``why``: another reason a
    signature is not tuned), and where it came from: PyTorch's op (TORCH_ENGINE at its
    defaults: what the eager model runs) unless, while ``racing`` (:attr:`Phase.RACE`), the
    heuristic plan beats it in a short race (:func:`dnntune.torch._budget.race`; why, in that
    module). Where TORCH_ENGINE cannot run the graph, the heuristic plan, checked
    (:func:`_checked_heuristic`)."""
    ours = _pytorch_op(build.graph, handle)
    if ours is None:
        plan, source = _checked_heuristic(build, handle, inputs, current())
        return plan, f"{source} ({why})"
    if not racing:
        return ours, f"PyTorch's op ({why})"
    try:
        other = _heuristic(build.graph, handle)
    except DnnTuneError as exc:
        _log.info("dnntune.torch: no heuristic plan for %s: %s", build.graph.name, exc)
        return ours, _PYTORCH_SKIPPED
    if other.engine.id == ours.engine.id and other.knob_settings == ours.knob_settings:
        return ours, _PYTORCH_SKIPPED
    pack = pack_of(build, inputs)
    workspace = allocate_workspace(max(ours.workspace_size, other.workspace_size), handle.device)
    start = time.perf_counter()
    try:
        verdict = race(
            handle,
            lambda: other.execute(pack, workspace),
            lambda: ours.execute(pack, workspace),
            heuristic=other.name,
            pytorch=ours.name,
            device=inputs[0].device,
        )
    finally:
        tally("race_time_ms", (time.perf_counter() - start) * 1e3)
    _log.info("dnntune.torch: %s after the tuning budget: %s", build.graph.name, verdict.describe())
    if verdict.confirmed:
        checked = verify(build.graph, pack, lambda p: other.execute(p, workspace), handle)
        if checked.ok is False:
            _log.info(
                "dnntune.torch: %s: the heuristic plan %s won its race but failed "
                "verification (%s); PyTorch's op runs it",
                build.graph.name,
                other.name,
                checked.message,
            )
            return (
                ours,
                "PyTorch's op (the heuristic plan failed verification; tuning budget spent)",
            )
        tally("budget_heuristic")
        race_won = f"{verdict.speedup:.2f}x PyTorch's op in a short race"
        return other, f"heuristic, {race_won} (tuning budget spent)"
    return ours, _PYTORCH_SKIPPED


def _tune(
    build: GraphBuild, handle: Handle, config: TorchConfig, inputs: Sequence[torch.Tensor]
) -> tuple[Plan, float]:
    graph = build.graph
    graph.build_operation_graph(handle)
    graph.add_all_engines([HeuristicMode.A])
    budget_s = search_seconds_left()
    # under a budget the variants' plans are built when the search reaches them, if it does
    # (backend.estimates): building them for their workspace estimates took 1-2.5 s a layer
    deferred = budget_s is not None
    add_tuning_variants(graph, sweep=config.sweep, budgeted=deferred, exclude=_NO_SWEEP)
    pack = pack_of(build, inputs)
    ws = graph.get_estimated_max_workspace_size()
    if deferred:
        ws = deferred_workspace_size(ws, inputs[0].device.type)
    workspace = allocate_workspace(ws, inputs[0].device)
    storage = _storage(config)
    autotune_config = AutotuneConfig(
        strategy=AutotuneStrategy.FIXED_AVERAGE,
        warmup_iterations=config.warmup_iterations,
        timed_iterations=config.timed_iterations,
        verify=config.verify,
        ranking_metric=config.ranking_metric,
        mode=TuneMode(config.mode),
        time_budget_s=budget_s,
    )
    start = time.perf_counter()
    tally("autotune_calls")
    device = inputs[0].device
    with callers_rng_kept(device):
        graph.autotune(handle, pack, workspace, ws, autotune_config, storage)
    elapsed = (time.perf_counter() - start) * 1e3
    summary = graph.last_autotune_summary
    if summary is not None and summary.kept_default:
        tally("kept_heuristic")
    plan = graph.active_plan
    assert plan is not None
    return plan, elapsed


def _storage(config: TorchConfig) -> AutotuneStorageConfig | None:
    """Where a tune writes its winner: the override file, unless it cannot take one (a
    malformed file the writer refuses): then the winner is kept in memory only, said once
    (autotune refused the file on every call, so every forward tuned its layers again)."""
    path = config.override_path()
    if path is None:
        return None
    storage = AutotuneStorageConfig(file_path=str(path))
    try:
        writer_available(storage)
    except DnnTuneError as exc:
        warn_once(
            ("override file", str(path)),
            f"dnntune.torch: not writing tuned choices to {path} ({exc}); they are kept for "
            "this process only (fix or remove the file to keep them)",
            stacklevel=2,
        )
        return None
    return storage


def kernel_for(
    key: Hashable, make_graph: Callable[[], GraphBuild], inputs: Sequence[torch.Tensor]
) -> Kernel:
    """The cached kernel for ``key``, building and selecting it on first sight."""
    config = current()

    # no autograd: a first call in a training forward built, verified and raced its plan on
    # the call's tensors with gradients recorded (and saved), so a checkpointed layer's
    # recomputation, which finds the kernel built, saved other tensors than its forward had
    @torch.no_grad()
    def build() -> Kernel:
        made = make_graph()
        made.graph.validate()
        # a torch.compile plan is compiled for the call's requires_grad flags (a layer passes
        # its nn.Parameter), not compiled again on its first call (providers._torch.first_call)
        flagged = [t.uid for t, v in zip(made.inputs, inputs, strict=False) if v.requires_grad]
        with arguments_requiring_grad(uid for uid in flagged if uid is not None):
            return chosen(made)

    def chosen(made: GraphBuild) -> Kernel:
        handle = handle_for(inputs[0].device)
        graph_key = made.graph.key()
        plan: Plan | None = None
        source = ""
        tuning_ms = 0.0
        # a decision is per device (a tune's winner on one GPU model, or on the CPU, is no
        # answer for another: cuDNN's ``engine_config`` index names another plan there, and a
        # decision from memory is built without a check)
        decided = (graph_key, handle.device_key(), config.tuning_key)
        decision = _cache.decisions.get(decided)
        if decision is not None and config.policy in ("tune", "cached"):
            plan = _build_exact(made.graph, handle, decision[0], decision[1])
            source = "memory"
        if plan is None and config.policy in ("heuristic", "cached"):
            stored = _from_override_file(made, handle, config)
            plan = _checked_stored(made, handle, inputs, config, stored)
            source = "override_file" if plan is not None else ""
        if plan is None and config.policy == "tune":
            stored = _tuned_earlier(made, handle, config)
            plan = _checked_stored(made, handle, inputs, config, stored)
            source = "override_file" if plan is not None else ""
        budget = phase() if plan is None and config.policy == "tune" else Phase.SEARCH
        skipped = budget is not Phase.SEARCH
        if skipped:
            tally("budget_skipped")
            stored = _from_override_file(made, handle, config)
            plan = _checked_stored(made, handle, inputs, config, stored)
            source = "override_file (tuning budget spent)" if plan is not None else ""
        if plan is None and config.policy == "tune" and not skipped:
            if new_signature():
                plan, tuning_ms = _tune(made, handle, config, inputs)
                source = "tuned"
                tally("tuning_time_ms", tuning_ms)
                _cache.decisions[decided] = (plan.engine.id, plan.knob_settings)
            else:  # an optimized model whose shapes keep changing (._changing_shapes)
                tally("changing_untuned")
                why = "shapes keep changing"
                plan, source = _untuned(made, handle, inputs, racing=False, why=why)
        if plan is None and skipped:
            plan, source = _untuned(made, handle, inputs, racing=budget is Phase.RACE)
        if plan is None:
            plan, source = _checked_heuristic(made, handle, inputs, config)
        tally("plans_built")
        runtime_stats.decisions[graph_key] = plan.name
        layouts = []
        for t in made.outputs:
            assert t.uid is not None and t.data_type is not None
            layouts.append((t.uid, tuple(t.dims), tuple(t.strides), t.data_type.to_torch()))
        in_uids = []
        for t in made.inputs:
            assert t.uid is not None
            in_uids.append(t.uid)
        _log.info("dnntune.torch: %s -> %s (%s)", made.graph.name, plan.name, source)
        return Kernel(
            plan,
            tuple(in_uids),
            tuple(layouts),
            plan.workspace_size,
            source,
            tuning_ms,
            inputs[0].device,
        )

    cache_key = (key, config.policy, config.overrides, config.tuning_key)
    return _record(_cache.get(cache_key, config.cache_size, build))


def describe(kernel: Kernel) -> dict[str, Any]:
    return {
        "plan": kernel.plan.name,
        "engine": kernel.engine_name,
        "source": kernel.source,
        "tuning_time_ms": kernel.tuning_time_ms,
    }
