"""Helpers shared by the autotune tests."""

from __future__ import annotations

from typing import Any

import torch

import dnntune as dt
from dnntune import testing

#: a variant pack by uid
Pack = dict[int, torch.Tensor]


def workspace(nbytes: int = testing.ESTIMATED_WORKSPACE_BYTES) -> torch.Tensor | None:
    return torch.empty(nbytes, dtype=torch.uint8) if nbytes else None


def tune(
    g: dt.Graph, handle: dt.Handle, pack: dict[int, Any], nbytes: int | None = 1024, **config: Any
) -> list[dt.AutotuneResult]:
    """autotune() in the general form with an ``nbytes`` workspace (None: compiled-plan form)."""
    cfg = dt.AutotuneConfig(**config)
    ws = workspace(nbytes or 0) if nbytes is not None else workspace()
    results = g.autotune(handle, pack, ws, nbytes, cfg)
    check_coverage(g, results)
    return results


def check_coverage(g: dt.Graph, results: list[dt.AutotuneResult]) -> None:
    """One result per candidate; succeeded first, failed after with rank -1 (RFC 6.3.1)."""
    n = len(g.plan_specs) if g.plan_specs else g.get_execution_plan_count()
    assert len(results) == n
    ok = [r.succeeded for r in results]
    assert ok == sorted(ok, reverse=True)
    for i, r in enumerate(results):
        if r.succeeded:
            assert r.rank == i and r.error_message == "" and r.compiled_plan_index >= 0
        else:
            assert r.rank == -1 and r.error_message


def by_name(results: list[dt.AutotuneResult]) -> dict[str, dt.AutotuneResult]:
    out: dict[str, dt.AutotuneResult] = {}
    for r in results:
        out.setdefault(r.engine_name, r)
    return out
