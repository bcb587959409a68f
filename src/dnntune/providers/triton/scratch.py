"""Buffers shaped like a graph's tensors, and compiling many Triton configs together: for a
search and for autotune's candidates (``TritonEngine.precompile``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["Scratch", "compile_all"]

_log = logging.getLogger(__name__)


def compile_all(
    match: Any,
    configs: list[dict[str, int]],
    scratch: Scratch,
    build: Callable[[Any, dict[str, int]], Any],
    workers: int,
) -> dict[int, Any]:
    """A launcher per config (``build(match, config)``, keyed by ``id(config)``), their kernels
    compiled on a thread pool under Triton's ``AsyncCompileMode`` (where this Triton has it).

    Best effort: a config that fails here is compiled again, and fails, where it is launched.
    """
    launchers: dict[int, Any] = {}
    try:
        import triton

        mode = getattr(triton, "AsyncCompileMode", None)
        for config in configs:
            launchers[id(config)] = build(match, config)
        if mode is None:
            return launchers
        with ThreadPoolExecutor(min(workers, len(configs))) as pool, mode(pool, ignore_errors=True):
            for launcher in launchers.values():
                try:
                    launcher(scratch.pack, scratch.workspace, warmup=True)
                except Exception as exc:  # compiled again (and reported) when launched
                    _log.debug("triton precompile failed: %s: %s", type(exc).__name__, exc)
    except Exception as exc:
        _log.info("triton: parallel compile unavailable (%s); compiling serially", exc)
    return launchers


class Scratch:
    """Buffers shaped like the graph's tensors, for searching and compiling."""

    def __init__(self, graph: OpGraph, handle: Handle, workspace_bytes: int) -> None:
        import torch

        self.pack: dict[int, torch.Tensor] = {}
        gen = torch.Generator(device=handle.device).manual_seed(0)
        for t in graph.io_tensors():
            assert t.uid is not None and t.data_type is not None
            dtype = t.data_type.to_torch()
            flat = torch.empty(t.storage_size(), dtype=dtype, device=handle.device)
            if flat.is_floating_point() and flat.numel():
                flat.normal_(generator=gen)
            self.pack[t.uid] = torch.as_strided(flat, t.dims, t.strides)
        self.workspace = (
            torch.empty(workspace_bytes, dtype=torch.uint8, device=handle.device)
            if workspace_bytes
            else None
        )
