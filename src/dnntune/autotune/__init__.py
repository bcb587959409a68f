"""The autotune runtime (RFC 0013 sections 6.1 to 6.4), one concept per module.

The RFC's structs (AutotuneConfig, AutotuneResult, PlanSpec, ...) live below, in
``dnntune.rfc``. In the order one autotune() call uses them:

- ``plan_specs`` and ``sweep``: engine discovery and the add_engine_*() plan-spec collection.
- ``session``: run_autotune, the upfront checks and the flow; ``exhaustive``:
  run_exhaustive_sweep and its write of the exact-match ranking cache.
- ``candidates``: one candidate (and one result) per plan spec or compiled plan, dispositions.
- ``runner``: where candidates run: in this process, or ``isolation`` + ``worker``: in a
  worker process that may crash (``isolate=True``).
- ``watchdog`` and ``failures``: deadlines on compiles and executes, out-of-memory and crash
  handling (``candidate_timeout_s``).
- ``priming``: EXHAUSTIVE mode's temporary global.benchmarking=1 plans.
- ``compilation``: compiling plan specs, the post-compile workspace checks.
- ``verification``: every candidate's output against ``dnntune.reference``.
- ``benchmark`` and ``strategies``: warmup, sync, the timed loop (the clocks, samples and
  statistics are ``dnntune.measure``'s).
- ``search`` and ``call_floor``: a time budget's search order and skips, early abandonment,
  and candidates left unbuilt because their engine's measured call floor already loses.
- ``recheck`` and ``decision``: interleaved re-timing of close contenders, decided beyond
  noise; :func:`winner_margin` says how clearly the winner won.
- ``ranking``: default and caller-supplied ranking with its reorder-only contract.
- ``baseline`` and ``confirm``: the default (heuristic) plan among the candidates, and the
  confirmation of the winner against it in fresh interleaved rounds (never worse than the
  default); ``confirm`` also serves tune, bench --oracle, dnntune.torch and distributed.
- ``preconditions``: what autotune() checks before it spends any time.
- ``cost``: what a call cost (:class:`AutotuneSummary`) and :func:`break_even_calls`.

The Graph facade (``dnntune.frontend``) only delegates here. ``docs/measurement.md`` explains
the measurement rules. Public here (the package's exports): the winner's margin, a call's cost,
the confirmation of a finished plan against another (:func:`confirm_winner` over
:func:`execute_sampler`, as ``autotune()`` confirms inside its session) and the knob-variant sets
that every tuning entry point adds; the modules themselves are internal.
"""

from dnntune.autotune.confirm import Confirmation, confirm_winner, execute_sampler
from dnntune.autotune.cost import AutotuneSummary, break_even_calls
from dnntune.autotune.decision import WinnerMargin, winner_margin
from dnntune.autotune.variants import (
    add_knob_variants,
    add_suggested_variants,
    knob_variants,
    sweep_variants,
)

__all__ = [
    "AutotuneSummary",
    "Confirmation",
    "WinnerMargin",
    "add_knob_variants",
    "add_suggested_variants",
    "break_even_calls",
    "confirm_winner",
    "execute_sampler",
    "knob_variants",
    "sweep_variants",
    "winner_margin",
]
