"""EXHAUSTIVE mode's unprimed default: the plan users run untuned, kept out of priming.

Priming changes what a candidate builds (cuDNN's search picks among the plans within the
workspace cap, and the real plan is built from that record), so once the default plan's own
candidate is primed, the confirmation compares a primed plan with itself and nothing checks it
against the plan the caller runs without tuning. On the H200 (session 23's suite) 8 of 46
EXHAUSTIVE tunes kept a primed cuDNN plan below 0.98x of the heuristic plan (1x1 convs down
to 0.52x). So the session (:mod:`dnntune.autotune.session`):

* :func:`add_unprimed_default`: puts a copy of the default that is never primed first among the
  candidates (compiled before any priming: an engine's search record would otherwise reach its
  build) and makes it the default every winner is confirmed against;
* :func:`fold_unprimed`: after ranking, folds the copy back into the default's plan spec, so
  that the results hold one entry per plan spec (RFC 6.3.1).

docs/measurement.md, "EXHAUSTIVE against the untuned default", has the rules for users.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from dnntune.autotune.candidates import Candidate
from dnntune.autotune.priming import priming_enabled
from dnntune.backend.knobs import WORKSPACE_SIZE_LIMIT
from dnntune.rfc import AutotuneResult

__all__ = ["UNPRIMED_DEFAULT", "add_unprimed_default", "fold_unprimed", "primed_twin"]

_log = logging.getLogger("dnntune.autotune.session")

#: the reason an unprimed default gives for not having run the engine's search
UNPRIMED_DEFAULT = (
    "the default plan, unprimed: the heuristic plan a primed plan must beat (EXHAUSTIVE)"
)


def add_unprimed_default(
    candidates: list[Candidate], default: Candidate | None
) -> Candidate | None:
    """The default to confirm against in EXHAUSTIVE mode: an unprimed copy of ``default``,
    inserted first in ``candidates``, when priming would change what ``default`` builds; else
    ``default`` itself."""
    if default is None or not _primes(default):
        return default
    copy = _copy(default, len(candidates))
    candidates.insert(0, copy)
    _log.info(
        "autotune: EXHAUSTIVE: the default plan is also timed unprimed, as %s: the plan every "
        "primed one must beat",
        copy.name,
    )
    return copy


def _copy(default: Candidate, index: int) -> Candidate:
    """A copy of the default candidate that EXHAUSTIVE mode keeps out of priming.

    Priming changes what a candidate builds (cuDNN's search picks among the plans within the
    workspace cap, and the real plan is built from that record), so the primed default is no
    longer the plan the caller runs without tuning. This copy is: built with the default's
    knobs before anything is primed, timed like any candidate and the baseline every winner,
    the primed default included, is confirmed against (on the H200, session 23, primed cuDNN
    plans ran up to 1.9x slower than the heuristic plan and no confirmation caught it). It has
    its own result (``exhaustive_not_run_reason`` says what it is) and a fresh ``index``.
    """
    r = default.result
    result = replace(
        r,
        knob_settings=list(r.knob_settings),
        samples_ms=[],
        recheck_samples_ms=[],
        ran_exhaustive=False,
        exhaustive_not_run_reason=UNPRIMED_DEFAULT,
    )
    return Candidate(
        index, default.engine_id, default.engine, default.knob_settings, result, prime=False
    )


def primed_twin(candidates: Sequence[Candidate], default: Candidate | None) -> Candidate | None:
    """The primed candidate of the plan spec whose unprimed copy is ``default`` (else None)."""
    if default is None or default.prime:
        return None
    return next(
        (
            c
            for c in candidates
            if c.prime and c.engine_id == default.engine_id and _same_spec(c, default)
        ),
        None,
    )


def _same_spec(c: Candidate, default: Candidate) -> bool:
    """``c`` is the spec ``default`` was copied from (its knobs, less the workspace cap)."""
    own = [s for s in c.knob_settings if s.knob_id != WORKSPACE_SIZE_LIMIT]
    return own == [s for s in default.knob_settings if s.knob_id != WORKSPACE_SIZE_LIMIT]


def fold_unprimed(
    ranked: list[AutotuneResult], unprimed: Candidate, primed: Candidate
) -> list[AutotuneResult]:
    """One result per plan spec (RFC 6.3.1) after EXHAUSTIVE mode timed the default's spec
    twice, built unprimed and primed. Ranks are renumbered after.

    - The unprimed copy is chosen and the primed build did not run the engine's search
      (priming skipped or failed, unprimed): both built the same plan; the primed build's
      result, which says why, takes the chosen place.
    - The unprimed copy is chosen, or it failed and the primed build did not win: its result
      stands for the spec (its reason names what the primed build ran).
    - Otherwise the primed build's result stands for the spec.
    """
    first = ranked[0] if ranked else None
    same_plan = not primed.result.ran_exhaustive and primed.result.succeeded
    if first is unprimed.result and same_plan:
        out = [primed.result, *(r for r in ranked[1:] if r is not primed.result)]
    else:
        failed = not unprimed.result.succeeded and first is not primed.result
        keep_unprimed = first is unprimed.result or failed
        if keep_unprimed and primed.result.succeeded:
            unprimed.result.exhaustive_not_run_reason = (
                f"{UNPRIMED_DEFAULT}; kept: the primed build {primed.name} "
                f"ran {primed.result.decision_time_ms:.4g} ms against "
                f"{unprimed.result.decision_time_ms:.4g} ms"
            )
        drop = primed if keep_unprimed else unprimed
        out = [r for r in ranked if r is not drop.result]
    kept = unprimed.result if any(r is unprimed.result for r in out) else primed.result
    kept.is_default = True  # the default's plan spec, either way
    if kept is primed.result:
        for name in ("confirmation", "speedup_vs_default", "confirm_rounds", "confirm_noise"):
            if getattr(unprimed.result, name) and not getattr(primed.result, name):
                setattr(primed.result, name, getattr(unprimed.result, name))
    rank = 0
    for r in out:
        r.rank = rank if r.succeeded else -1
        rank += r.succeeded
    return out


def _primes(c: Candidate) -> bool:
    """Whether EXHAUSTIVE mode's priming would change what ``c`` builds."""
    return c.result.supports_exhaustive and priming_enabled()
