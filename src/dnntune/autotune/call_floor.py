"""Not compiling a candidate that cannot win: its engine's measured call floor (issue 25).

An engine may know a measured lower bound on any of its plans' calls on a handle
(``Engine.call_floor_ms``): TORCH_COMPILE_ENGINE on the CPU, where every call of a compiled
function runs Dynamo's guards and frame first (``providers._torch.call_floor``). Once a
candidate has been timed faster than that (its fastest sample), beyond ``abandon_margin``,
such a candidate cannot win on its merits: each of its samples is at least the floor. It is
then not built or timed but excluded (:data:`~dnntune.autotune.candidates.SKIPPED_FLOOR`,
``failure_kind="floor"``), one result per candidate still holding, as a budget's skipped
candidates are (``search.skip_for_budget``; where the budget has no time for its compile
either, the budget's reason is the one recorded).

For the floor to be compared with something, such candidates (:func:`floor_gated`) are built
in their turn, after every other candidate was timed (:func:`gated_last`), as a time budget
builds every candidate (``runner.InProcessRunner``). Why: ``optimize`` on tiny_cnn and tiny_mlp
(CPU, session 62, fresh caches) compiled one torch.compile candidate per layer, 0.9-2.5 s each
(10-19 s for the first of the process) and lost every one on the small layers; their linear
layers ran in 11-22 us on TORCH_ENGINE and 91-140 us compiled, against a floor of 28-72 us.
A layer slower than the floor is still compiled and may win: tiny_mlp's full-size LayerNorm
took 199 us compiled against 223 us on TORCH_ENGINE there.

Not applied to the default plan (the confirmation's baseline), before any candidate has
succeeded, with ``abandon_slow=False`` (time every candidate), or in an isolated worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dnntune.autotune.candidates import SKIPPED_FLOOR, Candidate
from dnntune.autotune.failures import FLOOR
from dnntune.rfc import AutotuneConfig, AutotuneResult

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle

__all__ = ["cannot_win", "floor_gated", "floor_ms", "gated_last", "skip_for_floor"]

_log = logging.getLogger(__name__)


def floor_gated(c: Candidate, handle: Handle, config: AutotuneConfig) -> bool:
    """Whether a call floor may keep ``c`` from being built: its engine may have one on
    ``handle`` (nothing measured yet), and ``c`` is not the default plan; never with
    ``abandon_slow=False``."""
    if c.engine is None or c.result.is_default or not config.abandon_slow:
        return False
    return c.engine.has_call_floor(handle)


def floor_ms(c: Candidate, handle: Handle) -> float | None:
    """``c``'s engine's call floor on ``handle`` (measured on the first ask of a process)."""
    floor = c.engine.call_floor_ms(handle) if c.engine is not None else None
    return floor if floor is not None and floor > 0.0 else None


def gated_last(todo: Sequence[Candidate], gated: Sequence[Candidate]) -> list[Candidate]:
    """``todo`` with the ``gated`` candidates moved to its end, each group in its order: the
    best time the floor is compared with is known before they come up."""
    late = {id(c) for c in gated}
    return [c for c in todo if id(c) not in late] + [c for c in todo if id(c) in late]


def cannot_win(floor_ms: float, best: AutotuneResult, margin: float) -> bool:
    """Whether a candidate whose calls take at least ``floor_ms`` is slower than ``best`` by
    more than ``margin`` (0.10: 10 %) whatever it computes.

    ``best``'s fastest sample, not its decision time: the floor is itself the fastest of its
    repeats, so the two are the uncontended times of the same clock. A median under a busy
    CPU read 12-16 ms for a linear layer whose fastest sample was 12 us (tiny_mlp, load 4.8 on
    2 cores, session 62): against it a compiled candidate can only win by noise."""
    return best.min_time_ms > 0.0 and floor_ms > best.min_time_ms * (1.0 + margin)


def skip_for_floor(c: Candidate, floor_ms: float, best: AutotuneResult) -> None:
    """Record that ``c`` was not built or timed: ``floor_ms`` already loses to ``best``."""
    engine = c.engine.name if c.engine is not None else c.result.engine_name
    best_name = best.plan_name or best.engine_name
    why = (
        f"{engine}'s calls take at least {floor_ms * 1e3:.1f} us here (its measured call "
        f"floor), slower than the best so far, {best_name} at "
        f"{best.min_time_ms * 1e3:.1f} us at best"
    )
    c.exclude(SKIPPED_FLOOR, f"Plan {SKIPPED_FLOOR}: not built or timed, {why}", by_caller=True)
    c.result.failure_kind = FLOOR
    _log.info("autotune: %s: skipped, %s", c.name, why)
