"""``optimize(..., time_budget_s=...)``: how long policy "tune" searches, and what comes after.

A budget has three phases, read when a layer signature is first seen
(:func:`phase`):

* :attr:`Phase.SEARCH`, the first :data:`TUNE_SHARE` of it: a new signature is tuned, and
  its search gets :data:`SEARCH_CAP` of what is left of the share as its own
  ``AutotuneConfig.time_budget_s`` (:func:`search_seconds_left`), so that one long search
  cannot eat the rest;
* :attr:`Phase.RACE`, the rest: a new signature is not tuned; the heuristic plan runs against
  PyTorch's op in a short interleaved race (:func:`race`) and the faster beyond noise is kept,
  the heuristic plan only once its output passes verification (:func:`verify`);
* :attr:`Phase.SPENT`, after it: PyTorch's op, unraced, so that the pass keeps to the budget.

Why a race and not one rule: cuDNN's heuristic plan for ConvNeXt-T's depthwise 7x7
convolutions took 360 µs a call against PyTorch's 41 (H200, session 30), while for ResNet-50's
convolutions it fuses the folded batch norm's activation that PyTorch's op runs as a kernel of
its own: with the race, ResNet-50's replay under a 15 s budget ran 1.42 ms against 1.90 ms on
PyTorch's op (side by side, session 31). Why a share: building cuDNN's heuristic plans for the
41 signatures EfficientNet-B0 leaves took about 10 s, which a race after the whole budget added
to the 15 s asked.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

import torch

from dnntune.autotune.confirm import Confirmation, confirm_winner, execute_sampler
from dnntune.autotune.verification import Verdict, Verifier
from dnntune.rfc import AutotuneConfig
from dnntune.torch._support import callers_rng_kept

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "RACE_CONFIG",
    "TUNE_SHARE",
    "Phase",
    "phase",
    "race",
    "search_seconds_left",
    "tuning_budget",
    "verify",
]

#: the clock of :func:`tuning_budget` (a module attribute: tests script it)
_now: Callable[[], float] = time.perf_counter
#: (search until, race until): the two deadlines of the current :func:`tuning_budget`
_deadlines: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "dnntune_tuning_deadlines", default=None
)

#: the share of a tuning budget that searches may take; races take the rest
TUNE_SHARE = 0.7

#: the part of what is left of the search share one search may take: the first search of
#: LLaMA's decode step (an RMSNorm whose first candidates compiled Triton's kernels and
#: Inductor's) took 16 s of a 12 s budget's 8.4 s share, and 4 of its 7 other signatures ran
#: untuned (H100, session 44)
SEARCH_CAP = 0.5

#: the shortest budget a search is given (a search must time at least the default plan)
MIN_SEARCH_S = 0.1

#: the race of a signature reached after the searches: 3 to 9 interleaved rounds, at most
#: 60 ms of them, and the heuristic plan kept only if faster beyond noise and by 2 %
RACE_CONFIG = AutotuneConfig(
    confirm_rounds=3, confirm_max_rounds=9, confirm_budget_ms=60.0, confirm_min_gain=0.02
)


class Phase(StrEnum):
    """Where the current tuning budget stands (no budget: always SEARCH)."""

    SEARCH = "search"
    RACE = "race"
    SPENT = "spent"


@contextlib.contextmanager
def tuning_budget(seconds: float | None) -> Iterator[None]:
    """Within this context, new signatures are searched, raced or left to PyTorch's op by
    the budget's :func:`phase` (None: no limit, always searched)."""
    if seconds is None:
        yield
        return
    now = _now()
    token = _deadlines.set((now + TUNE_SHARE * seconds, now + seconds))
    try:
        yield
    finally:
        _deadlines.reset(token)


def phase() -> Phase:
    """The current budget's phase, by its clock now."""
    deadlines = _deadlines.get()
    if deadlines is None:
        return Phase.SEARCH
    now = _now()
    if now < deadlines[0]:
        return Phase.SEARCH
    return Phase.RACE if now < deadlines[1] else Phase.SPENT


def search_seconds_left() -> float | None:
    """A search's own ``time_budget_s``: :data:`SEARCH_CAP` of the seconds left of the current
    budget's search share, at least :data:`MIN_SEARCH_S` (None: no budget). ResNet-50's sixth
    search once ran past the whole 15 s budget, and its 20 other signatures ran PyTorch's op
    unraced: 2.0 ms a replayed forward against 1.4 ms (H200, session 31)."""
    deadlines = _deadlines.get()
    if deadlines is None:
        return None
    return max(SEARCH_CAP * (deadlines[0] - _now()), MIN_SEARCH_S)


def race(
    handle: Handle,
    run_heuristic: Callable[[], object],
    run_pytorch: Callable[[], object],
    *,
    heuristic: str,
    pytorch: str,
    device: torch.device,
) -> Confirmation:
    """The heuristic plan (the race's "winner") against PyTorch's op (its "default"), timed
    in interleaved rounds as every tuned winner is confirmed
    (:func:`~dnntune.autotune.confirm.confirm_winner`, :data:`RACE_CONFIG`); ``confirmed``:
    the heuristic plan is faster beyond noise and by 2 %. The caller's random numbers are
    left as they were."""
    with callers_rng_kept(device):
        return confirm_winner(
            execute_sampler(handle, run_heuristic, RACE_CONFIG),
            execute_sampler(handle, run_pytorch, RACE_CONFIG),
            RACE_CONFIG,
            winner=heuristic,
            default=pytorch,
        )


def verify(
    graph: OpGraph,
    pack: Mapping[int, torch.Tensor],
    run_with: Callable[[Mapping[int, torch.Tensor]], None],
    handle: Handle,
) -> Verdict:
    """A plan checked against the reference before it is kept (seed 004: every winner is
    verified), as a tuned candidate is: one run into fresh outputs, compared with the graph's
    tolerances, and the inputs checked untouched. The race's winner, and every heuristic or
    override-file plan on its first call (:mod:`dnntune.torch._plan_check`)."""
    verifier = Verifier(graph, pack, RACE_CONFIG)
    with torch.no_grad():
        return verifier.check(run_with, handle.timer.synchronize)
