"""What the per-graph measurement shares: options, the session across graphs, output checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from dnntune import Handle, reference
from dnntune.graph import OpGraph
from dnntune.measure import cold_flush

__all__ = [
    "COMPILE_MODE",
    "MeasureOptions",
    "Session",
    "allocate_workspace",
    "check_outputs",
    "error_text",
    "plan_outputs",
    "zero_outputs",
]

COMPILE_MODE = "max-autotune-no-cudagraphs"


@dataclass
class MeasureOptions:
    modes: tuple[str, ...] = ("warm", "cold")
    warmup: int = 10
    iters: int = 60
    rounds: int = 3
    compile: bool = True
    compile_timeout_s: float = 90.0
    compile_budget_s: float = 240.0
    tune_warmup: int = 3
    tune_max_iters: int = 30
    tune_candidate_timeout_s: float = 60.0
    tune_engines: tuple[str, ...] = ()
    tune_sweep_knobs: bool = False
    #: the clock the tuner ranks on; "device" is the clock the suite reports
    tune_ranking_metric: Literal["latency", "device"] = "device"
    #: tune with the library's AutotuneConfig defaults (strategy, iterations, confirmation)
    #: instead of the suite's fixed ones; the clock, engine filter, verification and candidate
    #: timeout stay as given
    tune_defaults: bool = False
    #: also tune in TuneMode.EXHAUSTIVE (variant ``exhaustive``), after the default tune
    exhaustive: bool = False
    #: also build HeuristicMode.B's plan without tuning (variant ``heuristic_b``)
    heuristic_b: bool = False
    verify: bool = True
    seed: int = 0


@dataclass
class Session:
    """What lives across graphs: the device, the override file, the compile time spent."""

    handle: Handle
    options: MeasureOptions
    overrides_path: Path
    ridge_flop_per_byte: float
    #: where the EXHAUSTIVE tune writes its winners (apart: the warm start reads the default's)
    exhaustive_overrides_path: Path | None = None
    compile_spent_s: float = 0.0
    #: perf_counter() time at which the run's budget ends (None: no budget)
    deadline: float | None = None
    flushes: dict[str, Callable[[], None] | None] = field(default_factory=dict)

    def flush(self, mode: str) -> Callable[[], None] | None:
        """The cache flush of ``mode`` (None when warm), its buffer allocated once per run."""
        if mode not in self.flushes:
            self.flushes[mode] = cold_flush(self.handle.device, mode)
        return self.flushes[mode]

    def synchronize(self) -> None:
        self.handle.synchronize()


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 400 else text[:400] + " ..."


def allocate_workspace(handle: Handle, size: int) -> torch.Tensor | None:
    return torch.empty(size, dtype=torch.uint8, device=handle.device) if size > 0 else None


def check_outputs(
    graph: OpGraph, outputs: dict[int, torch.Tensor], expected: dict[int, torch.Tensor] | None
) -> dict[str, Any]:
    """Compare every output with the reference (``verified`` None when there is none)."""
    if expected is None:
        return {"verified": None, "max_abs_error": None, "check": "no reference"}
    try:
        return _compare_outputs(graph, outputs, expected)
    except Exception as exc:  # a comparison that cannot run leaves the variant unchecked
        return {"verified": None, "max_abs_error": None, "check": f"not checked: {error_text(exc)}"}


def _compare_outputs(
    graph: OpGraph, outputs: dict[int, torch.Tensor], expected: dict[int, torch.Tensor]
) -> dict[str, Any]:
    worst, message = 0.0, ""
    for t in graph.output_tensors():
        assert t.uid is not None
        if t.uid not in outputs or t.uid not in expected:
            continue
        got = outputs[t.uid].reshape(expected[t.uid].shape)
        result = reference.compare(got, expected[t.uid], reference.tolerance_for(graph, t))
        worst = max(worst, result.max_abs_error)
        if not result.ok:
            return {
                "verified": False,
                "max_abs_error": result.max_abs_error,
                "check": f"{t.name}: {result.message}",
            }
        message = result.message
    return {"verified": True, "max_abs_error": worst, "check": message}


def plan_outputs(graph: OpGraph, pack: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    return {t.uid: pack[t.uid] for t in graph.output_tensors() if t.uid is not None}


def zero_outputs(graph: OpGraph, pack: dict[int, torch.Tensor]) -> None:
    for t in plan_outputs(graph, pack).values():
        t.zero_()
