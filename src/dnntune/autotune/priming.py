"""EXHAUSTIVE-mode priming (RFC 0013 section 6.4): let each engine run its internal search.

For each candidate whose engine has ``global.benchmarking``, a temporary plan is built with the
candidate's knobs plus ``global.benchmarking=1``, executed once and discarded. The engine keeps
what it learned (cuDNN's benchmark cache, max-autotune's choice, a perf-db record), so the real
plan compiled afterwards is the primed one. A priming plan whose workspace does not fit is a
skip, not a failure; a failure either aborts autotune() or is recorded, per the policy.

An engine's search must stay within the caller's workspace: the RFC sequence sizes the
workspace from ``get_estimated_max_workspace_size()`` before the mode is known, and a search
that picks a faster plan needing more (cuDNN: "Workspace size 272 exceeds limit 0") would
leave the real plan, built from the search's record, unable to run. So before priming,
:func:`cap_workspace_limit` gives every exhaustive-capable candidate whose engine has
``global.workspace_size_limit`` (and who does not set it) that knob at the caller's limit:
the search considers only plans that fit, and the knob is part of the candidate's settings,
so the plan rebuilt later from the override file looks up the same search record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dnntune import settings
from dnntune.autotune.candidates import Candidate
from dnntune.autotune.compilation import CompileError, guarded_compile
from dnntune.autotune.failures import (
    OOM,
    UNSUPPORTED,
    describe_failure,
    failure_kind,
    release_memory,
)
from dnntune.autotune.watchdog import Watchdog
from dnntune.backend.engine import Plan
from dnntune.backend.knobs import (
    BENCHMARKING,
    WORKSPACE_SIZE_LIMIT,
    KnobSetting,
    normalize_settings,
)
from dnntune.backend.registry import get_registry
from dnntune.rfc import AutotuneConfig, PrimingFailurePolicy

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "PrimingAborted",
    "PrimingSummary",
    "cap_workspace_limit",
    "prime_candidates",
    "priming_enabled",
    "priming_settings",
]

_log = logging.getLogger(__name__)


class PrimingAborted(Exception):
    """Priming failed under ABORT_ON_PRIMING_FAILURE; ``candidate`` is the one that failed."""

    def __init__(self, candidate: Candidate, message: str) -> None:
        super().__init__(message)
        self.candidate = candidate
        self.message = message


@dataclass
class PrimingSummary:
    primed: int = 0
    skipped_workspace: int = 0
    failed: int = 0
    not_capable: int = 0
    disabled: bool = False


def priming_enabled() -> bool:
    """Whether EXHAUSTIVE mode primes at all (``DNNTUNE_FORCE_BENCHMARKING=0`` turns it off)."""
    return settings.force_benchmarking() is not False


def priming_settings(settings_: Sequence[KnobSetting]) -> list[KnobSetting]:
    """The candidate's knob settings with ``global.benchmarking=1`` (replacing any value)."""
    return [*(s for s in settings_ if s.knob_id != BENCHMARKING), KnobSetting(BENCHMARKING, 1)]


def cap_workspace_limit(graph: OpGraph, candidates: Sequence[Candidate], limit: int) -> int:
    """Set ``global.workspace_size_limit=limit`` on exhaustive-capable candidates whose engine
    has that knob and who leave it unset (and whose default is larger); returns how many."""
    capped = 0
    for c in candidates:
        if not c.in_play or not c.prime or not c.result.supports_exhaustive or c.engine is None:
            continue
        if any(s.knob_id == WORKSPACE_SIZE_LIMIT for s in c.knob_settings):
            continue
        try:
            knob = next(
                (k for k in c.engine.knobs(graph) if k.knob_id == WORKSPACE_SIZE_LIMIT), None
            )
        except Exception as exc:  # a provider bug must not stop the session
            _log.debug("autotune: %s: knobs() raised %s", c.name, exc)
            continue
        default = None if knob is None else knob.default_value
        if not isinstance(default, int) or isinstance(default, bool) or default <= limit:
            continue
        c.knob_settings = normalize_settings(
            [*c.knob_settings, KnobSetting(WORKSPACE_SIZE_LIMIT, limit)]
        )
        c.result.knob_settings = list(c.knob_settings)
        capped += 1
    if capped:
        _log.info(
            "autotune: %d exhaustive-capable candidate(s) search within the %d-byte workspace "
            "(%s=%d)",
            capped,
            limit,
            WORKSPACE_SIZE_LIMIT,
            limit,
        )
    return capped


#: the reason a candidate whose engine has no search of its own for the graph gives
NOT_CAPABLE = "the engine has no exhaustive search for this graph (supports_exhaustive is false)"


def prime_candidates(
    graph: OpGraph,
    handle: Handle,
    candidates: Sequence[Candidate],
    run_plan: Callable[[Plan], None],
    workspace_limit: int,
    config: AutotuneConfig,
    watchdog: Watchdog | None = None,
) -> PrimingSummary:
    """Prime every exhaustive-capable candidate still in play.

    Args:
        run_plan: executes a plan once on the caller's buffers and synchronizes (through the
            watchdog: a hang raises CandidateTimeout).
        workspace_limit: bytes available; a larger priming plan is skipped, not run.
        watchdog: bounds the priming compile (``candidate_timeout_s``).

    Raises:
        PrimingAborted: a priming build or run failed and the policy is ABORT_ON_PRIMING_FAILURE.
    """
    summary = PrimingSummary()
    if not priming_enabled():
        summary.disabled = True
    registry = get_registry()
    for c in candidates:
        r = c.result
        if not c.in_play or not c.prime:  # the unprimed default keeps its reason
            continue
        if not r.supports_exhaustive:
            summary.not_capable += 1
            # RFC 6.5: under EXHAUSTIVE a result not primed says why, this one too (it read
            # empty in the override file; new-user audit, session 55)
            r.exhaustive_not_run_reason = NOT_CAPABLE
            continue
        if summary.disabled:
            r.exhaustive_not_run_reason = "priming disabled by DNNTUNE_FORCE_BENCHMARKING=0"
            continue
        if c.engine is None or registry.why_not(c.engine, graph, handle) is not None:
            continue  # the real compile reports it as "failed compile"
        start = time.perf_counter()
        failure: str | None = None
        kind = ""
        try:
            plan = guarded_compile(
                c, graph, handle, watchdog, priming_settings(c.knob_settings), "priming compile"
            )
        except CompileError as exc:
            failure, kind = f"priming plan {exc.stage}: {exc.message}", exc.kind
        else:
            if plan.workspace_size > workspace_limit:
                summary.skipped_workspace += 1
                r.exhaustive_not_run_reason = (
                    f"priming skipped: priming plan workspace {plan.workspace_size} exceeds "
                    f"limit {workspace_limit}"
                )
                if r.estimated_workspace_size <= workspace_limit:
                    _log.warning(
                        "autotune: %s: priming plan workspace %d bytes exceeds the %d-byte "
                        "limit although the estimate (%d) fit; benchmarked unprimed",
                        c.name,
                        plan.workspace_size,
                        workspace_limit,
                        r.estimated_workspace_size,
                    )
                del plan
                continue
            try:
                run_plan(plan)
            except Exception as exc:
                failure = f"priming execute failed: {describe_failure(exc)}"
                kind = failure_kind(exc)
            del plan  # the priming plan is discarded; the engine keeps its primed state
        r.priming_time_ms = (time.perf_counter() - start) * 1e3
        if kind == OOM:
            release_memory(handle.device)
        if failure is None:
            r.ran_exhaustive = True
            summary.primed += 1
            _log.debug("autotune: %s primed in %.1f ms", c.name, r.priming_time_ms)
            continue
        summary.failed += 1
        if config.priming_failure_policy is PrimingFailurePolicy.ABORT_ON_PRIMING_FAILURE:
            r.exhaustive_not_run_reason = f"priming failed: {failure}"
            raise PrimingAborted(c, failure)
        r.exhaustive_not_run_reason = f"priming failed: {failure}"
        # a variant the engine cannot run here is an expected outcome: shown with -v
        level = logging.INFO if kind == UNSUPPORTED else logging.WARNING
        _log.log(level, "autotune: %s: %s; benchmarking it unprimed", c.name, failure)
    _log.info(
        "autotune: priming - %d primed, %d skipped (workspace), %d failed, %d not exhaustive-"
        "capable%s",
        summary.primed,
        summary.skipped_workspace,
        summary.failed,
        summary.not_capable,
        " (disabled by DNNTUNE_FORCE_BENCHMARKING=0)" if summary.disabled else "",
    )
    return summary
