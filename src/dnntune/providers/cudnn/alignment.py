"""cuDNN plans on tensors whose addresses are not 16-byte aligned: run on aligned copies.

The frontend declares every tensor 16-byte aligned, and a plan is built on that promise. A
tensor that starts 2, 4 or 8 bytes into an allocation (a view such as ``x[..., 1:]`` or
``buf[1:].view(...)``) breaks it, and what cuDNN does then depends on the engine: on an H100
(cuDNN 9.19, session 59's probe) a convolution's execute failed with
``CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER`` and a fused GEMM **returned wrong numbers** (max
error 6.8 on values of order 1) without an error. PyTorch's own cuDNN calls key their plans on
each pointer's alignment for the same reason.

Here a call whose addresses break the promise (found where a variant pack is made, so a call
on addresses seen before pays nothing) runs on staged copies instead: each misaligned tensor's
bytes, from its first element to its last, are copied into a fresh allocation (PyTorch's
allocator hands out 512-byte aligned blocks), the plan runs on those, and the outputs' bytes
are copied back. An output is staged with its current bytes too, so that the gaps between its
elements (a strided output) keep what they held. The copies run on the plan's stream, before
and after it, so a CUDA-graph capture records them with it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from dnntune.graph.ir import OpGraph

__all__ = ["ALIGNMENT", "Staging", "byte_spans", "misaligned"]

#: the alignment, in bytes, the frontend declares for every tensor
ALIGNMENT = 16


def misaligned(pointers: Iterable[int]) -> bool:
    """Whether any of ``pointers`` breaks :data:`ALIGNMENT` (0, no tensor, does not)."""
    return any(p % ALIGNMENT for p in pointers)


def byte_spans(graph: OpGraph, uids: Iterable[int]) -> dict[int, int]:
    """uid -> bytes from the tensor's first element to the end of its last (0: empty), for
    the tensors of ``graph`` named by ``uids``."""
    wanted = set(uids)
    spans: dict[int, int] = {}
    for t in graph.io_tensors():
        if t.uid not in wanted or t.data_type is None or t.is_scalar:
            continue
        spans[t.uid] = t.storage_size() * t.data_type.to_torch().itemsize
    return spans


def _alias(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of memory at ``address`` on ``device`` (no copy)."""
    import torch

    if device.type == "cuda":

        class _Memory:
            __cuda_array_interface__ = {
                "shape": (nbytes,),
                "typestr": "|u1",
                "data": (address, False),
                "version": 2,
            }

        return torch.as_tensor(_Memory(), device=device)
    raw = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8)


@dataclass(frozen=True)
class Staging:
    """What a plan needs to run on aligned copies: each tensor's byte span and which of its
    tensors it writes."""

    spans: Mapping[int, int]
    outputs: frozenset[int]
    device: torch.device

    def run(
        self,
        keys: Sequence[int | None],
        pointers: Sequence[int],
        execute: Callable[[tuple[int, ...]], object],
    ) -> None:
        """``execute`` on ``pointers`` (one per entry of ``keys``: the uid it gives, None for
        one the plan does not take), each misaligned tensor of the plan's replaced by an
        aligned copy of its bytes; the outputs' copies are copied back after it."""
        import torch

        staged = list(pointers)
        back: list[tuple[torch.Tensor, torch.Tensor]] = []
        held: list[torch.Tensor] = []
        for i, (uid, address) in enumerate(zip(keys, pointers, strict=True)):
            if uid is None or address % ALIGNMENT == 0:
                continue
            nbytes = self.spans.get(uid, 0)
            if nbytes <= 0:
                continue
            user = _alias(address, nbytes, self.device)
            copy = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            copy.copy_(user)
            held.append(copy)
            staged[i] = copy.data_ptr()
            if uid in self.outputs:
                back.append((user, copy))
        execute(tuple(staged))
        for user, copy in back:
            user.copy_(copy)
