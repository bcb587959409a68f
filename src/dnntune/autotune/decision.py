"""Deciding beyond noise: paired comparisons of interleaved samples and the winner's margin.

Two candidates re-measured in the same interleaved rounds (``recheck``) are compared round by
round: ``d_i = ln(b_i / a_i)`` cancels whatever slowed the whole round (a clock change, another
process), so the mean of the ``d_i`` estimates how much faster ``a`` is and its standard error
says how sure that is: Yuen's test, the mean of the middle 60 % of the ``d_i`` (a preempted
sample falls in the fifth set aside at either end) with the winsorized standard error and
Student's t. ``a`` is *separated* from ``b`` when the mean minus :data:`NOISE_Z` (widened to
t) standard errors is still above zero; the two are *equivalent* when the whole interval lies
within :data:`EQUIVALENT_WITHIN` (either choice is as good).

Candidates that were not re-measured are compared by their decision times with the samples'
pooled spread as the noise (:func:`relative_noise`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dnntune.autotune.verdicts import KEPT_DEFAULT, KEPT_SLOWER
from dnntune.measure.stats import mean, median
from dnntune.rfc import AutotuneResult

__all__ = [
    "BAND_Z",
    "EQUIVALENT_WITHIN",
    "NOISE_Z",
    "PairedComparison",
    "WinnerMargin",
    "compare_paired",
    "critical_value",
    "estimate_ms",
    "relative_noise",
    "winner_margin",
]

#: standard errors a paired difference must clear to count as separated (99.5 % one-sided;
#: widened to Student's t for the rounds actually taken, :func:`critical_value`)
NOISE_Z = 2.576
#: robust spreads by which an unpaired difference must exceed the noise; also how far the
#: re-measurement band is widened for noisy candidates
BAND_Z = 2.0
#: contenders proven to differ by less than this are tied: re-measuring them further is waste
EQUIVALENT_WITHIN = 0.01
#: MAD -> standard deviation for normal data
_MAD_TO_SD = 1.4826
#: a round further than this many robust standard deviations from the median is dropped
#: (:func:`estimate_ms`)
_TRIM_SD = 3.0
#: the share of rounds set aside at each end by :func:`compare_paired` (Yuen's 20 %)
_TRIM_SHARE = 0.2


def relative_noise(*sample_sets: Sequence[float]) -> float:
    """The pooled relative standard deviation of one or more candidates' samples.

    Each set's deviations are taken from its own mean and divided by it, then pooled with
    ``n - 1`` degrees of freedom per set (0.0 when no set has two samples). Pooling matters:
    a candidate that converged after three samples says little about the noise on its own.
    """
    squares = 0.0
    dof = 0
    for samples in sample_sets:
        if len(samples) < 2:
            continue
        m = math.fsum(samples) / len(samples)
        if m <= 0.0:
            continue
        squares += math.fsum(((v - m) / m) ** 2 for v in samples)
        dof += len(samples) - 1
    return math.sqrt(squares / dof) if dof else 0.0


def critical_value(rounds: int, z: float = NOISE_Z) -> float:
    """``z`` widened to Student's t for ``rounds - 1`` degrees of freedom: the t quantile at
    the normal's one-sided level of ``z``.

    A standard error estimated from five rounds is itself uncertain; using the normal value
    there would call noise a difference far more often than ``z`` promises. (A Cornish-Fisher
    series stood in until session 20: 7.2 against t's 9.9 at 2 degrees of freedom, 4.36
    against 4.60 at 4.)
    """
    df = rounds - 1
    if df < 1:
        return math.inf
    return _student_t_quantile(df, z)


@functools.lru_cache(maxsize=1024)
def _student_t_quantile(df: int, z: float) -> float:
    """The ``t`` with ``P(T <= t) = Phi(z)`` for Student's t with ``df`` degrees of freedom, by
    bisection on its closed-form distribution for whole ``df`` (cached: a few distinct
    ``df`` and ``z`` per process)."""
    tail = 0.5 * math.erfc(z / math.sqrt(2.0))  # 1 - Phi(z)
    target = 1.0 - 2.0 * tail  # P(|T| <= t)
    lo, hi = z, z
    while _t_central(hi, df) < target:
        lo, hi = hi, hi * 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _t_central(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return hi


def _t_central(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with a whole number ``df`` of degrees of freedom
    (Abramowitz and Stegun 26.7.3-4: a finite series in the angle ``atan(t / sqrt(df))``)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, 1.0  # cos(theta) * (1 + 2/3 cos^2 + (2*4)/(3*5) cos^4 + ...)
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        if df == 1:
            return 2.0 * theta / math.pi
        return (2.0 / math.pi) * (theta + s * math.cos(theta) * total)
    total, term = 0.0, 1.0  # 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def _trimmed(values: Sequence[float]) -> list[float]:
    if len(values) < 3:
        return list(values)
    med = median(values)
    mad = median([abs(v - med) for v in values])
    if mad == 0.0:
        return list(values)
    limit = _TRIM_SD * _MAD_TO_SD * mad
    return [v for v in values if abs(v - med) <= limit]


def estimate_ms(samples: Sequence[float]) -> float:
    """The trimmed geometric mean of ``samples`` (0.0 when there are none)."""
    logs = [math.log(v) for v in samples if v > 0.0]
    if not logs:
        return 0.0
    return math.exp(mean(_trimmed(logs)))


@dataclass(frozen=True)
class PairedComparison:
    """``a`` against ``b`` over common interleaved rounds (``log_ratio`` > 0: ``a`` faster)."""

    #: the rounds compared (those with two usable samples)
    rounds: int
    log_ratio: float
    #: standard error of ``log_ratio`` (inf with fewer than two usable rounds)
    noise: float
    #: the rounds left after trimming, whose count less one is the degrees of freedom of
    #: ``noise`` (None: ``rounds``)
    kept: int | None = None

    @property
    def dof_rounds(self) -> int:
        return self.rounds if self.kept is None else self.kept

    @property
    def margin(self) -> float:
        """How much slower ``b`` is than ``a`` as a fraction (0.04 = 4 %; negative: faster)."""
        return math.expm1(self.log_ratio)

    def separated(self, z: float = NOISE_Z) -> bool:
        """``a`` is faster than ``b`` beyond noise."""
        return self.log_ratio - critical_value(self.dof_rounds, z) * self.noise > 0.0

    def equivalent(self, within: float = EQUIVALENT_WITHIN, z: float = NOISE_Z) -> bool:
        """The difference is proven smaller than ``within`` in either direction."""
        bound = critical_value(self.dof_rounds, z) * self.noise
        return abs(self.log_ratio) + bound < math.log1p(within)


def compare_paired(a: Sequence[float], b: Sequence[float]) -> PairedComparison:
    """Compare samples taken in the same rounds (``a[i]`` and ``b[i]`` in round ``i``).

    Yuen's trimmed paired test on the rounds' log-ratios: the fifth at each end is set aside
    (a preempted sample, a clock step), the mean of the rest estimates the log-ratio, and its
    standard error comes from the winsorized variance with ``h - 1`` degrees of freedom, ``h``
    the rounds kept (:attr:`PairedComparison.kept`). Trimming by a MAD taken from few rounds
    dropped ordinary rounds and shrank the error, so equal plans read "separated" several
    times as often as ``z`` promises (session 20's audit)."""
    d = sorted(
        math.log(y / x)
        for x, y in zip(a, b, strict=False)
        if 0.0 < x < math.inf and 0.0 < y < math.inf  # (also no NaN: a broken sample)
    )
    n = len(d)
    if n == 0:
        return PairedComparison(0, 0.0, math.inf)
    g = int(_TRIM_SHARE * n)
    h = n - 2 * g
    m = math.fsum(d[g : n - g]) / h
    if h < 2:
        return PairedComparison(n, m, math.inf, h)
    winsorized = [d[g]] * g + d[g : n - g] + [d[n - g - 1]] * g
    wm = math.fsum(winsorized) / n
    ss = math.fsum((v - wm) ** 2 for v in winsorized)
    return PairedComparison(n, m, math.sqrt(ss / (h * (h - 1))), h)


@dataclass(frozen=True)
class WinnerMargin:
    """How clearly the winner won.

    Attributes:
        winner: the rank-0 result (None when nothing succeeded).
        runner_up: the rank-1 result (None when at most one succeeded).
        margin: how much slower the runner-up is, as a fraction (0.05 = 5 %); None without one.
        separated: the winner is faster than the runner-up beyond noise (True when there is
            no runner-up, False when there is no winner).
        noise: the relative noise of that comparison (0.01 = 1 %).
    """

    winner: AutotuneResult | None
    runner_up: AutotuneResult | None
    margin: float | None
    separated: bool
    noise: float


def _decision_ms(r: AutotuneResult) -> float:
    return r.decision_time_ms if r.decision_time_ms > 0.0 else r.min_time_ms


def winner_margin(results: Sequence[AutotuneResult]) -> WinnerMargin:
    """The winner, the runner-up and whether the winner was faster beyond noise.

    Works on any list of results from ``autotune()`` (ranked: succeeded by rank first). Close
    contenders that were re-measured together are compared round by round
    (:func:`compare_paired`); otherwise the decision times are compared against the samples'
    robust spread.
    """
    ranked = sorted((r for r in results if r.succeeded and r.rank >= 0), key=lambda r: r.rank)
    if not ranked:
        return WinnerMargin(None, None, None, False, 0.0)
    w = ranked[0]
    if len(ranked) < 2:
        return WinnerMargin(w, None, None, True, 0.0)
    r = ranked[1]
    if w.confirmation in KEPT_DEFAULT and r.confirmation == w.confirmation:
        # the default kept over the sweep's winner: the confirmation's interleaved rounds
        # decided, so they give the margin (the sweep's times put the runner-up ahead)
        return _kept_default_margin(w, r)
    if w.recheck_samples_ms and r.recheck_samples_ms:
        cmp = compare_paired(w.recheck_samples_ms, r.recheck_samples_ms)
        return WinnerMargin(w, r, cmp.margin, cmp.separated(), cmp.noise)
    tw, tr = _decision_ms(w), _decision_ms(r)
    margin = tr / tw - 1.0 if tw > 0.0 else math.inf
    if w.separated is not None:  # decided by the session, samples not at hand
        return WinnerMargin(w, r, margin, w.separated, w.separation_noise)
    noise = relative_noise(w.samples_ms, r.samples_ms) or max(w.cov, r.cov)
    return WinnerMargin(w, r, margin, margin > BAND_Z * noise, noise)


def _kept_default_margin(kept: AutotuneResult, challenger: AutotuneResult) -> WinnerMargin:
    """The margin of a default plan the confirmation kept over the challenger: the
    challenger's ``speedup_vs_default`` (default time / its time, round by round) says how much
    slower it was; separated only when the verdict is that it was slower beyond noise."""
    s = challenger.speedup_vs_default
    margin = 1.0 / s - 1.0 if s is not None and s > 0.0 else None
    return WinnerMargin(
        kept,
        challenger,
        margin,
        kept.confirmation == KEPT_SLOWER,
        challenger.confirm_noise,
    )
