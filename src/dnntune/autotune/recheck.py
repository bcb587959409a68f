"""Re-measuring close contenders, interleaved, and deciding on those samples.

Candidates are timed one after another, so a clock or thermal drift between two of them shows
up as a speed difference. After the main pass, every succeeded candidate whose decision time
(the first pass's median, or ``min_time_ms`` with ``ranking_statistic="min"``) is within the
band of the best is sampled again round-robin (A B C, B C A, ...: the starting
candidate rotates each round; :func:`dnntune.measure.interleaved_rounds` with ``rotate``), each
sample after two untimed runs of the same candidate so it is taken in that candidate's own
steady state, not in the state the previous one left
(:func:`~dnntune.autotune.benchmark.steady_sample`). The band is ``recheck_within`` (3 % by
default), widened to :data:`~dnntune.autotune.decision.BAND_Z` times the candidates' pooled
spread when their samples are noisier than that (at most :data:`MAX_BAND`), so a noisy pair
cannot skip the check because one lucky sample put them far apart.

The rounds are adaptive. After ``recheck_rounds`` rounds, and after every round from then on,
the contender with the lowest estimate leads; any other contender slower than the leader
beyond noise (a paired comparison, :mod:`~dnntune.autotune.decision`) drops out. Sampling stops
when one contender is left, when the others are proven within 1 % of the leader (tied), or
after ``recheck_max_rounds``. The contenders are then ranked first, leader first: those still
racing by their estimate (the trimmed geometric mean of their interleaved samples, recorded as
``decision_time_ms``), then those that dropped out. The other candidates follow by the usual
ranking. Candidates outside the band are not re-timed: the check costs only where it matters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dnntune.autotune.benchmark import fail_candidate, record_samples
from dnntune.autotune.candidates import Candidate
from dnntune.autotune.decision import BAND_Z, compare_paired, estimate_ms, relative_noise
from dnntune.autotune.failures import describe_failure, failure_kind
from dnntune.autotune.ranking import by_decision_time
from dnntune.measure import Rounds, interleaved_rounds
from dnntune.rfc import AutotuneConfig

__all__ = [
    "MAX_BAND",
    "RECHECK_ROUNDS",
    "Recheck",
    "close_contenders",
    "recheck_close_contenders",
]

_log = logging.getLogger(__name__)

#: the default minimum of interleaved rounds (``AutotuneConfig.recheck_rounds``)
RECHECK_ROUNDS = AutotuneConfig.recheck_rounds
#: the band is never widened beyond this by noise
MAX_BAND = 0.25

#: among contenders proven tied, a leader whose plan took this many times longer to build than
#: another's (and at least REBUILD_MIN_MS longer) yields to it: every later process rebuilds
#: the chosen plan from the override file, and equal speed does not pay for a slow rebuild
REBUILD_FACTOR = 10.0
REBUILD_MIN_MS = 20.0

#: one more timed sample of a candidate (ms), on the session's clock and conditions
Sampler = Callable[[Candidate], float]


@dataclass
class Recheck:
    """What the re-measurement did: the contenders in decided order (leader first)."""

    order: list[Candidate] = field(default_factory=list)
    rounds: int = 0
    time_ms: float = 0.0
    #: the contenders were proven tied and the one cheaper to build was put first
    cheaper_build_first: bool = False


def close_contenders(candidates: Sequence[Candidate], within: float) -> list[Candidate]:
    """Succeeded candidates within the (noise-widened) band of the best, if at least two."""
    ok = [c for c in candidates if c.result.succeeded]
    if len(ok) < 2 or within <= 0.0:
        return []
    best = min(ok, key=lambda c: by_decision_time(c.result))
    band = []
    for c in ok:
        noise = relative_noise(best.result.samples_ms, c.result.samples_ms)
        width = min(MAX_BAND, max(within, BAND_Z * noise))
        if by_decision_time(c.result) <= by_decision_time(best.result) * (1.0 + width):
            band.append(c)
    return band if len(band) >= 2 else []


def _race(
    alive: list[Candidate], extra: dict[int, list[float]], dropped: list[Candidate]
) -> tuple[list[Candidate], bool]:
    """Drop contenders slower than the leader beyond noise; (alive, all remaining tied)."""
    leader = min(alive, key=lambda c: estimate_ms(extra[c.index]))
    keep = [leader]
    tied = True
    for c in alive:
        if c is leader:
            continue
        cmp = compare_paired(extra[leader.index], extra[c.index])
        if cmp.separated():
            dropped.append(c)
            _log.debug(
                "autotune: %s drops out: %.2f%% slower than %s (noise %.2f%%)",
                c.name,
                100.0 * cmp.margin,
                leader.name,
                100.0 * cmp.noise,
            )
            continue
        keep.append(c)
        tied = tied and cmp.equivalent()
    return keep, tied


def _cheaper_build_first(tied: list[Candidate]) -> bool:
    """Put the tied contender cheapest to build first when the leader's build is far slower
    (REBUILD_FACTOR, REBUILD_MIN_MS); True if it moved."""
    if len(tied) < 2:
        return False
    leader = tied[0]
    cheapest = min(tied, key=lambda c: c.result.compile_time_ms)
    lead_ms, cheap_ms = leader.result.compile_time_ms, cheapest.result.compile_time_ms
    if cheapest is leader or lead_ms < max(REBUILD_FACTOR * cheap_ms, cheap_ms + REBUILD_MIN_MS):
        return False
    tied.remove(cheapest)
    tied.insert(0, cheapest)
    _log.info(
        "autotune: %s and %s are tied within 1%%; %s builds in %.1f ms against %.1f ms, so it "
        "goes first",
        leader.name,
        cheapest.name,
        cheapest.name,
        cheap_ms,
        lead_ms,
    )
    return True


def recheck_close_contenders(
    candidates: Sequence[Candidate],
    sample: Sampler,
    config: AutotuneConfig,
    spent: Callable[[], bool] = lambda: False,
) -> Recheck:
    """Interleave extra samples of the close contenders and decide their order.

    ``spent``: the call's time budget is used up; no round past ``recheck_rounds`` then."""
    band = close_contenders(candidates, config.recheck_within)
    if not band:
        return Recheck()
    start = time.perf_counter()
    _log.info(
        "autotune: re-timing %d contenders within %.1f%% (or their noise) of the best, "
        "interleaved: %s",
        len(band),
        100.0 * config.recheck_within,
        ", ".join(c.name for c in band),
    )
    by_index = {c.index: c for c in band}
    dropped: list[Candidate] = []
    tied = False

    def timed(c: Candidate) -> Callable[[], float]:
        def one() -> float:
            try:
                return sample(c)
            except Exception as exc:  # the candidate fails now; the others go on
                fail_candidate(
                    c,
                    f"failed while re-timing close contenders: {describe_failure(exc)}",
                    failure_kind(exc),
                )
                raise

        return one

    def race(r: Rounds[int]) -> list[int]:
        """The contenders still racing after this round, the leader first once it is raced."""
        nonlocal tied
        alive = [by_index[i] for i in r.live if by_index[i].result.succeeded]
        if r.rounds >= config.recheck_rounds and len(alive) >= 2:
            alive, tied = _race(alive, r.samples_ms, dropped)
        return [c.index for c in alive]

    taken = interleaved_rounds(
        {c.index: timed(c) for c in band},
        config.recheck_max_rounds,
        rotate=True,
        catch=True,
        keep=race,
        done=lambda r: tied or len(r.live) < 2 or (r.rounds >= config.recheck_rounds and spent()),
    )
    extra, rounds = taken.samples_ms, taken.rounds
    alive = [by_index[i] for i in taken.live]
    for c in band:
        if c.result.succeeded:
            converged = c.result.converged
            samples = extra[c.index]
            record_samples(
                c.result,
                [*c.result.samples_ms, *samples],
                config.ranking_metric,
                config.ranking_statistic,
            )
            c.result.converged = converged
            c.result.recheck_rounds = len(samples)
            c.result.recheck_samples_ms = list(samples)
            c.result.decision_time_ms = estimate_ms(samples)
    by_estimate = sorted(alive, key=lambda c: c.result.decision_time_ms)
    rest = sorted(
        (c for c in dropped if c.result.succeeded), key=lambda c: c.result.decision_time_ms
    )
    cheaper = tied and _cheaper_build_first(by_estimate)
    result = Recheck([*by_estimate, *rest], rounds, (time.perf_counter() - start) * 1e3, cheaper)
    if len(result.order) >= 2:
        a, b = result.order[0], result.order[1]
        cmp = compare_paired(a.result.recheck_samples_ms, b.result.recheck_samples_ms)
        _log.info(
            "autotune: after %d interleaved round(s): %s leads %s by %.2f%% (noise %.2f%%, %s)",
            rounds,
            a.name,
            b.name,
            100.0 * cmp.margin,
            100.0 * cmp.noise,
            "separated" if cmp.separated() else "within noise",
        )
    return result
