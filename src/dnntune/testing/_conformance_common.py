"""Conformance cases: helpers every op builder shares (tensors, layouts, sizes)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from dnntune.frontend import Graph
from dnntune.graph.tensor import channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType

if TYPE_CHECKING:
    from dnntune.graph.tensor import TensorAttributes

_F32 = DataType.FLOAT
#: the row widths of the wide-row class: wider than any kernel's block
WIDE_ROWS = ((1, 65536), (3, 100003))


# ---- helpers -----------------------------------------------------------------------------
def _graph(name: str, dtype: DataType) -> Graph:

    return Graph(name=name, io_data_type=dtype, compute_data_type=_F32, intermediate_data_type=_F32)


def _padded(dims: list[int], pad: int = 3) -> list[int]:
    """Strides of a view of the first ``dims[-1]`` columns of rows ``dims[-1] + pad`` wide."""
    return contiguous_strides([*dims[:-1], dims[-1] + pad])


def _transposed(dims: list[int]) -> list[int]:
    """Strides of a [..., M, N] view of a [..., N, M] row-major buffer."""
    m, n = dims[-2], dims[-1]
    base = contiguous_strides([*dims[:-2], n, m])
    return [*base[:-2], 1, m]


def _layout_strides(dims: list[int], layout: str) -> list[int] | None:
    if layout == "channels_last" and len(dims) >= 3:
        return channels_last_strides(dims)
    if layout == "strided":
        return _padded(dims)
    if layout == "transposed" and len(dims) >= 2:
        return _transposed(dims)
    return None


def _tensor(
    g: Graph, name: str, dims: list[int], layout: str = "contiguous", dtype: DataType | None = None
) -> TensorAttributes:
    return g.tensor(name, dims, _layout_strides(dims, layout), data_type=dtype)


def _out(t: TensorAttributes, name: str, layout: str = "contiguous") -> None:
    t.set_name(name).set_output(True)
    if layout == "channels_last" and len(t.dims) >= 3:
        t.set_strides(channels_last_strides(t.dims))


def _tail(rng: random.Random, values: tuple[int, ...] = (3, 7, 13, 37, 100, 129, 257)) -> int:
    return rng.choice(values)


def _wide(rng: random.Random) -> tuple[int, int]:
    return rng.choice(WIDE_ROWS)
