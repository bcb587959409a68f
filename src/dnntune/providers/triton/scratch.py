"""Buffers shaped like a graph's tensors, for a Triton search and for compiling ahead."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["Scratch"]


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
