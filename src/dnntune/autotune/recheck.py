"""Re-measuring close contenders, interleaved, before a winner is named.

Candidates are timed one after another, so a clock or thermal drift between two of them shows
up as a speed difference. When the runner-up is within ``config.recheck_within`` (a fraction,
3% by default) of the best, every contender in that band is sampled again round-robin (the
starting candidate rotates each round) and its statistics are recomputed over all its samples.
Candidates that are clearly slower are not re-timed: the check costs only where it matters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dnntune.autotune.benchmark import ExecutionContext, record_samples
from dnntune.autotune.candidates import Candidate
from dnntune.autotune.types import AutotuneConfig

__all__ = ["RECHECK_ROUNDS", "close_contenders", "recheck_close_contenders"]

_log = logging.getLogger(__name__)

#: interleaved rounds (one sample per contender per round)
RECHECK_ROUNDS = 5


def close_contenders(candidates: Sequence[Candidate], within: float) -> list[Candidate]:
    """Succeeded candidates whose ``min_time_ms`` is within ``within`` of the best (if >= 2)."""
    ok = [c for c in candidates if c.result.succeeded and c.plan is not None]
    if len(ok) < 2 or within <= 0.0:
        return []
    best = min(c.result.min_time_ms for c in ok)
    band = [c for c in ok if c.result.min_time_ms <= best * (1.0 + within)]
    return band if len(band) >= 2 else []


def recheck_close_contenders(
    candidates: Sequence[Candidate], ctx: ExecutionContext, config: AutotuneConfig
) -> list[Candidate]:
    """Interleave extra samples of the close contenders; returns the candidates re-timed."""
    band = close_contenders(candidates, config.recheck_within)
    if not band:
        return []
    _log.info(
        "autotune: re-timing %d contenders within %.1f%% of the best, interleaved: %s",
        len(band),
        100.0 * config.recheck_within,
        ", ".join(c.name for c in band),
    )
    extra: dict[int, list[float]] = {c.index: [] for c in band}
    alive = list(band)
    for round_no in range(RECHECK_ROUNDS):
        shift = round_no % len(alive) if alive else 0
        for c in alive[shift:] + alive[:shift]:
            plan = c.plan
            assert plan is not None
            try:
                if config.ranking_metric == "device":
                    ms = ctx.device_sample(plan, c.result.launches_per_sample)
                else:
                    ms = ctx.latency_sample(plan)
            except Exception as exc:
                c.fail(f"failed while re-timing close contenders: {type(exc).__name__}: {exc}")
                _log.warning("autotune: %s failed during re-timing: %s", c.name, exc)
                continue
            extra[c.index].append(ms)
        alive = [c for c in alive if c.result.succeeded]
    for c in band:
        if c.result.succeeded:
            converged = c.result.converged
            record_samples(c.result, [*c.result.samples_ms, *extra[c.index]], config.ranking_metric)
            c.result.converged = converged
    return band
