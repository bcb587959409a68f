"""What tuning one graph found and what it cost: :class:`GraphTuneReport`.

``dnntune tune`` (``workflows.tuning``), distributed tuning and the CLI's tables all read it: the
winner and runner-up, the heuristic plan, the confirmation of the winner against it (the
decision, the speedup measured in its interleaved rounds), the tuning wall time and the
break-even call count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dnntune.autotune.confirm import Confirmation
from dnntune.autotune.cost import AutotuneSummary
from dnntune.autotune.cost import break_even_calls as _break_even_calls
from dnntune.autotune.decision import winner_margin
from dnntune.autotune.failures import UNSUPPORTED
from dnntune.autotune.verdicts import WINNER_IS_DEFAULT
from dnntune.measure import contention
from dnntune.rfc import AutotuneResult

__all__ = ["GraphTuneReport", "cost_of", "plan_label"]


@dataclass
class GraphTuneReport:
    """What tuning one graph found and what it cost. Times are milliseconds."""

    graph_name: str
    source: str = ""
    graph_key: str = ""
    device: str = ""
    results: list[AutotuneResult] = field(default_factory=list)
    #: the heuristic (out-of-the-box) plan's name, e.g. ``TORCH_ENGINE``; "" if none applied
    heuristic_plan: str = ""
    heuristic_error: str = ""
    #: the confirmation's estimates: heuristic plan and winner timed in the same interleaved
    #: rounds after the sweep (same config, same buffers); ``winner_retimed_ms`` is the time of
    #: the plan ``winner`` names (:meth:`take_confirmed_times`)
    heuristic_time_ms: float | None = None
    winner_retimed_ms: float | None = None
    #: the winner against the heuristic plan (``dnntune.autotune.confirm``); None: not compared
    confirmation: Confirmation | None = None
    #: the winner lost a confirmation made after the session: nothing is written for it
    write_winner: bool = True
    #: wall time of the search itself: engine discovery, compiles, priming, timing, verification
    tuning_time_ms: float = 0.0
    #: where the tuning time went (:func:`cost_of`): compile, priming, timing, re-check and
    #: confirmation milliseconds, the budget, what it used and what it skipped ({}: unknown)
    cost: dict[str, Any] = field(default_factory=dict)
    #: the override file the winner was written to ("" if none)
    written_to: str = ""
    error: str = ""

    # ---- derived ------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return not self.error and self.winner is not None

    @property
    def tried(self) -> list[AutotuneResult]:
        """The candidates that were tried: neither excluded by the caller nor a variant the
        engine cannot run here (``failure_kind`` "unsupported", an expected outcome)."""
        return [
            r for r in self.results if not r.excluded_by_caller and r.failure_kind != UNSUPPORTED
        ]

    @property
    def not_applicable(self) -> list[AutotuneResult]:
        """Variants the engine cannot run here (a CUDA-only knob value on the CPU, ...)."""
        return [r for r in self.results if r.failure_kind == UNSUPPORTED]

    @property
    def ranked(self) -> list[AutotuneResult]:
        """Succeeded candidates, fastest first."""
        return sorted(
            (r for r in self.results if r.succeeded and r.rank >= 0), key=lambda r: r.rank
        )

    @property
    def winner(self) -> AutotuneResult | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    @property
    def runner_up(self) -> AutotuneResult | None:
        ranked = self.ranked
        return ranked[1] if len(ranked) > 1 else None

    @property
    def winner_plan(self) -> str:
        w = self.winner
        if w is None:
            return ""
        return plan_label(w)

    @property
    def margin(self) -> float | None:
        """How much slower the runner-up is than the winner, as a fraction (0.1 = 10 %), on
        the times the decision compared (``dnntune.autotune.winner_margin``)."""
        return winner_margin(self.results).margin

    @property
    def winner_time_ms(self) -> float | None:
        """The winner's time per call: from the confirmation's interleaved rounds where there
        was one, else the search's decision time (its median, the time the ranking compared)."""
        if self.winner_retimed_ms is not None:
            return self.winner_retimed_ms
        w = self.winner
        if w is None:
            return None
        return w.decision_time_ms or w.min_time_ms

    @property
    def chosen_plan(self) -> str:
        """The plan tuning leaves in force, as the table shows it: the default plan the
        confirmation kept (the heuristic plan), else the winner. They differ where an engine
        filter left the heuristic plan out of the candidates and it was kept."""
        c = self.confirmation
        if c is not None and c.kept_default and c.default:
            return c.default
        return self.winner_plan

    @property
    def chosen_time_ms(self) -> float | None:
        """:attr:`chosen_plan`'s time per call, from the confirmation's rounds where it was
        kept, else :attr:`winner_time_ms`."""
        if self.kept_heuristic and self.heuristic_time_ms is not None:
            return self.heuristic_time_ms
        return self.winner_time_ms

    def take_confirmed_times(self) -> None:
        """Take the heuristic plan's and the winner's times from the confirmation's rounds
        (once ``results`` and ``confirmation`` are final): the default's time where the
        results' winner is the default plan (the session kept it), else the winner's own."""
        c = self.confirmation
        if c is None or c.speedup is None:
            return
        self.heuristic_time_ms = c.default_ms
        kept_first = c.kept_default and self.winner_plan == c.default
        self.winner_retimed_ms = c.default_ms if kept_first else c.winner_ms

    @property
    def cpu_wait_share(self) -> float | None:
        """The share of the timing behind :attr:`chosen_time_ms` that its threads spent waiting
        for a CPU core: the confirmation's rounds where they ran, else the sweep's (None:
        unmeasured)."""
        c = self.confirmation
        if c is not None and c.speedup is not None:
            return c.cpu_wait_share
        share = self.cost.get("timing_cpu_wait_share")
        return None if share is None else float(share)

    @property
    def timed_while_busy(self) -> bool:
        """:attr:`chosen_time_ms` was measured on an oversubscribed CPU (its threads waited for
        a core ``BUSY_WAIT_SHARE`` of the time or more): the number is not to be trusted."""
        return contention.busy(self.cpu_wait_share)

    @property
    def separated(self) -> bool:
        """The winner beat the runner-up beyond measurement noise."""
        return winner_margin(self.results).separated

    @property
    def kept_heuristic(self) -> bool:
        """The best other plan did not beat the heuristic plan beyond noise, so it stays."""
        return self.confirmation is not None and self.confirmation.kept_default

    @property
    def decision(self) -> str:
        """The confirmation's verdict ("confirmed", "kept_default_unsure", ...; "" if none)."""
        return "" if self.confirmation is None else self.confirmation.verdict

    @property
    def same_as_heuristic(self) -> bool:
        """The written plan is the heuristic pick. Known by name where the heuristic plan is
        known: the session's own default is the heuristic pick among the candidates, which
        an engine filter (``--engine``) may have left without the true one."""
        if self.heuristic_plan:
            return self.heuristic_plan == self.winner_plan
        return self.kept_heuristic or self.decision == WINNER_IS_DEFAULT

    @property
    def speedup(self) -> float | None:
        """Heuristic time / winner time in the confirmation's interleaved rounds (the paired
        estimate); 1.0 when the heuristic plan is kept or won."""
        if self.winner is None or not self.heuristic_plan:
            return None
        if self.same_as_heuristic or self.kept_heuristic:
            return 1.0
        if self.confirmation is not None and self.confirmation.speedup is not None:
            return self.confirmation.speedup
        h, w = self.heuristic_time_ms, self.winner_retimed_ms
        if h is None or w is None or w <= 0:
            return None
        return h / w

    @property
    def saved_per_call_ms(self) -> float | None:
        """What the winner saves per call against the heuristic plan, from the same estimate
        as :attr:`speedup`: the confirmation's paired speedup applied to the winner's time
        (two separate medians of a noisy clock can disagree with it in sign: a "faster 1.14x"
        that never broke even), else the two re-timed medians' difference."""
        if self.same_as_heuristic or self.kept_heuristic:
            return 0.0
        h, w = self.heuristic_time_ms, self.winner_retimed_ms
        if h is None or w is None:
            return None
        paired = None if self.confirmation is None else self.confirmation.speedup
        if paired is not None and w > 0 and math.isfinite(paired):
            return w * (paired - 1.0)
        return h - w

    @property
    def break_even_calls(self) -> int | None:
        """Calls after which tuning has paid for itself (by :attr:`saved_per_call_ms`); None
        means never (not faster)."""
        saved, w = self.saved_per_call_ms, self.winner_retimed_ms
        if self.same_as_heuristic or self.kept_heuristic or saved is None or w is None:
            return None
        return _break_even_calls(self.tuning_time_ms, w + saved, w)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for ``--json`` output and for gathering across ranks)."""
        w, r = self.winner, self.runner_up
        return {
            "graph": self.graph_name,
            "source": self.source,
            "graph_key": self.graph_key,
            "device": self.device,
            "ok": self.ok,
            "error": self.error,
            "winner": None if w is None else _result_summary(w),
            "runner_up": None if r is None else _result_summary(r),
            "margin": self.margin,
            "separated": self.separated,
            "heuristic_plan": self.heuristic_plan,
            "heuristic_error": self.heuristic_error,
            "heuristic_time_ms": self.heuristic_time_ms,
            "winner_retimed_ms": self.winner_retimed_ms,
            "chosen_plan": self.chosen_plan,
            "chosen_time_ms": self.chosen_time_ms,
            "speedup": self.speedup,
            "decision": self.decision,
            "kept_heuristic": self.kept_heuristic,
            "cpu_wait_share": self.cpu_wait_share,
            "timed_while_busy": self.timed_while_busy,
            "confirmation": None if self.confirmation is None else self.confirmation.to_dict(),
            "tuning_time_ms": self.tuning_time_ms,
            "cost": dict(self.cost),
            "break_even_calls": self.break_even_calls,
            "candidates": len(self.tried),
            "candidates_not_applicable": len(self.not_applicable),
            "candidates_excluded": sum(
                1 for x in self.results if x.excluded_by_caller and x.failure_kind != "budget"
            ),
            "candidates_skipped_budget": sum(1 for x in self.results if x.failure_kind == "budget"),
            "candidates_succeeded": sum(1 for x in self.results if x.succeeded),
            "written_to": self.written_to,
        }


def cost_of(summary: AutotuneSummary | None) -> dict[str, Any]:
    """Where one autotune() call's time went, and what its budget skipped ({} for None)."""
    if summary is None:
        return {}
    return {
        "compile_ms": summary.compile_time_ms,
        "priming_ms": summary.priming_time_ms,
        "timing_ms": summary.benchmark_time_ms,
        "recheck_ms": summary.recheck_time_ms,
        "confirm_ms": summary.confirm_time_ms,
        "total_ms": summary.total_time_ms,
        "time_budget_s": summary.time_budget_s,
        "budget_used_s": summary.budget_used_s if summary.time_budget_s is not None else None,
        "skipped_budget": summary.skipped_budget,
        "abandoned": summary.abandoned,
        "timing_cpu_wait_share": summary.timing_cpu_wait_share,
    }


def plan_label(result: AutotuneResult) -> str:
    """A result's plan name, or for a candidate never built (skipped by the budget, failed
    before building) its engine and knob settings as plan names write them
    (``ENGINE[knob=value,...]``), so variants stay apart."""
    if result.plan_name:
        return result.plan_name
    if not result.knob_settings:
        return result.engine_name
    return f"{result.engine_name}[{','.join(str(s) for s in result.knob_settings)}]"


def _result_summary(result: AutotuneResult) -> dict[str, Any]:
    return {
        "engine_name": result.engine_name,
        "engine_id": result.engine_id,
        "plan": plan_label(result),
        "knobs": result.knobs,
        "min_time_ms": result.min_time_ms,
        "median_time_ms": result.median_time_ms,
        "avg_time_ms": result.avg_time_ms,
        "stddev_ms": result.stddev_ms,
        "iterations_run": result.iterations_run,
        "verified": result.verified,
    }
