"""``optimize``'s refinement: which swapped layers make the whole forward faster on PyTorch's ops.

Per-layer winners are chosen on per-layer clocks. In an uncaptured forward a layer's host work
(a cuDNN execute costs tens of µs of host time) can cost more than its faster kernel saves,
which no per-layer clock sees. So, with the end-to-end check's setting (example inputs, eval
mode, no CUDA-graph replay), the swapped modules are tried on PyTorch's own ops in the whole
forward, and stay there where the forward gets faster beyond noise.

Cheap enough to be the default:

* **Groups, not modules.** Modules with the same call signature (class, what was fused into it,
  parameter shapes and dtypes) run the same plans, so they are decided together: the twelve
  ``qkv`` projections of a ViT-B are one decision, not twelve. Larger groups go first (they
  hold the most host time).
* **Side by side.** Each decision times the forward with the group on PyTorch's ops and on
  dnntune in interleaved rounds (on, off, off, on), so drift falls on both alike.

A whole-model revert (``revert_if_slower``) stays the last resort, after this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from dnntune.measure import median
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch._example import Example, as_example
from dnntune.torch.speed import is_slower

if TYPE_CHECKING:
    from dnntune.torch.optimize_report import SwapRecord

__all__ = ["Clock", "RefineGroup", "group_key", "refine_groups"]

_log = logging.getLogger(__name__)

#: per-forward milliseconds of ``module`` on the example call as it is now
Clock = Callable[[nn.Module, Example], float]

#: the order of one decision's interleaved timings: True = the group on PyTorch's ops
PAIR_ORDER = (True, False, False, True)


@dataclass
class RefineGroup:
    """Swapped modules with one call signature, decided together."""

    key: tuple[Any, ...]
    records: list[SwapRecord] = field(default_factory=list)
    #: median per-forward ms with the group on dnntune / on PyTorch's ops (None: not timed)
    dnntune_ms: float | None = None
    pytorch_ms: float | None = None

    @property
    def on_pytorch(self) -> bool:
        return bool(self.records) and all(r.pytorch for r in self.records)

    def describe(self) -> str:
        kind = self.records[0].kind if self.records else "?"
        names = ", ".join(r.name or "<root>" for r in self.records[:3])
        more = f" and {len(self.records) - 3} more" if len(self.records) > 3 else ""
        timed = ""
        if self.dnntune_ms is not None and self.pytorch_ms is not None:
            timed = (
                f": forward {self.dnntune_ms:.3f} ms on dnntune, {self.pytorch_ms:.3f} ms on "
                "PyTorch's ops"
            )
        where = "PyTorch's ops" if self.on_pytorch else "dnntune"
        return f"{kind} x{len(self.records)} ({names}{more}) on {where}{timed}"


def group_key(sub: nn.Module, record: SwapRecord) -> tuple[Any, ...]:
    """What makes two swapped modules run the same plans: class, fused neighbours' kinds and
    the shapes and dtypes of the module's own parameters."""
    params = tuple(
        (name, tuple(p.shape), str(p.dtype)) for name, p in sub.named_parameters(recurse=False)
    )
    fused = tuple(f.rsplit("(", 1)[-1] for f in record.fused)  # "(batchnorm, folded)", "(relu)"
    return (type(sub).__name__, record.kind, fused, params)


def _groups(module: nn.Module, records: Sequence[SwapRecord]) -> list[RefineGroup]:
    groups: dict[tuple[Any, ...], RefineGroup] = {}
    for record in records:
        if record.kind == "BatchNorm2d":
            continue  # folded into its conv (or PyTorch's op already)
        sub = module.get_submodule(record.name)
        key = group_key(sub, record)
        groups.setdefault(key, RefineGroup(key)).records.append(record)
    # the most members first: they hold the most host time; ties keep model order
    return sorted(groups.values(), key=lambda g: -len(g.records))


def _set(module: nn.Module, group: RefineGroup, on_pytorch: bool) -> None:
    for record in group.records:
        sub = module.get_submodule(record.name)
        if on_pytorch:
            sub.__dict__[PYTORCH_FLAG] = True
        else:
            sub.__dict__.pop(PYTORCH_FLAG, None)


def refine_groups(
    module: nn.Module,
    inputs: Example | Sequence[Any],
    records: Sequence[SwapRecord],
    clock: Clock,
) -> list[RefineGroup]:
    """Decide each group of ``records``: on PyTorch's ops (``SwapRecord.pytorch`` and the
    module's ``PYTORCH_FLAG``) where the forward is faster so beyond noise, else on dnntune.
    Returns the groups in the order they were decided."""
    example = as_example(inputs)
    groups = _groups(module, records)
    for group in groups:
        samples: dict[bool, list[float]] = {True: [], False: []}
        for on_pytorch in PAIR_ORDER:
            _set(module, group, on_pytorch)
            samples[on_pytorch].append(clock(module, example))
        group.pytorch_ms, group.dnntune_ms = median(samples[True]), median(samples[False])
        keep = is_slower(group.pytorch_ms, group.dnntune_ms)  # dnntune slower beyond noise
        _set(module, group, keep)
        for record in group.records:
            record.pytorch = keep
        _log.info("dnntune.torch.optimize: refine: %s", group.describe())
    return groups
