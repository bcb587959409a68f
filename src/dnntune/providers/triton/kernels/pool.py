"""2-D max and average pooling of channels-last (NHWC) data, accumulated in fp32.

Windowed pooling: each program computes ``BLOCK_P`` output pixels x ``BLOCK_C`` channels; for
every window tap it loads a [pixels, channels] tile whose rows are contiguous runs of channels
(vector loads along C), masked where the tap falls in the padding. Small windows are unrolled.
Average pooling divides by the window size (padding included) or by each window's count of
real elements (padding excluded). Max pooling propagates NaN, as ATen and the reference do, and
writes no indices: eager's CUDA ``max_pool2d`` writes an int64 index per output as well.

Global pooling (the window is the whole input): each program reduces the h*w pixels of one
image for ``BLOCK_C`` channels, walking them ``BLOCK_HW`` at a time (one read of the input).
"""

from __future__ import annotations

import math
from typing import Any

import triton
import triton.language as tl

from dnntune.graph.types import ResampleMode
from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.patterns import PoolMatch
from dnntune.providers.triton.solvers import Config

__all__ = ["MAX_UNROLLED_WINDOW", "MODE_CODES", "PoolLauncher"]

#: constexpr mode codes of the kernels
MODE_CODES = {
    ResampleMode.MAXPOOL: 0,
    ResampleMode.AVGPOOL_INCLUDE_PADDING: 1,
    ResampleMode.AVGPOOL_EXCLUDE_PADDING: 2,
}
#: windows up to this many taps are unrolled; larger ones loop
MAX_UNROLLED_WINDOW = 64


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _tap(X, acc, x_pix, c, ih, iw, dh, dw, pmask, cmask, H, W, MODE: tl.constexpr):
    """Fold one window tap (input row ``ih``, column ``iw``, at ``dh + dw`` elements from the
    window's corner ``x_pix``) into ``acc``."""
    ok = pmask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    mask = ok[:, None] & cmask[None, :]
    ptrs = X + (x_pix + (dh + dw))[:, None] + c[None, :]
    if MODE == 0:
        v = tl.load(ptrs, mask=mask, other=float("-inf"))
        return _nan_max(acc, v.to(tl.float32))
    v = tl.load(ptrs, mask=mask, other=0.0)
    return acc + v.to(tl.float32)


@triton.jit
def _pool2d_nhwc(
    X, Y, P, C, H, W, OH, OW, sxn, sxh, sxw, syn, syh, syw,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, MODE: tl.constexpr, UNROLL: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pmask = p < P
    cmask = c < C
    ow = p % OW
    oh = (p // OW) % OH
    n = (p // OW // OH).to(tl.int64)
    hs = oh * SH - PH
    ws = ow * SW - PW
    # the window's top-left corner (it may lie in the padding: those taps are masked)
    x_pix = n * sxn + hs.to(tl.int64) * sxh + ws.to(tl.int64) * sxw
    if MODE == 0:
        acc = tl.full([BLOCK_P, BLOCK_C], float("-inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    if UNROLL:
        for kh in tl.static_range(KH):
            for kw in tl.static_range(KW):
                acc = _tap(
                    X, acc, x_pix, c, hs + kh, ws + kw, kh * sxh, kw * sxw, pmask, cmask, H, W,
                    MODE,
                )  # fmt: skip
    else:
        for kh in range(KH):
            for kw in range(KW):
                acc = _tap(
                    X, acc, x_pix, c, hs + kh, ws + kw, kh * sxh, kw * sxw, pmask, cmask, H, W,
                    MODE,
                )  # fmt: skip
    if MODE == 1:
        acc = acc / (KH * KW)
    elif MODE == 2:
        rows = tl.minimum(hs + KH, H) - tl.maximum(hs, 0)
        cols = tl.minimum(ws + KW, W) - tl.maximum(ws, 0)
        acc = acc / (rows * cols).to(tl.float32)[:, None]
    y_pix = n * syn + oh.to(tl.int64) * syh + ow.to(tl.int64) * syw
    mask = pmask[:, None] & cmask[None, :]
    tl.store(Y + y_pix[:, None] + c[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _global_pool_nhwc(
    X, Y, C, HW, W, sxn, sxh, sxw, syn,
    MODE: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    x_img = X + n * sxn
    if MODE == 0:
        acc = tl.full([BLOCK_HW, BLOCK_C], float("-inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK_HW, BLOCK_C], tl.float32)
    for start in range(0, HW, BLOCK_HW):
        hw = start + tl.arange(0, BLOCK_HW)
        pix = (hw // W).to(tl.int64) * sxh + (hw % W).to(tl.int64) * sxw
        mask = (hw < HW)[:, None] & cmask[None, :]
        ptrs = x_img + pix[:, None] + c[None, :]
        if MODE == 0:
            v = tl.load(ptrs, mask=mask, other=float("-inf"))
            acc = _nan_max(acc, v.to(tl.float32))
        else:
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:
        out = tl.reduce(acc, 0, _nan_max)
    else:
        out = tl.sum(acc, axis=0) / HW
    tl.store(Y + n * syn + c, out.to(Y.dtype.element_ty), mask=cmask)


class PoolLauncher(OneKernel):
    """One plan's launch of ``_pool2d_nhwc`` or, for global pooling, ``_global_pool_nhwc``."""

    def __init__(self, match: PoolMatch, config: Config) -> None:
        self.uids = [match.x.uid, match.y.uid]
        block_m, block_n = config["block_m"], config["block_n"]
        (sxn, sxh, sxw), (syn, syh, syw) = match.x.strides, match.y.strides
        channel_blocks = max(1, math.ceil(match.c / block_n))
        mode = MODE_CODES[match.mode]
        if match.is_global:
            self.scalars: tuple[int, ...] = (
                match.c, match.h * match.w, match.w, sxn, sxh, sxw, syn,
            )  # fmt: skip
            meta: dict[str, Any] = {"MODE": mode, "BLOCK_HW": block_m, "BLOCK_C": block_n}
            kernel, grid = _global_pool_nhwc, (match.n, channel_blocks)
        else:
            kh, kw = match.window
            self.scalars = (
                match.pixels, match.c, match.h, match.w, match.out_h, match.out_w,
                sxn, sxh, sxw, syn, syh, syw,
            )  # fmt: skip
            meta = {
                "KH": kh,
                "KW": kw,
                "SH": match.stride[0],
                "SW": match.stride[1],
                "PH": match.padding[0],
                "PW": match.padding[1],
                "MODE": mode,
                "UNROLL": kh * kw <= MAX_UNROLLED_WINDOW,
                "BLOCK_P": block_m,
                "BLOCK_C": block_n,
            }
            kernel, grid = _pool2d_nhwc, (max(1, math.ceil(match.pixels / block_m)), channel_blocks)
        meta["num_warps"] = config["num_warps"]
        super().__init__(kernel, grid, meta, self.uids, self.scalars)
