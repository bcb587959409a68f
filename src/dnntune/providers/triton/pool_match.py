"""The Triton pooling kernel's match: 2-D max/average pooling of channels-last tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import ResampleMode
from dnntune.providers.triton.expression import Operand, check_dtype, tensor_uid
from dnntune.providers.triton.match_base import Match, only_node

__all__ = ["PoolMatch", "match_pool"]


@dataclass
class PoolMatch(Match):
    """2-D pooling of channels-last data: ``x`` [n, c, h, w] to ``y`` [n, c, out_h, out_w].

    Operand strides are the (n, h, w) element strides; the channel stride is 1. ``padding`` is
    the pre-padding (top, left): the post-padding only decides ``out_h`` and ``out_w``.
    """

    mode: ResampleMode
    n: int
    c: int
    h: int
    w: int
    out_h: int
    out_w: int
    window: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    x: Operand
    y: Operand
    kernel = "pool"

    @property
    def is_global(self) -> bool:
        """The one window is the whole input: a reduction over h*w per (n, c)."""
        return (
            self.window == (self.h, self.w)
            and self.padding == (0, 0)
            and (self.out_h, self.out_w) == (1, 1)
        )

    @property
    def pixels(self) -> int:
        """Output pixels (n * out_h * out_w)."""
        return self.n * self.out_h * self.out_w

    def signature(self) -> dict[str, Any]:
        return {
            "mode": self.mode.json_name,
            "nchw": [self.n, self.c, self.h, self.w],
            "out": [self.out_h, self.out_w],
            "window": list(self.window),
            "stride": list(self.stride),
            "padding": list(self.padding),
            "x": [self.x.dtype.json_name, list(self.x.strides)],
            "y": [self.y.dtype.json_name, list(self.y.strides)],
        }


def _pair(node: Node, name: str, default: int) -> tuple[int, int]:
    value = node.params.get(name)
    if value is None:
        return (default, default)
    first, second = (int(v) for v in value)
    return (first, second)


def _nhwc_operand(t: TensorAttributes, where: str) -> Operand:
    """(n, h, w) strides of a channels-last 4-D tensor; refuses other layouts."""
    dtype = check_dtype(t, where)
    sn, sc, sh, sw = t.strides
    if t.dims[1] > 1 and sc != 1:
        raise NotSupportedError(
            f"{where}: dims {t.dims} strides {t.strides} are not channels-last (NHWC: the C "
            "stride must be 1); the Triton pooling kernel loads channels contiguously, "
            "TORCH_ENGINE runs other layouts"
        )
    return Operand(tensor_uid(t), dtype, (sn, sh, sw))


def match_pool(graph: OpGraph) -> PoolMatch:
    node = only_node(graph, (OpKind.RESAMPLE,), "a pooling", "pooling")
    where = f"resample {node.name!r}"
    x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
    assert x is not None and y is not None
    if len(x.dims) != 4:
        raise NotSupportedError(
            f"{where}: only 2-D pooling (4-D tensors) is supported, x has dims {x.dims}"
        )
    n, c, h, w = x.dims
    out_h, out_w = y.dims[2], y.dims[3]
    if n * out_h * out_w >= 2**31:
        raise NotSupportedError(
            f"{where}: {n * out_h * out_w} output pixels exceed the kernel's 32-bit pixel index"
        )
    return PoolMatch(
        mode=node.params["mode"],
        n=n,
        c=c,
        h=h,
        w=w,
        out_h=out_h,
        out_w=out_w,
        window=_pair(node, "window", 1),
        stride=_pair(node, "stride", 1),
        padding=_pair(node, "pre_padding", 0),
        x=_nhwc_operand(x, f"{where}: x_tensor_uid"),
        y=_nhwc_operand(y, f"{where}: y_tensor_uid"),
    )
