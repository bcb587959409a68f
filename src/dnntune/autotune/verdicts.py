"""The verdicts of the confirmation of a winner against the default plan
(:mod:`dnntune.autotune.confirm`), here on their own so that the decision module, which the
confirmation builds on, can read them from a result too."""

from __future__ import annotations

__all__ = [
    "CONFIRMED",
    "DEFAULT_FAILED",
    "KEPT_DEFAULT",
    "KEPT_SLOWER",
    "KEPT_TIE",
    "KEPT_UNSURE",
    "NOT_CHECKED",
    "NO_DEFAULT",
    "WINNER_IS_DEFAULT",
]

CONFIRMED = "confirmed"
WINNER_IS_DEFAULT = "winner_is_default"
KEPT_TIE = "kept_default_tie"
KEPT_SLOWER = "kept_default_slower"
KEPT_UNSURE = "kept_default_unsure"
#: the default plan failed while tuning or while being confirmed (it cannot be compared, nor
#: kept): the winner stands unconfirmed
DEFAULT_FAILED = "default_failed"
#: no candidate is the heuristics' pick (or ``baseline`` is None)
NO_DEFAULT = "no_default"
#: the caller's ranking_fn decided, or the winner could not be compared
NOT_CHECKED = "not_checked"
#: verdicts under which the default plan is kept
KEPT_DEFAULT = frozenset({KEPT_TIE, KEPT_SLOWER, KEPT_UNSURE})
