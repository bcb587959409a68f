"""What tuning cost and when it pays: the session summary and the break-even call count.

Every candidate's result separates ``compile_time_ms``, ``priming_time_ms`` and
``benchmark_time_ms``; :class:`AutotuneSummary` adds them up, counts the outcomes and records
the wall time of the whole ``autotune()`` call (left on the graph as
``Graph.last_autotune_summary``). :func:`break_even_calls` turns a tuning time and the time
saved per call into the number of calls after which tuning has paid for itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.autotune.confirm import Confirmation
from dnntune.autotune.decision import WinnerMargin, winner_margin
from dnntune.autotune.failures import BUDGET, CRASH, OOM, TIMEOUT, VERIFICATION
from dnntune.measure import contention
from dnntune.rfc import AutotuneConfig, AutotuneResult

__all__ = ["AutotuneSummary", "break_even_calls", "summarize"]


def break_even_calls(tuning_ms: float, heuristic_ms: float, winner_ms: float) -> int | None:
    """Calls after which tuning has paid for itself: ``ceil(tuning_ms / (heuristic - winner))``.

    Args:
        tuning_ms: what tuning cost (wall time, e.g. ``AutotuneSummary.total_time_ms``).
        heuristic_ms: time per call of the plan you would have run without tuning.
        winner_ms: time per call of the tuned winner, measured under the same conditions.

    Returns:
        At least 1, or None when the winner saves nothing per call (it never pays).
    """
    saved = heuristic_ms - winner_ms
    if not saved > 0.0 or not math.isfinite(saved):
        return None
    return max(1, math.ceil(max(tuning_ms, 0.0) / saved))


@dataclass
class AutotuneSummary:
    """One ``autotune()`` call in numbers (times in milliseconds)."""

    #: wall time of the whole call, checks to winner (includes everything below)
    total_time_ms: float = 0.0
    #: sums over the candidates
    compile_time_ms: float = 0.0
    priming_time_ms: float = 0.0
    benchmark_time_ms: float = 0.0
    #: the interleaved re-measurement of close contenders
    recheck_time_ms: float = 0.0
    recheck_rounds: int = 0
    #: the confirmation of the winner against the default plan
    confirm_time_ms: float = 0.0
    #: ``AutotuneConfig.time_budget_s`` (None: no budget) and what of it was used, in seconds
    #: on the budget's clock
    time_budget_s: float | None = None
    budget_used_s: float = 0.0
    #: candidates the budget left no time for (also counted in ``excluded``)
    skipped_budget: int = 0
    #: candidates whose timing stopped early as clearly slower than the best so far
    abandoned: int = 0
    candidates: int = 0
    benchmarked: int = 0
    succeeded: int = 0
    failed: int = 0
    #: left out before benchmarking by the caller's filters or the workspace limit
    excluded: int = 0
    timed_out: int = 0
    out_of_memory: int = 0
    crashed: int = 0
    failed_verification: int = 0
    cache_mode: str = "warm"
    ranking_metric: str = "latency"
    isolate: bool = False
    #: the winning plan's name ("" when no candidate succeeded)
    winner: str = ""
    margin: WinnerMargin | None = field(default=None, repr=False)
    #: the winner against the default plan (None when nothing succeeded)
    confirmation: Confirmation | None = field(default=None, repr=False)
    #: the share of the timing's wall time (sweep and re-check) that the timing threads spent
    #: waiting for a CPU core (:mod:`dnntune.measure.contention`; None: unmeasured)
    timing_cpu_wait_share: float | None = None

    @property
    def timed_while_busy(self) -> bool:
        """The sweep's timings were taken on an oversubscribed CPU: not to be trusted."""
        return contention.busy(self.timing_cpu_wait_share)

    @property
    def kept_default(self) -> bool:
        """The best other plan did not beat the default beyond noise, so the default won."""
        return self.confirmation is not None and self.confirmation.kept_default

    def describe(self) -> str:
        """One line: the times, the counts and how clearly the winner won."""
        m = self.margin
        decided = "no winner"
        if m is not None and m.runner_up is None:
            decided = f"winner {self.winner} (the only one)"
        elif m is not None and m.margin is not None:
            decided = (
                f"winner {self.winner} by {100.0 * m.margin:.2f}% over the runner-up (noise "
                f"{100.0 * m.noise:.2f}%, {'separated' if m.separated else 'within noise'})"
            )
        if self.confirmation is not None:
            decided += f"; {self.confirmation.describe()}"
        if self.timed_while_busy:
            decided += (
                f"; timed while the CPU was busy (the timing threads waited for a core "
                f"{100.0 * (self.timing_cpu_wait_share or 0.0):.0f}% of the time)"
            )
        return (
            f"in {self.total_time_ms:.1f} ms - compile {self.compile_time_ms:.1f} ms, priming "
            f"{self.priming_time_ms:.1f} ms, benchmark {self.benchmark_time_ms:.1f} ms, "
            f"re-check {self.recheck_time_ms:.1f} ms ({self.recheck_rounds} rounds), confirmation "
            f"{self.confirm_time_ms:.1f} ms; {self.abandoned} abandoned as clearly slower; "
            f"{self.budget_line()}"
            f"{self.succeeded} succeeded, {self.failed} failed ({self.timed_out} timed out, "
            f"{self.out_of_memory} out of memory, {self.crashed} crashed, "
            f"{self.failed_verification} failed verification), {self.excluded} excluded; "
            f"{decided}"
        )

    def budget_line(self) -> str:
        """E.g. "budget 2.0 s: 1.93 s used, 4 candidate(s) skipped; " ("" without a budget)."""
        if self.time_budget_s is None:
            return ""
        return (
            f"budget {self.time_budget_s:g} s: {self.budget_used_s:.2f} s used, "
            f"{self.skipped_budget} candidate(s) skipped; "
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the margin as numbers and names)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("margin", "confirmation")}
        c = self.confirmation
        out["confirmation"] = None if c is None else c.to_dict()
        m = self.margin
        out["margin"] = None
        if m is not None:
            out["margin"] = {
                "winner": _label(m.winner),
                "runner_up": _label(m.runner_up),
                "margin": m.margin,
                "separated": m.separated,
                "noise": m.noise,
            }
        return out


def _label(r: AutotuneResult | None) -> str | None:
    return None if r is None else (r.plan_name or r.engine_name)


def summarize(
    results: Sequence[AutotuneResult],
    config: AutotuneConfig,
    total_time_ms: float,
    recheck_time_ms: float = 0.0,
    recheck_rounds: int = 0,
    *,
    confirmation: Confirmation | None = None,
) -> AutotuneSummary:
    """Add up one call's results."""
    kinds = [r.failure_kind for r in results if not r.succeeded]
    margin = winner_margin(results)
    w = margin.winner
    return AutotuneSummary(
        total_time_ms=total_time_ms,
        compile_time_ms=math.fsum(r.compile_time_ms for r in results),
        priming_time_ms=math.fsum(r.priming_time_ms for r in results),
        benchmark_time_ms=math.fsum(r.benchmark_time_ms for r in results),
        recheck_time_ms=recheck_time_ms,
        recheck_rounds=recheck_rounds,
        candidates=len(results),
        benchmarked=sum(1 for r in results if r.benchmarked),
        succeeded=sum(1 for r in results if r.succeeded),
        failed=sum(1 for r in results if not r.succeeded and not r.excluded_by_caller),
        excluded=sum(1 for r in results if r.excluded_by_caller),
        timed_out=kinds.count(TIMEOUT),
        out_of_memory=kinds.count(OOM),
        crashed=kinds.count(CRASH),
        failed_verification=kinds.count(VERIFICATION),
        confirm_time_ms=confirmation.time_ms if confirmation is not None else 0.0,
        time_budget_s=config.time_budget_s,
        skipped_budget=kinds.count(BUDGET),
        abandoned=sum(1 for r in results if r.abandoned),
        cache_mode=config.cache_mode,
        ranking_metric=config.ranking_metric,
        isolate=config.isolate,
        winner=_label(w) or "",
        margin=margin if w is not None else None,
        confirmation=confirmation,
    )
