"""Reductions over the last dim: add, avg, max, min, amax, norm1, norm2 (fp32 accumulation).

``block_m`` rows per program; each row is walked in ``block_n`` chunks that are combined
elementwise, then reduced across the chunk once at the end (one read of the input).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from dnntune.graph.types import ReductionMode
from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.patterns import ReductionMatch
from dnntune.providers.triton.solvers import Config

__all__ = ["MODE_CODES", "ReductionLauncher"]

#: constexpr op codes of ``_row_reduce``
MODE_CODES = {
    ReductionMode.ADD: 0,
    ReductionMode.AVG: 1,
    ReductionMode.MAX: 2,
    ReductionMode.MIN: 3,
    ReductionMode.AMAX: 4,
    ReductionMode.NORM1: 5,
    ReductionMode.NORM2: 6,
}


@triton.jit
def _row_reduce(
    X, Y, M, N, sxm, sxn, sym,
    MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    if MODE == 2:
        init = float("-inf")
    elif MODE == 3:
        init = float("inf")
    else:
        init = 0.0
    acc = tl.full([BLOCK_M, BLOCK_N], init, dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < N)[None, :]
        x = tl.load(X + rows64[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0)
        x = x.to(tl.float32)
        if MODE == 2:
            acc = tl.maximum(acc, tl.where(mask, x, init))
        elif MODE == 3:
            acc = tl.minimum(acc, tl.where(mask, x, init))
        elif MODE == 4:
            acc = tl.maximum(acc, tl.abs(x))
        elif MODE == 5:
            acc += tl.abs(x)
        elif MODE == 6:
            acc += x * x
        else:
            acc += x
    if MODE == 2 or MODE == 4:
        out = tl.max(acc, axis=1)
    elif MODE == 3:
        out = tl.min(acc, axis=1)
    else:
        out = tl.sum(acc, axis=1)
    if MODE == 1:
        out = out / N
    if MODE == 6:
        out = tl.sqrt(out)
    tl.store(Y + rows64 * sym, out.to(Y.dtype.element_ty), mask=rmask)


class ReductionLauncher(OneKernel):
    """One plan's launch of ``_row_reduce``."""

    def __init__(self, match: ReductionMatch, config: Config) -> None:
        self.uids = [match.x.uid, match.y.uid]
        self.scalars = (
            match.rows,
            match.n,
            match.x.strides[0],
            match.x.strides[1],
            match.y.strides[0],
        )
        meta = {
            "MODE": MODE_CODES[match.mode],
            "BLOCK_M": config["block_m"],
            "BLOCK_N": config["block_n"],
            "num_warps": config["num_warps"],
        }
        grid = (max(1, math.ceil(match.rows / config["block_m"])),)
        super().__init__(_row_reduce, grid, meta, self.uids, self.scalars)
