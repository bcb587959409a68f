"""LayerNorm and RMSNorm forward: ``block_m`` rows per program, statistics in fp32.

When ``block_n`` covers the row, the row is read once and kept in registers (one read, one
write: the bandwidth floor). Longer rows are walked in ``block_n`` chunks: layernorm takes three
passes (mean, centred variance, output), rmsnorm two, so the variance never suffers the
cancellation of ``E[x^2] - E[x]^2``. Training phase also stores the per-row statistics, and
only then (they are outputs of the graph or nothing).

Memory-bound details: when the rows fill whole programs and the row is exactly ``block_n`` wide
(the common power-of-two hidden sizes), loads and stores carry no mask, so their 16-byte vector
width never depends on Triton's divisibility specialization of ``N``; the streamed rows are
marked evict-first and the scale and bias, which every program reads, evict-last, so the
weights stay in L2. Statistics and the output are computed in float32.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from dnntune.graph.node import OpKind
from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.patterns import NormMatch
from dnntune.providers.triton.solvers import Config

__all__ = ["NormLauncher"]


@triton.jit
def _norm_fwd(
    X, Y, W, B, MEAN, RSTD,
    M, N, sxm, sym, smean, srstd, eps,
    IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MEAN: tl.constexpr,
    HAS_RSTD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    x_row = X + rows64[:, None] * sxm
    y_row = Y + rows64[:, None] * sym
    if SINGLE:
        # The row is read once and kept in registers: one read, one write.
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        if EVEN_M and EVEN_N:  # no mask at all: full-width vector loads and stores
            x = tl.load(x_row + cols[None, :], eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        x = x.to(tl.float32)
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            xc = x
        else:
            mean = tl.sum(x, axis=1) / N
            xc = x - mean[:, None]
            if not EVEN_N:  # padding columns must not count in the variance
                xc = tl.where(cmask[None, :], xc, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
        # scale and bias are read by every program: keep them in L2
        if EVEN_N:
            w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
        else:
            w = tl.load(W + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
            w = w.to(tl.float32)
        y = xc * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            if EVEN_N:
                b = tl.load(B + cols, eviction_policy="evict_last")
            else:
                b = tl.load(B + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
            y += b.to(tl.float32)[None, :]
        if EVEN_M and EVEN_N:
            tl.store(y_row + cols[None, :], y.to(Y.dtype.element_ty), eviction_policy="evict_first")
        else:
            tl.store(
                y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask,
                eviction_policy="evict_first",
            )  # fmt: skip
    else:
        # Chunked: the statistics passes leave the row in L2 (evict_last) for the output pass.
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        else:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = rmask[:, None] & (cols < N)[None, :]
                x = tl.load(
                    x_row + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last"
                )
                total += x.to(tl.float32)
            mean = tl.sum(total, axis=1) / N
        squares = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            x = tl.load(x_row + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
            xc = tl.where(mask, x.to(tl.float32) - mean[:, None], 0.0)
            squares += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            x = tl.load(x_row + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
            w = tl.load(W + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
            y = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * w.to(tl.float32)[None, :]
            if HAS_BIAS:
                b = tl.load(B + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
                y += b.to(tl.float32)[None, :]
            tl.store(
                y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask,
                eviction_policy="evict_first",
            )  # fmt: skip
    # training statistics only when the graph has them as outputs
    if HAS_MEAN:
        tl.store(MEAN + rows64 * smean, mean.to(MEAN.dtype.element_ty), mask=rmask)
    if HAS_RSTD:
        tl.store(RSTD + rows64 * srstd, rstd.to(RSTD.dtype.element_ty), mask=rmask)


class NormLauncher(OneKernel):
    """One plan's launch of ``_norm_fwd`` with everything but the buffers fixed."""

    def __init__(self, match: NormMatch, config: Config) -> None:
        self.uids = [
            match.x.uid,
            match.y.uid,
            match.scale.uid,
            match.bias.uid if match.bias else match.scale.uid,
            match.mean.uid if match.mean else match.x.uid,
            match.rstd.uid if match.rstd else match.x.uid,
        ]
        block_m, block_n = config["block_m"], config["block_n"]
        self.scalars = (
            match.rows,
            match.n,
            match.x.strides[0],
            match.y.strides[0],
            match.mean.strides[0] if match.mean else 0,
            match.rstd.strides[0] if match.rstd else 0,
            match.epsilon,
        )
        meta = {
            "IS_RMS": match.op is OpKind.RMSNORM,
            "HAS_BIAS": match.bias is not None,
            "HAS_MEAN": match.mean is not None,
            "HAS_RSTD": match.rstd is not None,
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "SINGLE": block_n >= match.n,
            "EVEN_M": match.rows % block_m == 0,
            "EVEN_N": match.n % block_n == 0,
            "num_warps": config["num_warps"],
        }
        super().__init__(
            _norm_fwd, (max(1, math.ceil(match.rows / block_m)),), meta, self.uids, self.scalars
        )
