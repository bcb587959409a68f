"""Ranking (RFC 0013 section 6.3): succeeded results first, by time or by the caller's function.

The default sorts succeeded results by ``decision_time_ms`` (the first pass's median unless
``ranking_statistic="min"``, where it is ``min_time_ms`` as in the RFC; stable: ties keep
benchmark order).
A caller's ``ranking_fn`` receives only the succeeded results and may only reorder the list in
place. If it raises, or adds, removes or modifies an element, it is ignored (with a warning)
and the default order is used. Failed results follow in candidate order; ranks are reassigned
(0.. for succeeded, -1 for failed) after the callback returns.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

from dnntune.rfc import AutotuneRankingFn, AutotuneResult

__all__ = ["by_decision_time", "by_min_time", "by_robust_time", "rank_and_say", "rank_results"]

_log = logging.getLogger(__name__)

SortKey = Callable[[AutotuneResult], float]


def by_min_time(result: AutotuneResult) -> float:
    return result.min_time_ms


def by_decision_time(result: AutotuneResult) -> float:
    """The statistic the session decides on (median of the first pass, or its minimum)."""
    return result.decision_time_ms if result.decision_time_ms > 0.0 else result.min_time_ms


def by_robust_time(result: AutotuneResult) -> float:
    """Mean after dropping the slow tail; used by autotune_exhaustive_sweep."""
    return result.robust_time_ms


def _contract_violation(
    before: list[AutotuneResult], after: list[AutotuneResult], snapshot: dict[int, AutotuneResult]
) -> str | None:
    if len(after) != len(before):
        return f"it changed the number of results from {len(before)} to {len(after)}"
    if sorted(id(r) for r in after) != sorted(id(r) for r in before):
        return "it replaced, added or removed results"
    for r in after:
        if r != snapshot[id(r)]:
            return f"it modified the result of {r.engine_name}"
    return None


def _apply_ranking_fn(
    fn: AutotuneRankingFn, succeeded: list[AutotuneResult], default: list[AutotuneResult]
) -> list[AutotuneResult] | None:
    """The caller's order, or None (logged) when ``fn`` raised or broke the contract."""
    snapshot = {id(r): copy.deepcopy(r) for r in succeeded}
    work = list(succeeded)
    try:
        fn(work)
    except Exception as exc:
        _log.warning(
            "autotune: ranking_fn raised %s: %s; falling back to the default ranking",
            type(exc).__name__,
            exc,
        )
        _restore(succeeded, snapshot)
        return None
    problem = _contract_violation(succeeded, work, snapshot)
    if problem is not None:
        _log.warning(
            "autotune: ranking_fn broke the contract (reorder in place only): %s; falling back "
            "to the default ranking",
            problem,
        )
        _restore(succeeded, snapshot)
        return None
    return work


def _restore(results: list[AutotuneResult], snapshot: dict[int, AutotuneResult]) -> None:
    """Undo a misbehaving ranking_fn's edits so the fallback ranks the measured values."""
    for r in results:
        saved = snapshot[id(r)]
        for name in r.__dataclass_fields__:
            setattr(r, name, getattr(saved, name))


def rank_results(
    results: Sequence[AutotuneResult],
    ranking_fn: AutotuneRankingFn | None = None,
    key: SortKey = by_decision_time,
) -> list[AutotuneResult]:
    """Succeeded results ranked (by ``ranking_fn`` or ``key``), then failed ones; ranks set."""
    return rank_and_say(results, ranking_fn, key)[0]


def rank_and_say(
    results: Sequence[AutotuneResult],
    ranking_fn: AutotuneRankingFn | None = None,
    key: SortKey = by_decision_time,
) -> tuple[list[AutotuneResult], bool]:
    """:func:`rank_results`, and whether the order is the caller's (``ranking_fn`` ran and kept
    its contract). When it raised or broke the contract the default ranking (``key``: the
    configured ranking statistic) decides, and the library's checks on its own decisions (the
    re-check order, the confirmation against the default plan) apply again."""
    succeeded = [r for r in results if r.succeeded]
    failed = [r for r in results if not r.succeeded]
    default = sorted(succeeded, key=key)
    callers = None if ranking_fn is None else _apply_ranking_fn(ranking_fn, succeeded, default)
    ordered = default if callers is None else callers
    for i, r in enumerate(ordered):
        r.rank = i
    for r in failed:
        r.rank = -1
    return [*ordered, *failed], callers is not None
