"""The default plan inside one autotune() call: which candidate it is, and keeping it.

The default is the plan the caller would run without tuning: the pick of the heuristics
(``AutotuneConfig.baseline``, HeuristicMode.A unless changed) among the candidates' engines,
with the knobs a stored decision (override file, ranking cache) gives it. It is a candidate like
any other, timed in the same pass under the same conditions. After ranking, the winner is
confirmed against it in fresh interleaved rounds (:func:`~dnntune.autotune.confirm.
confirm_winner`); a winner that does not beat it beyond noise gives its place back, and the
default becomes rank 0 (so ``execute`` runs it and the override file records it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dnntune.autotune.benchmark import fail_candidate
from dnntune.autotune.candidates import Candidate
from dnntune.autotune.confirm import Confirmation, Sampler, confirm_winner
from dnntune.autotune.failures import describe_failure, failure_kind
from dnntune.autotune.verdicts import DEFAULT_FAILED, NO_DEFAULT, NOT_CHECKED, WINNER_IS_DEFAULT
from dnntune.backend.heuristics import HeuristicMode, PolicyDecision, order_engines
from dnntune.backend.knobs import BENCHMARKING, WORKSPACE_SIZE_LIMIT, KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.rfc import AutotuneConfig, AutotuneResult

if TYPE_CHECKING:
    from dnntune.autotune.runner import CandidateRunner
    from dnntune.backend.engine import Engine
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["confirm_against_default", "find_default"]

_log = logging.getLogger(__name__)

#: knobs the session itself may add (priming, the EXHAUSTIVE workspace cap): not a variant
_SESSION_KNOBS = frozenset({BENCHMARKING, WORKSPACE_SIZE_LIMIT})


def _plain(settings: Sequence[KnobSetting]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((s.knob_id, str(s.value)) for s in settings if s.knob_id not in _SESSION_KNOBS)
    )


def _stored(decision: PolicyDecision, engine: Engine) -> tuple[tuple[str, str], ...] | None:
    """The knobs a stored decision gives ``engine`` (None: no stored decision for it)."""
    if decision.matched.get("engine_id") != engine.id:
        return None
    raw = decision.matched.get("knob_settings")
    items = list(raw) if isinstance(raw, list | tuple) else []
    return _plain([s for s in items if isinstance(s, KnobSetting)])


def find_default(
    graph: OpGraph,
    handle: Handle,
    candidates: Sequence[Candidate],
    mode: HeuristicMode | None,
) -> Candidate | None:
    """The candidate that is the heuristics' pick (None without one, or when ``mode`` is None).

    The engines of the candidates still in play are ordered by the policy chain in ``mode``;
    the first engine with a candidate wins. Among its candidates: the one with the knobs a
    stored decision gives it, else the one with default knobs, else its first.
    """
    pool = [c for c in candidates if c.in_play and c.engine is not None]
    if mode is None or not pool:
        return None
    # in registry order, as create_execution_plans() hands them to the policies
    order = {e.id: i for i, e in enumerate(get_registry().engines())}
    engines: list[Engine] = []
    for c in pool:
        assert c.engine is not None
        if all(e.id != c.engine.id for e in engines):
            engines.append(c.engine)
    engines.sort(key=lambda e: order.get(e.id, len(order)))
    try:
        decision = order_engines(graph, handle, engines, mode)
    except Exception as exc:  # the heuristics must never break tuning
        _log.warning("autotune: no default plan: the heuristics raised %s", exc)
        return None
    for engine in decision.engines:
        mine = [c for c in pool if c.engine_id == engine.id]
        if not mine:
            continue
        stored = _stored(decision, engine)
        for wanted in (stored, ()):
            for c in mine:
                if wanted is not None and _plain(c.knob_settings) == wanted:
                    return c
        return mine[0]
    return None


def _mark(result: AutotuneResult, conf: Confirmation, speedup: float | None) -> None:
    result.confirmation = conf.verdict
    result.speedup_vs_default = speedup
    result.confirm_rounds = conf.rounds
    result.confirm_noise = conf.noise
    result.clock_noise = conf.clock_noise


def _rerank(ranked: list[AutotuneResult], first: AutotuneResult) -> list[AutotuneResult]:
    """``first``, the other successes in order, then the failed (rank -1)."""
    ok = [first, *(r for r in ranked if r.succeeded and r is not first)]
    failed = [r for r in ranked if not r.succeeded]
    for i, r in enumerate(ok):
        r.rank = i
    for r in failed:
        r.rank = -1
    return [*ok, *failed]


def _sampler(runner: CandidateRunner, c: Candidate) -> Sampler:
    """One sample of ``c`` for the confirmation; a sample that raises fails ``c`` (as in the
    re-check: a plan that breaks is a failed candidate, whatever its earlier samples said) and
    is re-raised, which ends the confirmation."""

    def one() -> float:
        try:
            return runner.sample(c)
        except Exception as exc:
            fail_candidate(
                c,
                f"failed while being confirmed against the default: {describe_failure(exc)}",
                failure_kind(exc),
            )
            raise

    return one


def confirm_against_default(
    ranked: list[AutotuneResult],
    candidates: Sequence[Candidate],
    default: Candidate | None,
    runner: CandidateRunner,
    config: AutotuneConfig,
    clock: Callable[[], float] = time.perf_counter,
    *,
    caller_ranked: bool = False,
) -> tuple[list[AutotuneResult], Confirmation | None]:
    """Confirm ``ranked[0]`` against ``default``; put the default first if it is kept.

    Returns the (possibly reordered) ranking and the confirmation (None when nothing
    succeeded). The verdict, speedup, rounds and noise are recorded on the final winner's
    result, and on a rejected challenger's too. ``caller_ranked``: the order is the caller's
    ``ranking_fn``'s, which is not second-guessed (``not_checked``); a ``ranking_fn`` that
    raised or broke its contract left the decision to the library, which confirms it.
    """
    if not ranked or not ranked[0].succeeded:
        return ranked, None
    top = ranked[0]
    by_result = {id(c.result): c for c in candidates}
    label = top.plan_name or top.engine_name
    if default is None:
        verdict = NO_DEFAULT
    elif caller_ranked:
        verdict = NOT_CHECKED
    elif default.result is top:
        verdict = WINNER_IS_DEFAULT
    elif not default.result.succeeded:
        verdict = DEFAULT_FAILED
        _log.warning(
            "autotune: the default plan %s failed while tuning (%s); %s is not confirmed",
            default.name,
            default.result.error_message,
            label,
        )
    else:
        winner = by_result[id(top)]
        conf = confirm_winner(
            _sampler(runner, winner),
            _sampler(runner, default),
            config,
            winner=winner.name,
            default=default.name,
            clock=clock,
            cpu_wait=runner.cpu_wait_s,
            wait_clock=runner.timed_s,
        )
        if not conf.kept_default:
            _mark(top, conf, conf.speedup)
            if not default.result.succeeded:  # it broke in the rounds: among the failed now
                ranked = _rerank(ranked, top)
            return ranked, conf
        _mark(top, conf, conf.speedup)
        _mark(default.result, conf, 1.0)
        _log.info(
            "autotune: %s did not beat the default %s beyond noise (%s); keeping the default",
            winner.name,
            default.name,
            conf.verdict,
        )
        return _rerank(ranked, default.result), conf
    conf = Confirmation(verdict, label, default.name if default is not None else "")
    _mark(top, conf, 1.0 if verdict == WINNER_IS_DEFAULT else None)
    return ranked, conf
