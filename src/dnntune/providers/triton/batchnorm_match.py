"""Which batch-norm graphs the NHWC batch-norm kernel runs, and why it declines the others.

The IR's ``batchnorm_inference`` node computes, per channel c,
``y = (x - mean[c]) * inv_variance[c] * scale[c] + bias[c]``: the statistics arrive as a mean
and an inverse standard deviation (epsilon is already folded in by whoever computed them).
The kernel takes channels-last data (the C stride is 1, every other dim flattens to one pixel
stride), so it sees ``x`` as a [pixels, channels] matrix with contiguous rows. Pointwise nodes
after the batch norm (a ReLU, a residual add...) fuse as an epilogue over the same matrix.
Training-mode batch norm (batch statistics) and its backward pass are declined. Pure Python:
no triton, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.providers.triton.expression import (
    Elementwise,
    Operand,
    build_elementwise,
    check_dtype,
    group_stride,
    tensor_uid,
)
from dnntune.providers.triton.kernels.codegen import op_expr
from dnntune.providers.triton.match_base import Match, only_kinds

__all__ = ["STAT_FIELDS", "BatchnormMatch", "decline_batchnorm_training", "match_batchnorm"]

#: the per-channel inputs of a batchnorm_inference node, in the kernel's argument order
STAT_FIELDS = ("mean_tensor_uid", "inv_variance_tensor_uid", "scale_tensor_uid", "bias_tensor_uid")


@dataclass
class BatchnormMatch(Match):
    """Batch-norm inference over ``pixels`` x ``channels`` of channels-last data.

    ``x`` and every epilogue operand carry (pixel, channel) element strides; the statistics
    (``stats``: mean, inv_variance, scale, bias) carry their channel stride. ``epilogue`` runs
    on the normalized value ``acc`` and stores every graph output (``y`` itself when it is not
    virtual) over the same (pixels, channels) space.
    """

    pixels: int
    channels: int
    x: Operand
    stats: tuple[Operand, Operand, Operand, Operand]
    epilogue: Elementwise
    kernel = "batchnorm"

    def signature(self) -> dict[str, Any]:
        return {
            "pixels": self.pixels,
            "channels": self.channels,
            "x": [self.x.dtype.json_name, list(self.x.strides)],
            "stats": [[o.dtype.json_name, list(o.strides)] for o in self.stats],
            "epilogue": self.epilogue.signature(),
        }


def _pixel_channel(dims: Sequence[int], strides: Sequence[int], where: str) -> tuple[int, int]:
    """(pixel stride, channel stride) of a tensor over [N, C, spatial...]; refuses layouts
    whose non-channel dims do not flatten to one stride, or that are not channels-last."""
    pixel_dims, pixel_strides = [dims[0], *dims[2:]], [strides[0], *strides[2:]]
    channel = strides[1] if dims[1] != 1 else 0
    varies = any(d != 1 and s != 0 for d, s in zip(pixel_dims, pixel_strides, strict=True))
    if varies and channel not in (0, 1):
        raise NotSupportedError(
            f"{where}: dims {list(dims)} strides {list(strides)} are not channels-last (NHWC: "
            "the C stride must be 1); the Triton batch-norm kernel loads channels "
            "contiguously, TORCH_ENGINE runs other layouts"
        )
    pixel = group_stride(pixel_dims, pixel_strides)
    if pixel is None:
        raise NotSupportedError(
            f"{where}: dims {list(dims)} strides {list(strides)}: the batch and spatial dims do "
            "not flatten to one pixel stride; the Triton batch-norm kernel needs packed "
            "channels-last (NHWC) data, TORCH_ENGINE runs other layouts"
        )
    return pixel, channel


def _stat(t: TensorAttributes, where: str) -> Operand:
    if t.is_virtual:
        raise NotSupportedError(
            f"{where}: is computed inside the graph; the batch-norm kernel reads its "
            "per-channel inputs from memory (no prologue fuses)"
        )
    stride = group_stride(t.dims, t.strides)
    if stride is None:
        raise NotSupportedError(
            f"{where}: dims {t.dims} strides {t.strides} do not flatten to one channel stride"
        )
    return Operand(tensor_uid(t), check_dtype(t, where), (stride,))


def match_batchnorm(graph: OpGraph) -> BatchnormMatch:
    """The match of a batchnorm_inference node plus any pointwise epilogue."""
    what = "a batchnorm_inference[+pointwise epilogue]"
    nodes = only_kinds(graph, (OpKind.BATCHNORM_INFERENCE, OpKind.POINTWISE), what)
    bns = [n for n in nodes if n.kind is OpKind.BATCHNORM_INFERENCE]
    if len(bns) != 1:
        raise NotSupportedError(f"graph is not {what}: it has {len(bns)} batch norms")
    bn = bns[0]
    where = f"batchnorm_inference {bn.name!r}"
    x, y = bn.inputs["x_tensor_uid"], bn.outputs["y_tensor_uid"]
    assert x is not None and y is not None
    if x.is_virtual:
        raise NotSupportedError(
            f"{where}: x_tensor_uid is computed by a pointwise node before the batch norm (a "
            "prologue), which does not fuse"
        )
    xdt = check_dtype(x, f"{where}: x_tensor_uid")
    xo = Operand(tensor_uid(x), xdt, _pixel_channel(x.dims, x.strides, f"{where}: x_tensor_uid"))
    pixels = x.numel // x.dims[1]
    if pixels >= 2**31:
        raise NotSupportedError(f"{where}: {pixels} pixels exceed the kernel's 32-bit pixel index")
    stats = tuple(_stat(bn.inputs[f], f"{where}: {f}") for f in STAT_FIELDS)  # type: ignore[arg-type]
    space = list(x.dims)
    rest = [n for n in nodes if n is not bn]
    ew = build_elementwise(graph, rest, space, {id(y): "acc"}, "the batch-norm epilogue")
    for op in ew.ops:
        op_expr(op)  # a mode without a Triton lowering is declined here, not at build time
    if not y.is_virtual:
        ydt = check_dtype(y, f"{where}: y_tensor_uid")
        ew.outputs.insert(0, ("acc", Operand(tensor_uid(y), ydt, tuple(y.strides))))

    def collapse(o: Operand, what: str) -> Operand:
        return Operand(o.uid, o.dtype, _pixel_channel(space, o.strides, what))

    ew.inputs = [collapse(o, f"epilogue input uid {o.uid}") for o in ew.inputs]
    ew.outputs = [(n, collapse(o, f"output uid {o.uid}")) for n, o in ew.outputs]
    ew.space = (pixels, x.dims[1])
    return BatchnormMatch(
        pixels=pixels,
        channels=x.dims[1],
        x=xo,
        stats=stats,  # type: ignore[arg-type]
        epilogue=ew,
    )


def decline_batchnorm_training(graph: OpGraph) -> Match:
    """Training-mode batch norm and its backward pass: no Triton kernel (always raises)."""
    kind = graph.core_node().kind
    raise NotSupportedError(
        f"no Triton kernel for {kind.value}: the Triton batch-norm kernel runs inference only "
        "(batchnorm_inference with given mean and inv_variance); batch statistics and the "
        "backward pass run on TORCH_ENGINE or CUDNN_ENGINE"
    )
