"""``optimize``'s steps that change the model's layers, before anything is timed: the fusions
traced and listed, the classes swapped, the routers installed (:func:`swap_layers`); the
example forward that plans and tunes every layer (:func:`run_example`); and the report's rows
filled from what that forward ran (:func:`finish_report`). Also :class:`UserState`: what
``optimize``'s own forwards may write, put back by value when it returns or raises.

``optimize`` itself (:mod:`dnntune.torch.optimize`) keeps the steps that time forwards and
decide on them, so that tests can script its clocks through that module's names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dnntune.torch._attrs import PlainAttributes
from dnntune.torch._buffers import put_back_values, snapshot_of, snapshot_when_materialized
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch._dtypes_seen import DtypesSeen
from dnntune.torch._dtypes_seen import record as record_dtypes
from dnntune.torch._dtypes_seen import using as dtypes_seen
from dnntune.torch._example import Example, named_example
from dnntune.torch._fusion_report import (
    by_first_name,
    folds_now,
    fuse_sequential_into,
    fused_layer,
    fusion_layers,
    traced_into,
)
from dnntune.torch._grouped_heads import grouped_fusions, install_grouped_heads
from dnntune.torch._kernel_cache import counting
from dnntune.torch._memo import module_tails
from dnntune.torch._python_state import Generators
from dnntune.torch._rotary import install_rotary, rotary_fusions
from dnntune.torch._stream_layout import find as find_streams
from dnntune.torch._stream_layout import install_all as install_row_major
from dnntune.torch._subclass import StandIn
from dnntune.torch._swap_classes import swap_class, swapped_class
from dnntune.torch._tracing import reads_dtype
from dnntune.torch.config import LAYER_CONFIG
from dnntune.torch.fusion import Fusion, fuse_modules
from dnntune.torch.modules import ATTRIBUTED
from dnntune.torch.optimize_report import (
    OptimizeReport,
    SwapRecord,
    pytorch_by_design,
    qualified_names,
    time_example,
    within,
)
from dnntune.torch.routing import ROUTED, install_routers, install_routing, originals, routers
from dnntune.torch.runtime import module_plans, tuning_budget

__all__ = [
    "Layers",
    "UserState",
    "drop_refined_fusions",
    "finish_report",
    "run_example",
    "swap_layers",
]


class UserState:
    """What ``optimize``'s own forwards may write, taken before the first of them and put back
    by value when it returns or raises, so that only the user's forwards change it:

    * the module's buffers and the example's tensors (a counter or cache kept in a buffer,
      batch-norm statistics in training mode, an example input changed in place: an eval-mode
      counter read 5,668 after optimize, an example input divided to zeros; new-user audit);
    * lazy buffers, as their first forward materializes them (a lazy batch norm's statistics);
    * the modules' plain attributes (a call counter ``self.calls += 1`` read 1,417 after
      optimize); their lists and dicts are not put back (:mod:`._attrs`);
    * the random number generators: a training-mode example forward draws dropout masks (and
      LayerDrop's Python draws) from the user's generators, so a seeded run drew other masks
      and initial weights after optimize than without it.
    """

    def __init__(self, module: nn.Module, given: list[torch.Tensor]) -> None:
        self._values = snapshot_of([*module.buffers(), *given])
        self._unhook_lazy = snapshot_when_materialized(module, self._values)
        self._attributes = PlainAttributes(module)
        self._generators = Generators(list(module.modules()))

    def unhook_lazy(self) -> None:
        """Remove the lazy buffers' hooks still there (once materialized, no hook of ours is
        left where graphs record); idempotent."""
        self._unhook_lazy()

    def put_back(self) -> None:
        """Put every value taken back (the hooks removed first)."""
        self._unhook_lazy()
        put_back_values(self._values)
        self._attributes.put_back()
        self._generators.put_back()


def _swap_target(sub: nn.Module) -> type[nn.Module] | None:
    """The dnntune class ``sub`` runs as: the one its class is swapped for, or, for a module an
    earlier ``optimize`` already swapped, the one it is (it stays as it is, and is reported)."""
    target = swap_class(sub)
    return target if target is not None else swapped_class(sub)


@dataclass
class Layers:
    """What :func:`swap_layers` installed, for :func:`finish_report`."""

    fusions: list[Fusion]
    #: every name of a module held in two places -> its first name (the report's row)
    first: dict[str, str]
    #: the model's modules by name (duplicates kept)
    modules: dict[str, nn.Module]
    row_major: list[str] = field(default_factory=list)
    rotary: list[Any] = field(default_factory=list)
    grouped: bool = False
    #: this ``optimize`` call's token: its layers' plans are attributed to ``(run, name)``
    #: (:func:`attribution`), not to the name alone, which another model's layer optimized
    #: at the same time in another thread may have too
    run: object = field(default_factory=object)
    #: the names of the Linears that took their parent's residual add (read off
    #: ``module_tails`` by :func:`finish_report`)
    tails: set[str] = field(default_factory=set)


def attribution(run: object, name: str) -> tuple[object, str]:
    """The key the plans of layer ``name`` are attributed to in ``optimize`` call ``run``."""
    return (run, name)


def _fusions(
    module: nn.Module, seen: DtypesSeen | None, fuse: bool
) -> tuple[list[Fusion], dict[str, list[str]], dict[str, nn.Module]]:
    """The fusions that run (eval-mode layers whose batch norms fold), traced (under the
    dtypes ``seen``) and listed."""
    fused: dict[str, list[str]] = {}
    fusions: list[Fusion] = []
    if fuse:
        retarget = {originals[name]: routers[name] for name in ROUTED}
        with dtypes_seen(seen):
            fusions = fuse_modules(module, retarget)
        traced_into(fusions, fused)
    for name, sub in module.named_modules() if fuse else ():
        if isinstance(sub, nn.Sequential):
            fuse_sequential_into(sub, name, fused, fusions)
    # a module in training mode runs as PyTorch's does: its fusions do not run and are not
    # listed (they apply once it is in eval mode)
    modules = dict(module.named_modules(remove_duplicate=False))

    def training(name: str) -> bool:
        sub = modules.get(name)
        return sub is not None and sub.training

    # each fused call runs on its own layers' flags (a model in training with its backbone in
    # eval runs the backbone's folds): a fusion runs where its layers are in eval mode
    for f in [f for f in fusions if any(training(n) for n in fusion_layers(f))]:
        fusions.remove(f)
        fused.pop(fused_layer(f), None)
    fused = {n: parts for n, parts in fused.items() if not training(n)}
    # a fusion that folds a batch norm the conv cannot fold (no running statistics, a string
    # padding) runs its modules apart: not listed
    for f in [f for f in fusions if not folds_now(f, modules)]:
        fusions.remove(f)
        fused.pop(fused_layer(f), None)
    return fusions, fused, modules


def swap_layers(
    module: nn.Module, example: Example | None, fuse: bool, report: OptimizeReport
) -> Layers:
    """Fuse, swap every supported layer's class and install the routers; one row per swapped
    module in ``report.swapped``, the fusions in ``report.fusions``."""
    # the dtypes seen, first; then a residual stream with its last dimension strided
    # (Whisper's permuted convolution output): found in eager forwards, before any class
    # changes (._stream_layout)
    seen: DtypesSeen | None = None
    streams: list[nn.Module] = []
    if fuse and example is not None:
        # the dtypes a layer's trace may branch on (``if x.dtype == torch.float16``)
        seen = record_dtypes(module, example, reads_dtype)
        if not module.training:
            streams = find_streams(module, example)
    install_routers()
    fusions, fused, modules = _fusions(module, seen, fuse)
    report.fusions = [str(f) for f in fusions]
    names = qualified_names(module)  # a module held in two places: one row, its first name
    first = {n: every[0] for every in names.values() for n in every}
    fused_at, folded = by_first_name(fused, fusions, first)
    run = object()
    for name, sub in list(module.named_modules()):
        target = _swap_target(sub)
        if target is None:
            continue
        if swap_class(sub) is target:  # not yet swapped (a second optimize keeps it)
            sub.__class__ = target
        # an earlier optimize's refine decision is this one's to make again (kept, the layer
        # ran PyTorch's op untuned and was reported as a fallback; ``Undo`` puts it back if
        # this optimize raises)
        sub.__dict__.pop(PYTORCH_FLAG, None)
        # its methods attribute their plans to it (no forward hook: that changes which path
        # some of PyTorch's modules take, ``modules.ATTRIBUTED``)
        sub.__dict__[ATTRIBUTED] = attribution(run, name)
        kind = target.__name__.removeprefix("DnnTune")
        report.swapped.append(
            SwapRecord(
                name,
                kind,
                fused_at.get(name, []),
                folded_into=folded.get(name),
                also=names.get(name, [name])[1:],
            )
        )
    install_routers()
    layers = Layers(fusions, first, modules, run=run)
    if streams and example is not None:
        layers.row_major = install_row_major(module, streams, example)
    install_routing(module)
    layers.grouped = install_grouped_heads()
    layers.rotary = install_rotary(module) if fuse else []
    _bind_settings(module)
    return layers


def _bind_settings(module: nn.Module) -> None:
    """Bind the model's settings on every module of it whose class ``optimize`` swapped
    (swaps, stand-ins, fused Sequentials, rewritten forwards, wrappers: each a
    :class:`StandIn`), for calls outside the model's forward (``_subclass.
    call_in_model_settings``): the settings of an uncaptured forward, as no CUDA graph replays
    such a call. A module optimized on its own keeps its own (its forward puts them in force)."""
    state = module.__dict__
    bound = state.get("_dnntune_config_uncaptured", state.get("_dnntune_config"))
    if bound is None:
        return
    for sub in module.modules():
        if isinstance(sub, StandIn) and "_dnntune_config" not in sub.__dict__:
            sub.__dict__[LAYER_CONFIG] = bound


def run_example(
    module: nn.Module,
    example: Example,
    time_budget_s: float | None,
    report: OptimizeReport,
    kept: UserState,
) -> None:
    """The example forward, under ``no_grad`` and the tuning budget: every layer planned (and,
    with policy "tune", tuned); what it tuned, skipped, raced and rejected in ``report``."""
    # this thread's counts: the process's also count what other threads build meanwhile
    with counting() as own, named_example(example), torch.no_grad(), tuning_budget(time_budget_s):
        report.example_time = time_example(lambda: example(module), own)
    kept.unhook_lazy()  # materialized by now: no hook of ours left where graphs record
    report.budget_skipped = own.budget_skipped
    report.budget_heuristic = own.budget_heuristic
    report.checks_failed = (own.heuristic_rejected, own.stored_rejected)
    report.autotune_calls = own.autotune_calls
    report.tuning_time_ms = own.tuning_time_ms


def finish_report(
    module: nn.Module, layers: Layers, report: OptimizeReport, example_ran: bool
) -> None:
    """Each row's plans; with an example forward run, only the fusions whose layers ran on
    dnntune in it; then the attribution the rows were filled by is taken off the modules."""
    for record in report.swapped:
        key = attribution(layers.run, record.name)
        record.plans = sorted(module_plans.pop(key, set()))
        record.pytorch_by_design = pytorch_by_design(layers.modules.get(record.name))
        if key in module_tails:
            module_tails.discard(key)
            layers.tails.add(record.name)
        if record.name in layers.tails and "residual add" not in record.fused:
            # a child's output projection that took its parent's add (the fusion's own line
            # names the child: ``layers.0: self_attn + residual add``)
            record.fused.append("residual add")
    if example_ran:
        # only what ran on dnntune in the example forward: a layer whose calls all went to
        # PyTorch's op (float64, reflect padding) or that was not called fused nothing
        report.example_ran = True
        ran = [r.name for r in report.swapped if r.plans]
        first = layers.first
        report.fusions = [
            str(f)
            for f in layers.fusions
            if any(within(n, [first.get(fused_layer(f), fused_layer(f))]) for n in ran)
        ]
    report.fusions += rotary_fusions(layers.rotary, ran_only=example_ran)
    report.fusions += layers.row_major
    report.fusions += grouped_fusions() if layers.grouped and example_ran else []
    # the report is complete: later calls need no attribution
    for sub in module.modules():
        sub.__dict__.pop(ATTRIBUTED, None)


def drop_refined_fusions(layers: Layers, report: OptimizeReport) -> None:
    """Take out of ``report.fusions`` each fusion whose layer ``refine`` put on PyTorch's own
    ops: its fused call runs PyTorch's separate ops there (a new-user audit read ``fused: 0:
    fc + gelu`` beside ``0.fc: ... -> PyTorch's own ops``). Its row still names what it took
    in."""
    on_pytorch = {r.name for r in report.swapped if r.pytorch}
    if not on_pytorch:
        return
    # a child whose output projection took the parent's add: that projection runs the fusion
    tails = [n for n in on_pytorch if n in layers.tails]
    first = layers.first
    gone = set()
    for f in layers.fusions:
        layer = first.get(fused_layer(f), fused_layer(f))
        if layer in on_pytorch or any(within(n, [layer]) for n in tails):
            gone.add(str(f))
    report.fusions = [f for f in report.fusions if f not in gone]
