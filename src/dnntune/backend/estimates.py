"""Plan-spec workspace estimates that build nothing, for a tune under a time budget.

A plan spec carries its engine's pre-compile workspace estimate (``Engine.
estimate_workspace_size``), and cuDNN can only tell a pinned engine config's workspace by
building its plan: the five plans ``add_suggested_variants`` pins for a norm or a GEMM took
0.2-0.5 s each to build (H100, session 44), before a budgeted search that then skipped most of
them. Under :func:`estimates_without_builds` an engine answers from what it has built already
and otherwise gives an estimate of 0 bytes (``get_estimated_max_workspace_size`` is documented
as not guaranteed to cover the compiled plans); the plans are built when autotune compiles each
candidate in its turn, which under a budget it does one at a time, and a plan whose compiled
workspace exceeds the caller's is skipped as such. Engines read :func:`builds_allowed`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = [
    "DEFERRED_WORKSPACE_BYTES",
    "builds_allowed",
    "deferred_workspace_size",
    "estimates_without_builds",
]

#: the workspace a tune whose variants' plans were not built gives its candidates at least,
#: on a GPU (a variant whose compiled plan needs more is skipped as such)
DEFERRED_WORKSPACE_BYTES = 64 << 20

_no_builds: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dnntune_estimates_without_builds", default=False
)


@contextlib.contextmanager
def estimates_without_builds(when: bool = True) -> Iterator[None]:
    """Within this context, plan-spec workspace estimates build no plan (see the module);
    ``when`` False: they build as usual (a caller without a budget)."""
    token = _no_builds.set(when or _no_builds.get())
    try:
        yield
    finally:
        _no_builds.reset(token)


def builds_allowed() -> bool:
    """Whether a workspace estimate (or an engine's ``estimate_ahead``) may build plans."""
    return not _no_builds.get()


def deferred_workspace_size(estimate: int, device_type: str) -> int:
    """The workspace bytes to give a tune whose variants were added under
    :func:`estimates_without_builds`: the estimate, and on a GPU at least
    :data:`DEFERRED_WORKSPACE_BYTES`, room for the plans not yet built."""
    return max(estimate, DEFERRED_WORKSPACE_BYTES) if device_type == "cuda" else estimate
