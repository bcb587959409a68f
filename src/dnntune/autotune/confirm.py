"""Never worse than the default: confirm a winner against the heuristic plan, interleaved.

A tuned choice is only worth keeping if it beats what the caller would have run without tuning
(the plan ``AutotuneConfig.baseline``'s heuristics pick, "the default"). The first pass times
candidates one after another and picks the fastest, so the pick is biased toward whichever
candidate got lucky (the winner's curse), and drift between the two timings looks like a speed
difference. :func:`confirm_winner` therefore takes *fresh* samples of the winner and the default
in interleaved rounds (W D, D W, W D, ...; each sample after untimed runs of the same plan) and
compares them round by round (:func:`~dnntune.autotune.decision.compare_paired`: the log-ratio
of each round, rounds far off trimmed, Student's t on the rest).

Rounds are adaptive: at least ``confirm_rounds``, then looks at geometrically spaced round
counts (x1.5, so repeated looks do not inflate the error rate much) until one of:

* the winner is faster beyond noise (and by at least ``confirm_min_gain``): **confirmed**;
* the default is faster beyond noise: **kept_default_slower**;
* the two are proven within 1 % of each other: **kept_default_tie** (switching buys nothing);
* ``confirm_max_rounds`` or ``confirm_budget_ms`` is reached undecided: **kept_default_unsure**.

A win measured while the CPU was oversubscribed is not trusted either: when the timing
process's threads spent :data:`~dnntune.measure.contention.BUSY_WAIT_SHARE` or more of the
rounds' wall time waiting for a core (:mod:`dnntune.measure.contention`), the time slices of the
scheduler decide such timings, not the plans, and the verdict is **kept_default_unsure** with
the share recorded (``cpu_wait_share``).

Short kernels get many rounds (a round of two 20 us calls costs well under a millisecond), so
the decision beats the clock's noise; long ones are bounded by the time budget. Every verdict
records the rounds, the relative standard error of the speedup (``noise``) and the clock's own
per-sample noise (``clock_noise``: the larger robust relative spread of the two plans' samples).

The same function serves ``Graph.autotune`` (the session samples through its runner),
``dnntune tune``, ``bench --oracle``, ``dnntune.torch`` and distributed tuning
(:func:`execute_sampler` times any callable the same way).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dnntune.autotune.decision import compare_paired, estimate_ms
from dnntune.autotune.verdicts import (
    CONFIRMED,
    DEFAULT_FAILED,
    KEPT_DEFAULT,
    KEPT_SLOWER,
    KEPT_TIE,
    KEPT_UNSURE,
)
from dnntune.measure import (
    cold_flush,
    contention,
    device_sample,
    latency_sampler,
    launches_for,
    median,
    steady_sample,
)
from dnntune.rfc import AutotuneConfig

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle

__all__ = [
    "Confirmation",
    "confirm_winner",
    "execute_sampler",
    "robust_relative_spread",
]

_log = logging.getLogger(__name__)


#: standard errors a paired difference must clear for a verdict: 99.95 % one-sided, so that
#: looking at the rounds up to a dozen times keeps a false verdict near 0.5 %
CONFIRM_Z = 3.29
#: looks after the minimum rounds are spaced by this factor
_LOOK_GROWTH = 1.5
#: MAD -> standard deviation for normal data
_MAD_TO_SD = 1.4826

#: one more timed sample (ms) of one plan, on the conditions both plans share
Sampler = Callable[[], float]


def robust_relative_spread(samples: list[float]) -> float:
    """1.4826 x MAD / median: a standard deviation, relative, that outliers cannot inflate."""
    med = median(samples)
    if len(samples) < 2 or med <= 0.0:
        return 0.0
    return _MAD_TO_SD * median([abs(v - med) for v in samples]) / med


@dataclass
class Confirmation:
    """The winner against the default plan, measured in the same interleaved rounds."""

    verdict: str
    winner: str = ""
    default: str = ""
    rounds: int = 0
    #: default time / winner time (geometric, round by round); > 1: the winner is faster
    speedup: float | None = None
    #: relative standard error of ``speedup``
    noise: float = 0.0
    #: the clock's per-sample noise in these rounds (the larger robust relative spread)
    clock_noise: float = 0.0
    winner_ms: float = 0.0
    default_ms: float = 0.0
    time_ms: float = 0.0
    #: the share of the rounds' wall time the timing process's threads waited for a CPU core
    #: (None: not measured); from ``BUSY_WAIT_SHARE`` up, a win is not trusted
    cpu_wait_share: float | None = None
    winner_samples_ms: list[float] = field(default_factory=list, repr=False)
    default_samples_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def kept_default(self) -> bool:
        """The winner did not beat the default beyond noise, so the default stays."""
        return self.verdict in KEPT_DEFAULT

    @property
    def confirmed(self) -> bool:
        return self.verdict == CONFIRMED

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.speedup is None:
            return f"{self.verdict} (winner {self.winner}, default {self.default or '-'})"
        return (
            f"{self.verdict}: {self.winner} vs default {self.default}: speedup "
            f"{self.speedup:.3f}x +- {100.0 * self.noise:.2f}% over {self.rounds} interleaved "
            f"rounds (clock noise {100.0 * self.clock_noise:.1f}% per sample)"
            + (f"; {self.busy_reason()}" if self.cpu_busy else "")
        )

    @property
    def chosen_ms(self) -> float:
        """The time of the plan the confirmation leaves in place: the default's where it was
        kept, else the winner's."""
        return self.default_ms if self.kept_default else self.winner_ms

    @property
    def cpu_busy(self) -> bool:
        """The CPU was oversubscribed while the rounds ran: their timings are not trusted."""
        return contention.busy(self.cpu_wait_share)

    def busy_reason(self) -> str:
        return (
            f"the CPU was busy: the timing threads waited for a core "
            f"{100.0 * (self.cpu_wait_share or 0.0):.0f}% of the time, so the timings are not "
            f"trusted"
        )

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not k.endswith("_samples_ms")}
        out["kept_default"] = self.kept_default
        return out


def _looks(config: AutotuneConfig) -> list[int]:
    """Round counts at which the comparison is looked at."""
    out = [config.confirm_rounds]
    while out[-1] < config.confirm_max_rounds:
        out.append(min(config.confirm_max_rounds, max(out[-1] + 1, int(out[-1] * _LOOK_GROWTH))))
    return out


def _verdict(w: list[float], d: list[float], config: AutotuneConfig) -> str | None:
    cmp = compare_paired(w, d)  # log_ratio > 0: the winner is faster
    if cmp.separated(CONFIRM_Z) and cmp.margin >= config.confirm_min_gain:
        return CONFIRMED
    if compare_paired(d, w).separated(CONFIRM_Z):
        return KEPT_SLOWER
    if cmp.equivalent(z=CONFIRM_Z):
        return KEPT_TIE
    return None


def confirm_winner(
    sample_winner: Sampler,
    sample_default: Sampler,
    config: AutotuneConfig | None = None,
    *,
    winner: str = "winner",
    default: str = "default",
    clock: Callable[[], float] = time.perf_counter,
    cpu_wait: contention.WaitMeter = contention.run_queue_wait_s,
    wait_clock: Callable[[], float] | None = None,
) -> Confirmation:
    """Sample both plans in interleaved rounds until the winner is confirmed or not.

    Args:
        sample_winner: one timed sample of the winner (ms); it may raise, which ends the
            confirmation undecided (kept_default_unsure: the default stays).
        sample_default: the same for the default plan; when it raises, the default cannot
            be kept and the winner stands unconfirmed (default_failed, as when the default
            failed while tuning).
        config: the rounds, budget and minimum gain (``confirm_*`` fields).
        winner: the winner's name, for the report.
        default: the default plan's name.
        clock: seconds, the clock ``confirm_budget_ms`` is on: the time budget's (a handle
            timer's ``wall_s``, such as the fake clock), else ``perf_counter``.
        cpu_wait: seconds the timing process's threads have waited for a CPU core so far
            (:func:`~dnntune.measure.contention.run_queue_wait_s`; a timer's
            ``cpu_wait_s``, such as the fake clock's): a confirmed win from rounds that spent
            ``BUSY_WAIT_SHARE`` of their time waiting is kept_default_unsure.
        wait_clock: seconds, the clock the share of ``cpu_wait`` is taken on (default
            ``clock``): a runner's ``timed_s``, the wall time of its sampling alone, when
            ``cpu_wait`` counts only that too (``CandidateRunner.cpu_wait_s``).
    """
    cfg = config or AutotuneConfig()
    busy_share = contention.wait_share(cpu_wait, wait_clock or clock)
    start = clock()
    w: list[float] = []
    d: list[float] = []
    verdict: str | None = None
    looks = _looks(cfg)
    budget_s = cfg.confirm_budget_ms / 1e3
    default_broke = False

    def from_default() -> float:
        nonlocal default_broke
        try:
            return sample_default()
        except Exception:
            default_broke = True
            raise

    try:
        while verdict is None:
            if len(w) % 2 == 0:  # the order alternates: W D, D W, ...
                w.append(sample_winner())
                d.append(from_default())
            else:
                d.append(from_default())
                w.append(sample_winner())
            n = len(w)
            over_budget = clock() - start > budget_s
            if n in looks or (over_budget and n >= cfg.confirm_rounds):
                verdict = _verdict(w, d, cfg)
                if verdict is None and (n >= cfg.confirm_max_rounds or over_budget):
                    verdict = KEPT_UNSURE
    except Exception as exc:  # a plan that breaks now cannot be confirmed
        _log.warning(
            "autotune: confirmation of %s stopped: %s %s: %s: %s",
            winner,
            "the default" if default_broke else "the winner",
            default if default_broke else winner,
            type(exc).__name__,
            exc,
        )
        n = min(len(w), len(d))
        w, d = w[:n], d[:n]
        # a default that breaks cannot be kept: the winner stands, unconfirmed (as when the
        # default failed while tuning); a winner that breaks is not taken
        verdict = DEFAULT_FAILED if default_broke else KEPT_UNSURE
    if verdict == DEFAULT_FAILED:  # nothing to compare: unconfirmed, no speedup
        w, d = [], []
    out = Confirmation(verdict, winner, default, len(w), winner_samples_ms=w, default_samples_ms=d)
    out.cpu_wait_share = busy_share()
    if out.verdict == CONFIRMED and out.cpu_busy:
        out.verdict = KEPT_UNSURE
    out.time_ms = (clock() - start) * 1e3
    if w:
        cmp = compare_paired(w, d)
        out.speedup = math.exp(cmp.log_ratio)
        out.noise = cmp.noise if math.isfinite(cmp.noise) else 0.0
        out.clock_noise = max(robust_relative_spread(w), robust_relative_spread(d))
        out.winner_ms, out.default_ms = estimate_ms(w), estimate_ms(d)
    _log.info("autotune: confirmation - %s", out.describe())
    return out


def execute_sampler(
    handle: Handle, run: Callable[[], object], config: AutotuneConfig | None = None
) -> Sampler:
    """A :data:`Sampler` timing ``run`` (one execute) on ``handle``'s timer as the session does
    (:func:`dnntune.measure.steady_sample`): untimed runs of the same plan first, a cache flush
    in cold mode, a synchronize, then timed calls: call latency (a short call several times,
    :func:`dnntune.measure.latency_sampler`) or, with ``ranking_metric="device"``, the device
    clock (a short kernel launched back to back, :func:`dnntune.measure.launches_for`)."""
    cfg = config or AutotuneConfig()
    timer = handle.timer
    flush = cold_flush(handle.device, cfg.cache_mode)

    if cfg.ranking_metric == "device":
        launches = 0

        def timed() -> float:
            nonlocal launches
            if launches == 0:  # as the session's device clock: short kernels back to back
                launches = launches_for(device_sample(timer, run, 1, flush))
            return device_sample(timer, run, launches, flush)

    else:
        timed = latency_sampler(timer, run, flush)

    def sample() -> float:
        return steady_sample(timed, run)  # RESAMPLE_WARM_RUNS untimed runs first, as the re-check

    return sample
