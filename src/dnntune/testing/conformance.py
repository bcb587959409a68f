"""Conformance cases: deterministic graphs over every op kind, dtype, layout and shape class.

``generate_case(seed, index, size)`` always returns the same graph for the same arguments (pure
Python and the graph builder; nothing runs, no GPU needed). The index walks the cells in a
fixed order, so the first ``len(OPS) * len(DTYPES) * len(SHAPE_CLASSES)`` indices of any seed
cover every (op, dtype, shape class) cell once, and the layout turns over every 195 indices;
the remaining details (kernel size, stride, groups, epilogue, mask, GQA...) come from a
generator seeded by ``(seed, index)``.

Every case is a hipDNN graph JSON document that :meth:`dnntune.Graph.validate` accepts, tagged
with what it covers::

    from dnntune.testing.conformance import generate_case

    case = generate_case(seed=0, index=7, size="small")
    case.op, case.dtype, case.layout, case.shape_class   # ("layernorm", "fp32", ...)
    graph = case.graph()                                 # a fresh dnntune.Graph

``size="small"`` keeps every case cheap enough for the CPU reference (CI); ``size="full"`` uses
near-realistic shapes for the GPU sweep (``benchmarks/conformance.py``). Wide rows (1 x 65536,
3 x 100003) and many short rows appear at both sizes: they are the shapes block-based kernels
get wrong.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dnntune.frontend import Graph
from dnntune.graph.types import DataType
from dnntune.testing._conformance_common import WIDE_ROWS
from dnntune.testing._conformance_dense import (
    _conv_dgrad,
    _conv_fprop,
    _conv_wgrad,
    _matmul,
    _sdpa,
)
from dnntune.testing._conformance_rows import (
    _batchnorm_backward,
    _batchnorm_inference,
    _batchnorm_training,
    _layernorm,
    _pointwise,
    _pooling,
    _reduction,
    _rmsnorm,
)

__all__ = [
    "DTYPES",
    "LAYOUTS",
    "OPS",
    "SHAPE_CLASSES",
    "SIZES",
    "WIDE_ROWS",
    "ConformanceCase",
    "build_case",
    "cell_of",
    "generate_case",
    "generate_cases",
    "layouts_for",
]

OPS = (
    "conv_fprop",
    "conv_dgrad",
    "conv_wgrad",
    "matmul",
    "sdpa",
    "layernorm",
    "rmsnorm",
    "batchnorm_training",
    "batchnorm_inference",
    "batchnorm_backward",
    "pooling",
    "reduction",
    "pointwise",
)
DTYPES = ("fp32", "fp16", "bf16")
SHAPE_CLASSES = ("tiny", "tail", "wide_row", "many_rows", "large")
LAYOUTS = ("contiguous", "channels_last", "transposed", "strided", "broadcast")
SIZES = ("small", "full")

_DTYPE = {"fp32": DataType.FLOAT, "fp16": DataType.HALF, "bf16": DataType.BFLOAT16}

_LAYOUTS: dict[str, tuple[str, ...]] = {
    "conv_fprop": ("contiguous", "channels_last", "strided", "broadcast"),
    "conv_dgrad": ("contiguous", "channels_last", "strided"),
    "conv_wgrad": ("contiguous", "channels_last", "strided"),
    "matmul": ("contiguous", "transposed", "strided", "broadcast"),
    "sdpa": ("contiguous", "transposed", "strided", "broadcast"),
    "layernorm": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
    "rmsnorm": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
    "batchnorm_training": ("contiguous", "channels_last", "strided"),
    "batchnorm_inference": ("contiguous", "channels_last", "strided", "broadcast"),
    "batchnorm_backward": ("contiguous", "channels_last"),
    "pooling": ("contiguous", "channels_last", "strided"),
    "reduction": ("contiguous", "channels_last", "transposed", "strided"),
    "pointwise": ("contiguous", "channels_last", "transposed", "strided", "broadcast"),
}


def layouts_for(op: str) -> tuple[str, ...]:
    """The layouts a case of ``op`` can have (channels-last only where a rank-4 tensor fits)."""
    return _LAYOUTS[op]


@dataclass(frozen=True)
class ConformanceCase:
    """One generated graph and what it covers."""

    seed: int
    index: int
    size: str
    op: str
    dtype: str
    layout: str
    shape_class: str
    #: the details drawn for this case (kernel, stride, groups, epilogue, mask...)
    detail: str
    #: the hipDNN graph JSON document, as text
    graph_json: str

    @property
    def name(self) -> str:
        where = f"c{self.index:05d}" if self.index >= 0 else f"s{self.seed}"
        return f"{where}_{self.op}_{self.dtype}_{self.layout}_{self.shape_class}"

    @property
    def cell(self) -> tuple[str, str, str]:
        """The (op, dtype, shape class) cell of the coverage matrix."""
        return (self.op, self.dtype, self.shape_class)

    def doc(self) -> dict[str, Any]:
        """The graph JSON document (a fresh dict)."""
        out: dict[str, Any] = json.loads(self.graph_json)
        return out

    def graph(self) -> Graph:
        """A fresh, validated :class:`dnntune.Graph` of this case."""

        g = Graph.from_json(self.graph_json)
        g.validate()
        return g

    def tags(self) -> dict[str, Any]:
        """Everything but the graph: what a results row names."""
        return {
            "seed": self.seed,
            "index": self.index,
            "size": self.size,
            "op": self.op,
            "dtype": self.dtype,
            "layout": self.layout,
            "shape_class": self.shape_class,
            "detail": self.detail,
            "name": self.name,
        }


_BUILDERS: dict[str, Callable[[random.Random, DataType, str, str, bool], tuple[Graph, str]]] = {
    "conv_fprop": _conv_fprop,
    "conv_dgrad": _conv_dgrad,
    "conv_wgrad": _conv_wgrad,
    "matmul": _matmul,
    "sdpa": _sdpa,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm_training": _batchnorm_training,
    "batchnorm_inference": _batchnorm_inference,
    "batchnorm_backward": _batchnorm_backward,
    "pooling": _pooling,
    "reduction": _reduction,
    "pointwise": _pointwise,
}


# ---- public entry points ------------------------------------------------------------------------
def build_case(
    op: str,
    dtype: str,
    shape_class: str,
    layout: str,
    *,
    seed: int = 0,
    index: int = -1,
    size: str = "small",
) -> ConformanceCase:
    """The case of one cell and layout; the details are drawn from ``(seed, index)``.

    Raises:
        ValueError: an unknown op, dtype, shape class, size, or a layout the op does not have.
    """
    if op not in _BUILDERS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if dtype not in _DTYPE:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if shape_class not in SHAPE_CLASSES:
        raise ValueError(f"unknown shape class {shape_class!r}; known: {', '.join(SHAPE_CLASSES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if layout not in _LAYOUTS[op]:
        raise ValueError(f"{op} has no {layout!r} layout; it has {', '.join(_LAYOUTS[op])}")
    rng = random.Random(f"dnntune-conformance/{seed}/{index}/{op}/{dtype}/{shape_class}/{layout}")
    graph, detail = _BUILDERS[op](rng, _DTYPE[dtype], shape_class, layout, size == "full")
    where = f"c{index:05d}" if index >= 0 else f"s{seed}"
    graph.name = f"{where}_{op}_{dtype}_{layout}_{shape_class}"
    graph.validate()
    return ConformanceCase(
        seed=seed,
        index=index,
        size=size,
        op=op,
        dtype=dtype,
        layout=layout,
        shape_class=shape_class,
        detail=detail,
        graph_json=graph.to_json(),
    )


def cell_of(index: int) -> tuple[str, str, str, str]:
    """(op, dtype, shape class, layout) of case ``index``: every cell within 195 indices."""
    op = OPS[index % len(OPS)]
    j = index // len(OPS)
    dtype = DTYPES[j % len(DTYPES)]
    shape_class = SHAPE_CLASSES[(j // len(DTYPES)) % len(SHAPE_CLASSES)]
    layouts = _LAYOUTS[op]
    layout = layouts[(j // (len(DTYPES) * len(SHAPE_CLASSES))) % len(layouts)]
    return op, dtype, shape_class, layout


def generate_case(seed: int, index: int, size: str = "small") -> ConformanceCase:
    """Case ``index`` of ``seed``: the same graph on every machine and every run."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    op, dtype, shape_class, layout = cell_of(index)
    return build_case(op, dtype, shape_class, layout, seed=seed, index=index, size=size)


def generate_cases(
    seed: int, count: int, size: str = "small", start: int = 0
) -> Iterator[ConformanceCase]:
    """Cases ``start .. start + count - 1`` of ``seed``."""
    for index in range(start, start + count):
        yield generate_case(seed, index, size)
