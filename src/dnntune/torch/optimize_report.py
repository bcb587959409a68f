"""What ``optimize`` reports: the modules it swapped, their plans, the fusions, the timings it
decided on and what the model runs in the end (a revert, ``cuda_graph="auto"``'s choice)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import nn

from dnntune.measure import contention
from dnntune.torch._budget import TUNE_SHARE
from dnntune.torch._kernel_cache import _Stats, runtime_stats
from dnntune.torch._route_race import RECHECK_AFTER

__all__ = [
    "ExampleTime",
    "OptimizeReport",
    "SwapRecord",
    "names_of",
    "pytorch_by_design",
    "qualified_names",
    "time_example",
    "within",
]


@dataclass
class SwapRecord:
    name: str
    kind: str
    fused: list[str] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    #: ``refine`` found the whole forward faster with this module on PyTorch's own ops
    pytorch: bool = False
    #: a batch norm folded into this conv's weights (it runs inside the conv's graph)
    folded_into: str | None = None
    #: why the example forward ran this module on PyTorch's own op by design (no fallback
    #: warning is given): a batch norm that normalises with the batch's statistics
    pytorch_by_design: str | None = None
    #: the module's other qualified names, where it is held in more than one place (the same
    #: ``nn.Linear`` in two Sequentials); ``name`` is its first, as ``named_modules()`` has it
    also: list[str] = field(default_factory=list)


class ExampleTime(NamedTuple):
    """Where the example forward's wall seconds went (the tuning pass; with
    ``time_budget_s``, what the budget bounds)."""

    #: the whole example forward
    total_s: float
    #: autotune searches (``tuning_time_ms``)
    searches_s: float
    #: the budget's short races of the heuristic plan against PyTorch's op
    races_s: float
    #: the rest of first sights of layer signatures: choosing, building and checking plans
    #: (cuDNN's heuristic plan builds, the first-call checks against the reference)
    plans_s: float

    @property
    def rest_s(self) -> float:
        """Running the forward itself and what its Python did besides (compiles of routed
        functions' kernels among it)."""
        return max(0.0, self.total_s - self.searches_s - self.races_s - self.plans_s)

    def describe(self) -> str:
        return (
            f"the example forward took {self.total_s:.2f} s: searches {self.searches_s:.2f} s, "
            f"races {self.races_s:.2f} s, choosing, building and checking plans "
            f"{self.plans_s:.2f} s, the rest (running it, other compiles) {self.rest_s:.2f} s"
        )


def time_example(run: Callable[[], object], stats: _Stats = runtime_stats) -> ExampleTime:
    """``run()`` (the example forward) timed, and split by the clocks of ``stats`` (those of
    its own thread's ``counting`` block, for ``optimize``)."""
    spent, built, racing = stats.tuning_time_ms, stats.build_time_ms, stats.race_time_ms
    start = time.perf_counter()
    run()
    total = time.perf_counter() - start
    searches = (stats.tuning_time_ms - spent) / 1e3
    races = (stats.race_time_ms - racing) / 1e3
    plans = max(0.0, (stats.build_time_ms - built) / 1e3 - searches - races)
    return ExampleTime(total, searches, races, plans)


@dataclass
class OptimizeReport:
    """What ``optimize`` changed and what it spent."""

    swapped: list[SwapRecord] = field(default_factory=list)
    policy: str = "tune"
    overrides: str | None = None
    tuning_time_ms: float = 0.0
    autotune_calls: int = 0
    cuda_graph: bool = False
    #: what ``fuse`` fused: conv branches that take the shortcut add (and ReLU) as their
    #: epilogue, and Linear/Conv2d layers that take the following activation
    fusions: list[str] = field(default_factory=list)
    #: the end-to-end check (eval mode with example inputs): per-forward milliseconds of the
    #: model before ``optimize`` changed it and after, timed the same way (None: not run)
    eager_forward_ms: float | None = None
    forward_ms: float | None = None
    #: both figures above come from one side-by-side re-time at the end (interleaved rounds
    #: of PyTorch's forward and the optimized one): done whenever the optimized forward runs
    #: uncaptured, where the host cost makes before-and-after figures unreliable
    side_by_side: bool = False
    #: ``revert_if_slower`` found the optimized forward slower and put the model back as it
    #: was (PyTorch's own forward, no dnntune layer)
    reverted: bool = False
    #: other inputs than the example's race dnntune's route against PyTorch's forward at run
    #: time (``dnntune.torch._route_race``; installed with the end-to-end check)
    races: bool = False
    #: ``time_budget_s``: the budget, and the layer signatures it left untuned (they run the
    #: override file's plan or PyTorch's op in this process, or the heuristic plan: the
    #: ``budget_heuristic`` of them where it beat PyTorch's op in a short race)
    time_budget_s: float | None = None
    budget_skipped: int = 0
    budget_heuristic: int = 0
    #: where the example forward's seconds went (None: no example inputs)
    example_time: ExampleTime | None = None
    #: plans that failed their check against the reference on their first call in the example
    #: forward (``dnntune.torch._plan_check``): (heuristic plans, which PyTorch's op then ran;
    #: the override file's plans, decided again)
    checks_failed: tuple[int, int] = (0, 0)
    #: what ``refine`` decided, one line per group of same-signature modules
    refined: list[str] = field(default_factory=list)
    #: the share of the timing's wall time that the process's threads spent waiting for a CPU
    #: core (:mod:`dnntune.measure.contention`; None: not timed, or not measurable here): from
    #: ``BUSY_WAIT_SHARE`` on, the times above and the choices made on them are not trusted
    cpu_wait_share: float | None = None
    #: ``cuda_graph="auto"``: PyTorch's own forward replayed as a CUDA graph, timed like the
    #: others before anything changed (None: not timed, or it cannot be recorded)
    eager_graph_ms: float | None = None
    #: ``cuda_graph="auto"``: each option's timings, before ``optimize`` changed anything and
    #: side by side at the end, in ms (the figures above take the better PyTorch reading)
    auto_readings_ms: dict[str, list[float]] = field(default_factory=dict)
    #: ``cuda_graph="auto"``: what the module runs (a ``graph_choice.Choice`` value), and its
    #: per-forward time as measured; None when "auto" could not measure (no example inputs on
    #: CUDA, train mode, check_speed off) and the forward runs uncaptured
    choice: str | None = None
    chosen_forward_ms: float | None = None
    #: the blocks replayed as CUDA graphs on their own where the whole forward cannot be
    #: recorded (``cuda_graphs``' pieces), by name
    pieces: list[str] = field(default_factory=list)
    #: the example forward ran: a swapped module without plans then ran none of its calls on
    #: dnntune (PyTorch's op ran them: an unsupported dtype or option), or was not called
    example_ran: bool = False
    #: what the model runs that differs from what was asked, said as a result rather than a
    #: warning (``cuda_graph=True`` on the CPU, which has no CUDA graphs); a line each in
    #: ``str(report)``
    notes: list[str] = field(default_factory=list)

    def _on_dnntune(self, r: SwapRecord) -> bool:
        if r.folded_into is not None and not r.plans:
            return self._conv_on_dnntune(r)
        return not r.pytorch and (not self.example_ran or bool(r.plans))

    def _conv_on_dnntune(self, r: SwapRecord) -> bool:
        """``r``, a folded batch norm, runs in its conv's call: on dnntune exactly when that
        conv is (one refine put on PyTorch's ops, or whose calls all ran PyTorch's op, runs
        it there, folded still)."""
        conv = next((c for c in self.swapped if c.name == r.folded_into), None)
        return conv is None or self._on_dnntune(conv)

    @property
    def speedup(self) -> float | None:
        """Eager forward time over optimized forward time (above 1: faster), if measured."""
        if self.eager_forward_ms is None or not self.forward_ms:
            return None
        return self.eager_forward_ms / self.forward_ms

    def engines(self) -> dict[str, list[str]]:
        """The plans each module on dnntune runs ({} once reverted: the model runs PyTorch's
        own; a module refine put back on PyTorch's ops is left out)."""
        if self.reverted:
            return {}
        return {r.name: r.plans for r in self.swapped if self._on_dnntune(r)}

    @property
    def cpu_busy(self) -> bool:
        """The timings behind this report's choices were taken on a busy CPU."""
        return contention.busy(self.cpu_wait_share)

    def __str__(self) -> str:
        on = sum(1 for r in self.swapped if self._on_dnntune(r))
        where = (
            f"{len(self.swapped)} module(s) tried on dnntune, the model runs PyTorch's own"
            if self.reverted
            else f"{on} module(s) on dnntune"
        )
        lines = [
            f"dnntune.torch.optimize: {where} "
            f"(policy {self.policy}, tuning {self.tuning_time_ms / 1e3:.2f} s, "
            f"{self.autotune_calls} autotune call(s)"
            f"{', CUDA graph replay' if self.cuda_graph else ''})"
        ]
        if self.speedup is not None:
            lines.append(
                f"  forward on the example inputs: {self.forward_ms:.3f} ms, PyTorch "
                f"{self.eager_forward_ms:.3f} ms ({self.speedup:.2f}x"
                f"{', timed side by side' if self.side_by_side else ''})"
            )
        if self.races:
            # uncaptured, the example's own shapes race too (torch/_route_race.py)
            example = f"; the example's too, after {RECHECK_AFTER} forwards"
            example = "" if self.cuda_graph else example
            lines.append(
                "  other input shapes: their first forwards race this route against PyTorch's "
                f"forward, and this route runs the rest only where it is faster beyond 2 %{example}"
            )
        if self.cpu_busy:
            lines.append(
                "  timed while the CPU was busy (this process waited for a core "
                f"{self.cpu_wait_share:.0%} of the time): these times, and which layers were "
                "kept on dnntune, are not to be trusted; optimize again with nothing else "
                "running"
            )
        for r in self.swapped:
            fused = f" + {' + '.join(r.fused)}" if r.fused else ""
            plans = ", ".join(r.plans) or "not run yet"
            if not r.plans and r.folded_into is not None:
                plans = f"folded into {r.folded_into} (runs in its graph)"
                if not self._conv_on_dnntune(r):
                    plans = f"folded into {r.folded_into} (runs in its PyTorch op)"
            elif not r.plans and self.example_ran and r.pytorch_by_design:
                plans, fused = f"PyTorch's own op ({r.pytorch_by_design})", ""
            elif not r.plans and self.example_ran:
                plans = (
                    "PyTorch's own op (the example forward ran none of its calls on dnntune: "
                    "not called, under autocast or torch.compile, on empty tensors, or with "
                    "arguments dnntune does not take, which a fallback warning names)"
                )
                fused = ""
            if r.pytorch:
                plans = "PyTorch's own ops (refine: the whole forward was faster so)"
            elif self.reverted:
                plans = f"tried {plans}; reverted"
            also = f" (also at {names_of(r.also)})" if r.also else ""
            lines.append(f"  {r.name or '<root>'}{also}: {r.kind}{fused} -> {plans}")
        if self.example_time is not None and self.policy == "tune":
            lines.append(f"  {self.example_time.describe()}")
        if self.budget_skipped:
            assert self.time_budget_s is not None
            share = self.time_budget_s * TUNE_SHARE
            lines.append(
                f"  tuning budget of {self.time_budget_s:g} s: {self.budget_skipped} layer "
                f"signature(s) reached after its search share ({share:g} s) untuned in this "
                "process: " + _untuned_split(self.budget_skipped, self.budget_heuristic)
            )
        heuristic, stored = self.checks_failed
        if heuristic or stored:
            lines.append(
                f"  {heuristic + stored} plan(s) gave wrong numbers in their check against the "
                f"reference and were replaced: {heuristic} heuristic plan(s) by PyTorch's op, "
                f"{stored} of the override file's by a new decision"
            )
        if self.pieces:
            lines.append(
                f"  the whole forward cannot be recorded; {len(self.pieces)} block(s) replay "
                f"as CUDA graphs on their own: {names_of(self.pieces)}"
            )
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  fused: {f}" for f in self.fusions)
        lines.extend(f"  refine: {line}" for line in self.refined)
        if self.choice is not None:
            replayed = (
                "cannot be recorded"
                if self.eager_graph_ms is None
                else f"{self.eager_graph_ms:.3f} ms"
            )
            lines.append(
                f"  cuda_graph='auto': runs {self.choice} ({self.chosen_forward_ms:.3f} ms); "
                f"PyTorch {self.eager_forward_ms:.3f} ms, PyTorch replayed {replayed}, "
                f"dnntune {self.forward_ms:.3f} ms"
            )
        if self.reverted:
            replayed = ", replayed as a CUDA graph" if self.cuda_graph else ""
            kept = (
                " (the tuned winners stay in the override file)"
                if self.policy == "tune" and self.overrides is not None and self.autotune_calls
                else ""
            )
            # "after refine" only where refine ran (refine=False, or no group to decide, said
            # it all the same: new-user audit)
            refined = " after refine" if self.refined else ""
            lines.append(
                f"  reverted: still slower than PyTorch's forward{refined}; the model runs "
                f"PyTorch's own{replayed}{kept}"
            )
        return "\n".join(lines)


def qualified_names(module: nn.Module) -> dict[str, list[str]]:
    """Every qualified name of each of ``module``'s submodules, keyed by its first (the one
    ``named_modules()`` gives, the report's row name; the others follow it). A module held in
    two places (``self.a = nn.Sequential(lin, nn.ReLU()); self.b = nn.Sequential(lin)``) has
    one row, under its first name: a fusion found at ``b.0`` is that row's, and a batch norm
    folded into it names it so (before, neither reached the row, and a fusion that ran was left
    out of ``report.fusions``; new-user audit)."""
    by_module: dict[int, list[str]] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        by_module.setdefault(id(sub), []).append(name)
    return {names[0]: names for names in by_module.values()}


def within(name: str, blocks: list[str]) -> bool:
    return any(name == b or name.startswith(f"{b}.") for b in blocks)


def names_of(names: list[str], shown: int = 4) -> str:
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _untuned_split(skipped: int, heuristic: int) -> str:
    """Where the signatures a tuning budget skipped run."""
    raced = "the heuristic plan (it beat PyTorch's op in a short race)"
    if heuristic == 0:
        return "they kept PyTorch's own op (or the override file's plan)"
    if heuristic == skipped:
        return f"all on {raced}"
    return f"{heuristic} on {raced}, the others on PyTorch's own op (or the override file's plan)"


def pytorch_by_design(sub: nn.Module | None) -> str | None:
    """Why ``sub`` runs PyTorch's own op as it is now, by design (no fallback warning), or
    None: a batch norm in training mode or keeping no running statistics (its forward is
    PyTorch's, as :class:`~dnntune.torch.modules.DnnTuneBatchNorm2d` says)."""
    if isinstance(sub, nn.BatchNorm2d) and (
        sub.training or sub.running_mean is None or sub.running_var is None
    ):
        return "it normalises with the batch's statistics: training mode, or no running ones"
    return None
