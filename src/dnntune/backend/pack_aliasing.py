"""Which buffers of a variant pack may share memory (RFC 6.3), for the pack checks.

An output buffer must not share memory with an input or another output (RFC 6.3: execution
assumes "separate input/output buffers"): an engine may read an input after it has written part
of an output over it (a matmul with ``y`` aliasing ``a`` gave wrong numbers). The check compares
each buffer's byte range. One exception: a graph of pointwise ops only, with one output, may
write that output over an input exactly (the same address, dims, strides and dtype): each
element is read before it is written.

``variant_pack.py`` runs the check (its full path and ``Graph.execute``'s bound fast path) only
when the buffers' addresses change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dnntune.errors import InvalidValueError
from dnntune.graph.node import OpKind

if TYPE_CHECKING:
    import torch

    from dnntune.graph.ir import OpGraph
    from dnntune.graph.tensor import TensorAttributes

__all__ = ["Aliasing"]


def _extent(dims: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes from a tensor's first element to the end of its last (0: it has no elements)."""
    if any(d == 0 for d in dims):
        return 0
    return (1 + sum((d - 1) * s for d, s in zip(dims, strides, strict=True) if d > 1)) * itemsize


class Aliasing:
    """Which buffers of a pack may share memory, for one graph and one order of its tensors.

    :meth:`check` takes the buffers and their data pointers in ``uids``' order and raises when
    an output's byte range intersects another buffer's, except the exact in-place write of a
    pointwise graph (see the module docstring). Byte ranges come from the graph's dims,
    strides and dtypes (the pack was checked against them), computed once.
    """

    __slots__ = ("extents", "in_place", "labels", "layouts", "outputs", "uids")

    def __init__(self, graph: OpGraph, tensors: Sequence[TensorAttributes]) -> None:
        written = {id(t) for t in graph.output_tensors()}
        self.uids = tuple(t.uid for t in tensors)
        #: positions of the outputs in ``uids``
        self.outputs = tuple(i for i, t in enumerate(tensors) if id(t) in written)
        self.labels = tuple(
            f"{'output' if id(t) in written else 'input'} {t.name or '?'} (uid {t.uid})"
            for t in tensors
        )
        #: per tensor: (dims, strides, data type); an exact in-place write has equal layouts
        self.layouts = tuple((tuple(t.dims), tuple(t.strides), t.data_type) for t in tensors)
        #: per tensor: its byte extent, or None when its data type is unset (read off the buffer)
        self.extents = tuple(
            None
            if t.data_type is None
            else _extent(t.dims, t.strides, t.data_type.to_torch().itemsize)
            for t in tensors
        )
        #: a pointwise graph with one output may write it exactly over an input
        self.in_place = (
            bool(graph.nodes)
            and len(written) == 1
            and all(node.kind is OpKind.POINTWISE for node in graph.nodes)
        )

    def check(self, tensors: Sequence[torch.Tensor], pointers: Sequence[int]) -> None:
        """Raise InvalidValueError naming an output and the buffer it overlaps, if any."""
        spans: list[tuple[int, int]] = []
        for tensor, start, extent in zip(tensors, pointers, self.extents, strict=True):
            if extent is None:
                extent = _extent(tensor.shape, tensor.stride(), tensor.element_size())
            # no elements, or no memory at all (a meta tensor): nothing to overlap
            spans.append((start, start + extent) if extent and start else (0, 0))
        outputs = self.outputs
        for n, i in enumerate(outputs):
            i0, i1 = spans[i]
            if i1 == 0:
                continue
            for j in range(len(spans)):
                if j == i or (j in outputs and outputs.index(j) < n):
                    continue  # itself, or a pair of outputs already compared
                j0, j1 = spans[j]
                if not (i0 < j1 and j0 < i1):
                    continue
                if tensors[i].device != tensors[j].device:
                    continue  # equal numbers in two address spaces (no handle: any devices)
                if j not in outputs and self._exact_in_place(i, j, spans):
                    continue
                raise InvalidValueError(self._message(i, j, tensors, spans))

    def _exact_in_place(self, i: int, j: int, spans: Sequence[tuple[int, int]]) -> bool:
        return self.in_place and spans[i] == spans[j] and self.layouts[i] == self.layouts[j]

    def _message(
        self,
        i: int,
        j: int,
        tensors: Sequence[torch.Tensor],
        spans: Sequence[tuple[int, int]],
    ) -> str:
        (i0, i1), (j0, j1) = spans[i], spans[j]
        shared = min(i1, j1) - max(i0, j0)
        dims, strides, data_type = self.layouts[i]
        dtype = data_type.to_torch() if data_type is not None else tensors[i].dtype
        fresh = (
            f"torch.empty_strided({list(dims)}, {list(strides)}, dtype={dtype}, "
            f"device={str(tensors[i].device)!r})"
        )
        return (
            f"variant pack: {self.labels[i]} shares memory with {self.labels[j]} ({shared} "
            f"bytes in common): an engine may read a buffer after writing part of an output "
            "over it, so the results would be wrong (RFC 6.3: execution needs separate input "
            f"and output buffers). Give the output a buffer of its own, e.g. {fresh}; only a "
            "graph of pointwise ops with one output may write it over an input, and only "
            "exactly (the same address, dims, strides and dtype)"
        )
