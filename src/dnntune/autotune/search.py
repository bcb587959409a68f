"""Spending a tuning budget where the expected gain is largest (issue 25).

Three pieces, each used by the runners (``runner.py``, ``isolation.py``) and the session:

* :class:`Budget`: ``AutotuneConfig.time_budget_s`` on a clock (``perf_counter``, or the
  handle timer's ``wall_s`` when it has one: the fake clock of ``dnntune.testing``). A share
  (``budget_confirm_share``) is kept for the confirmation of the winner against the default
  plan, so the search stops early enough for that to run.
* :func:`search_order`: the order candidates are tried in, cheap and likely first: the default
  plan (the heuristics' pick, the baseline of the confirmation), then each engine's default
  plan, then knob variants; within each group by the learned ranking's order of the engines
  where it has one (:func:`learned_engine_rank`, ``HeuristicMode.B``'s model), then by the
  engine's ``compile_cost`` estimate (eager PyTorch and cuDNN before Triton and
  torch.compile), an EXHAUSTIVE-primed candidate counted :data:`PRIMING_COST_FACTOR` times
  dearer. Ties keep the caller's order. Without a budget the caller's order is kept. (The
  runner then moves candidates whose engine has a measured call floor to the end:
  ``call_floor``.)
* :func:`expected_compile_s`: what trying a candidate is expected to cost in compile seconds
  (the engine's ``first_compile_s``, or the last compile of that engine in this process).
  Under a budget a candidate whose expected compile does not fit in what is left of the
  search's share is skipped (:meth:`Budget.affords`): the first Inductor compile of a process
  took 3.8-8.0 s of ``optimize``'s 8.4 s search share in session 44 (H100), for a norm whose
  winner was cuDNN's plan, and left the model's other layers untuned.
* :func:`clearly_slower`: the early-abandonment rule. After :data:`ABANDON_MIN_SAMPLES`
  samples, a candidate whose *fastest* sample is still slower than the best candidate so far
  (its decision time) by more than ``abandon_margin`` and by more than
  :data:`~dnntune.autotune.decision.BAND_Z` pooled relative standard deviations of the two
  candidates' samples (``decision.relative_noise``) cannot win: its timing stops there. The
  default plan is never abandoned.

Candidates the budget skipped are excluded with :data:`~dnntune.autotune.candidates.
SKIPPED_BUDGET` and ``failure_kind="budget"`` (:func:`skip_for_budget`): one result per
candidate still holds. A budget never skips the first candidate, nor any candidate before one
has succeeded, so a budget alone cannot leave a call without a winner.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dnntune.autotune.candidates import SKIPPED_BUDGET, Candidate
from dnntune.autotune.decision import BAND_Z, estimate_ms, relative_noise
from dnntune.autotune.failures import BUDGET
from dnntune.backend.knobs import BENCHMARKING, WORKSPACE_SIZE_LIMIT
from dnntune.rfc import AutotuneConfig, AutotuneResult, AutotuneStrategy, TuneMode

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "ABANDON_MIN_SAMPLES",
    "PRIMING_COST_FACTOR",
    "Budget",
    "SampleStop",
    "clearly_slower",
    "compile_cost",
    "expected_compile_s",
    "learned_engine_rank",
    "note_compile",
    "search_order",
    "skip_for_budget",
]

_log = logging.getLogger(__name__)

#: samples a candidate gets before it can be abandoned as clearly slower
ABANDON_MIN_SAMPLES = 3
#: an EXHAUSTIVE-primed candidate runs its engine's own search first: this many times dearer
PRIMING_COST_FACTOR = 10.0
#: compile cost of a candidate whose engine is unknown here
_UNKNOWN_COST = 5.0
_SESSION_KNOBS = frozenset({BENCHMARKING, WORKSPACE_SIZE_LIMIT})
#: unusable learned-model files already warned about (one warning per file and problem per
#: process, DEBUG after that)
_MODEL_REPORTED: set[str] = set()


@dataclass
class Budget:
    """A wall-time budget in seconds (``total_s`` None: unlimited) on ``clock`` (seconds)."""

    total_s: float | None
    confirm_share: float = 0.15
    clock: Callable[[], float] = time.perf_counter
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    @classmethod
    def for_call(cls, config: AutotuneConfig, timer: object) -> Budget:
        """The budget of one autotune() call, on the timer's ``wall_s`` clock if it has one."""
        clock = getattr(timer, "wall_s", None)
        if not callable(clock):
            clock = time.perf_counter
        return cls(config.time_budget_s, config.budget_confirm_share, clock)

    @property
    def limited(self) -> bool:
        return self.total_s is not None

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def remaining_s(self) -> float:
        if self.total_s is None:
            return math.inf
        return self.total_s - self.elapsed_s()

    @property
    def reserve_s(self) -> float:
        """What is kept for the confirmation."""
        return 0.0 if self.total_s is None else self.total_s * self.confirm_share

    def search_spent(self) -> bool:
        """The search's part of the budget is spent (False when unlimited)."""
        return self.total_s is not None and self.remaining_s() <= self.reserve_s

    def affords(self, seconds: float | None) -> bool:
        """Whether a step expected to take ``seconds`` fits in what is left of the search's
        share (True when unlimited, or when the cost is not known)."""
        if self.total_s is None or seconds is None:
            return True
        return seconds <= self.remaining_s() - self.reserve_s

    def confirm_budget_ms(self, configured_ms: float) -> float:
        """The confirmation's wall-time cap: what is left, at least the reserve, at most the
        configured ``confirm_budget_ms``."""
        if self.total_s is None:
            return configured_ms
        return min(configured_ms, max(self.remaining_s(), self.reserve_s) * 1e3)


def compile_cost(c: Candidate, config: AutotuneConfig) -> float:
    """The estimated relative cost of trying ``c`` (its engine's ``compile_cost``, times
    :data:`PRIMING_COST_FACTOR` when EXHAUSTIVE mode primes it)."""
    cost = getattr(c.engine, "compile_cost", _UNKNOWN_COST) if c.engine is not None else 0.0
    try:
        cost = float(cost)
    except (TypeError, ValueError):
        cost = _UNKNOWN_COST
    return cost * PRIMING_COST_FACTOR if _primed(c, config) else cost


def _primed(c: Candidate, config: AutotuneConfig) -> bool:
    """EXHAUSTIVE mode primes ``c`` with its engine's own search before it is compiled."""
    return config.mode is TuneMode.EXHAUSTIVE and c.prime and c.result.supports_exhaustive


#: the last compile of each engine in this process, in seconds (:func:`note_compile`)
_compile_seen_s: dict[str, float] = {}


def note_compile(c: Candidate) -> None:
    """Remember ``c``'s compile time as its engine's next :func:`expected_compile_s` (a
    compiled candidate only; an EXHAUSTIVE priming's time is its ``priming_time_ms``)."""
    if c.engine is None or c.plan is None or c.result.compile_time_ms <= 0.0:
        return
    _compile_seen_s[c.engine.name] = c.result.compile_time_ms / 1e3


def expected_compile_s(c: Candidate, config: AutotuneConfig) -> float | None:
    """Wall seconds trying ``c`` is expected to spend compiling: the last compile of its
    engine in this process, else the engine's ``first_compile_s`` (None: not known, or short
    enough not to matter), times :data:`PRIMING_COST_FACTOR` when EXHAUSTIVE primes it."""
    if c.engine is None:
        return None
    seconds = _compile_seen_s.get(c.engine.name, getattr(c.engine, "first_compile_s", None))
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return None
    return float(seconds) * (PRIMING_COST_FACTOR if _primed(c, config) else 1.0)


def _is_variant(c: Candidate) -> bool:
    """Knobs beyond those the session adds itself (priming, the workspace cap)."""
    return any(s.knob_id not in _SESSION_KNOBS for s in c.knob_settings)


def search_order(
    candidates: Sequence[Candidate],
    config: AutotuneConfig,
    default: Candidate | None,
    engine_rank: Mapping[str, int] | None = None,
) -> list[Candidate]:
    """The candidates in the order to try them (see the module docstring); without a budget,
    the caller's order (the RFC's candidate order). ``engine_rank``: engine name -> position
    in the learned ranking (engines it does not name go after those it does)."""
    if config.time_budget_s is None:
        return list(candidates)
    ranks = engine_rank or {}

    def key(c: Candidate) -> tuple[int, int, int, float, int]:
        return (
            0 if c is default else 1,
            1 if _is_variant(c) else 0,
            ranks.get(c.result.engine_name, len(ranks)),
            compile_cost(c, config),
            c.index,
        )

    return sorted(candidates, key=key)


def learned_engine_rank(
    graph: OpGraph, handle: Handle, candidates: Sequence[Candidate], config: AutotuneConfig
) -> dict[str, int] | None:
    """The learned ranking's order of the candidates' engines (engine name -> position), for
    :func:`search_order` under a budget; None without a budget, or where the model declines,
    has no data or cannot be read (the compile-cost order then stands alone)."""
    if config.time_budget_s is None:
        return None
    names = list(dict.fromkeys(c.result.engine_name for c in candidates if c.engine is not None))
    if len(names) < 2:
        return None
    from dnntune.backend.heuristics import HeuristicMode
    from dnntune.backend.learned import Decline, rank_engines
    from dnntune.errors import ConfigFileError

    try:
        result, _ = rank_engines(graph, handle.device_signature(), names)
    except ConfigFileError as exc:
        # a warning once per file and problem; under HeuristicMode.B the heuristics' chain
        # has warned about the file already (it asked the model for the default plan)
        said = str(exc) in _MODEL_REPORTED or config.baseline is HeuristicMode.B
        _MODEL_REPORTED.add(str(exc))
        _log.log(
            logging.DEBUG if said else logging.WARNING,
            "autotune: learned model unusable, the search order under the time budget falls "
            "back to the engines' compile cost: %s",
            exc,
        )
        return None
    if isinstance(result, Decline):
        _log.debug("autotune: no learned ranking for the search order: %s", result.reason)
        return None
    _log.info("autotune: search order by %s", result.reason)
    return {name: i for i, name in enumerate(result.engines)}


def skip_for_budget(c: Candidate, budget: Budget, compile_s: float | None = None) -> None:
    """Record that the budget left no time for ``c`` (excluded, not compiled or timed):
    spent, or (``compile_s``) too little left for its expected compile."""
    used = f"{budget.elapsed_s():.3f} s used, {budget.reserve_s:.3f} s kept for the confirmation"
    if compile_s is None:
        why = f"time_budget_s={budget.total_s:g} was spent ({used})"
        said = "the time budget is spent"
    else:
        left = max(0.0, budget.remaining_s() - budget.reserve_s)
        why = (
            f"its compile is expected to take {compile_s:.1f} s and {left:.2f} s of "
            f"time_budget_s={budget.total_s:g} are left for the search ({used})"
        )
        said = f"an expected {compile_s:.1f} s compile does not fit the {left:.2f} s left"
    c.exclude(SKIPPED_BUDGET, f"Plan {SKIPPED_BUDGET}: not benchmarked, {why}", by_caller=True)
    c.result.failure_kind = BUDGET
    _log.info("autotune: %s: skipped, %s", c.name, said)


def clearly_slower(
    samples: Sequence[float],
    best_ms: float,
    best_samples: Sequence[float],
    margin: float,
) -> bool:
    """True when even the fastest of ``samples`` is slower than ``best_ms`` beyond ``margin``
    and beyond noise (``BAND_Z`` pooled relative standard deviations)."""
    if len(samples) < ABANDON_MIN_SAMPLES or not best_ms > 0.0:
        return False
    noise = relative_noise(samples, best_samples)
    threshold = max(margin, BAND_Z * noise)
    return min(samples) / best_ms - 1.0 > threshold


#: samples a candidate timed under a spent budget still gets, unless they already add up to
#: ``BUDGET_MIN_MS``: its time is the one ranked and shown (the heuristic pick's too, when it
#: wins), and one sample of a short call is no measurement (audit, session 20; at 3 the median
#: drops one outlier), while a call of tens of milliseconds is measured well enough by one
BUDGET_MIN_SAMPLES = 3
BUDGET_MIN_MS = 20.0


class SampleStop:
    """Polled before each sample (``run_strategy``'s ``should_stop``): the candidate's timeout,
    the budget, and early abandonment; remembers which one stopped the loop."""

    def __init__(
        self,
        c: Candidate,
        config: AutotuneConfig,
        start: float,
        budget: Budget | None,
        best: AutotuneResult | None,
    ) -> None:
        self.c = c
        self.config = config
        self.budget = budget
        self.deadline = None
        if config.candidate_timeout_s is not None:
            # the benchmark's time budget: no new sample once it is spent (a single call that
            # overruns it is a hang, which the watchdog reports)
            self.deadline = start + config.candidate_timeout_s
        # FIXED_AVERAGE promises exactly timed_iterations samples (RFC 6.4): never cut short
        self.best = None
        stable = config.strategy is AutotuneStrategy.RUN_UNTIL_STABLE
        if config.abandon_slow and stable and best is not None and not c.result.is_default:
            self.best = best
        self.samples: list[float] = []
        self.why = ""

    def out_of_time(self) -> bool:
        """The candidate's timeout passed or the search's share of the budget is spent (no
        more warm-ups: the timed samples have their own minimum)."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            return True
        return self.budget is not None and self.budget.search_spent()

    def __call__(self) -> bool:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.why = f"candidate_timeout_s={self.config.candidate_timeout_s} reached"
        elif (
            self.budget is not None
            and (len(self.samples) >= BUDGET_MIN_SAMPLES or sum(self.samples) >= BUDGET_MIN_MS)
            and self.budget.search_spent()
        ):
            self.why = "the time budget is spent"
        elif self.best is not None and clearly_slower(
            self.samples, _decision_ms(self.best), self.best.samples_ms, self.config.abandon_margin
        ):
            self.why = (
                f"abandoned: clearly slower than {self.best.plan_name or self.best.engine_name} "
                f"({min(self.samples):.4f} ms at best against {_decision_ms(self.best):.4f} ms)"
            )
            self.c.result.abandoned = True
        return bool(self.why)

    def report(self, samples: int) -> None:
        level = logging.WARNING if self.why.startswith("candidate_timeout_s") else logging.INFO
        _log.log(
            level, "autotune: %s: stopped after %d iteration(s): %s", self.c.name, samples, self.why
        )


def _decision_ms(r: AutotuneResult) -> float:
    if r.decision_time_ms > 0.0:
        return r.decision_time_ms
    return estimate_ms(r.samples_ms) or r.min_time_ms
