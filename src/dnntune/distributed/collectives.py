"""The job's collectives (gather, broadcast) with the error every rank raises when one fails."""

from __future__ import annotations

from typing import Any

from dnntune.distributed.env import DistContext
from dnntune.errors import DnnTuneError

__all__ = ["DistributedTuneError", "broadcast", "gather"]


class DistributedTuneError(DnnTuneError, RuntimeError):
    """A collective failed (a rank died or timed out); the message says where."""


def _collective_failed(ctx: DistContext, where: str, exc: BaseException) -> DistributedTuneError:
    return DistributedTuneError(
        f"rank {ctx.rank}: collective after {where} failed ({type(exc).__name__}: {exc}); "
        f"another rank died or did not answer within {ctx.timeout_s:.0f} s: look for the first "
        "error in the other ranks' output, or give a slow rank a longer collective timeout"
    )


def gather(ctx: DistContext, payload: Any, where: str) -> list[Any]:
    """Every rank's ``payload``, in rank order; ``where`` names the step for the error."""
    try:
        return ctx.all_gather(payload)
    except Exception as exc:  # gloo raises RuntimeError on timeouts and dead peers
        raise _collective_failed(ctx, where, exc) from None


def broadcast(ctx: DistContext, payload: Any, where: str) -> Any:
    """Rank 0's ``payload`` on every rank (the others pass None)."""
    try:
        return ctx.broadcast(payload)
    except Exception as exc:  # gloo raises RuntimeError on timeouts and dead peers
        raise _collective_failed(ctx, where, exc) from None
