"""Rotary position embedding in its rotate-half form, one kernel a tensor.

``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)`` (``x1``, ``x2``
the two halves of the last dimension) is five kernels in eager PyTorch (a multiply, a
negation, a concatenation, a multiply and an add), each a pass over the tensor. Here one
program takes ``ROWS`` rows of ``x`` (its last dimension), reads both halves and the rows of
``cos`` and ``sin`` once, and writes

    out1 = x1 * cos1 - x2 * sin1,    out2 = x2 * cos2 + x1 * sin2

computed in float32 and rounded once (eager rounds after each of its three ops).

``x`` is ``[B, H, S, D]`` with any strides but a unit last one (the transposed view of a
projection's output, as attention takes it); ``cos`` and ``sin`` are ``[B or 1, S, R]``, ``R``
``D`` or, for a partial rotary, less (the columns from ``R`` on are copied).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rotate_half_embedding"]


@triton.jit
def _rotary(
    X, COS, SIN, OUT, n_rows, H, S, half, n_pass,
    sxb, sxh, sxs, scb, scs, ssb, sss, sob, soh, sos,
    ROWS: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, HALF)
    mask = (rows < n_rows)[:, None] & (cols < half)[None, :]
    b = rows // (H * S)
    h = (rows // S) % H
    s = rows % S
    x_at = (b * sxb + h * sxh + s * sxs)[:, None] + cols[None, :]
    c_at = (b * scb + s * scs)[:, None] + cols[None, :]
    s_at = (b * ssb + s * sss)[:, None] + cols[None, :]
    o_at = (b * sob + h * soh + s * sos)[:, None] + cols[None, :]
    x1 = tl.load(X + x_at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + x_at + half, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(COS + c_at, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + c_at + half, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + s_at, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + s_at + half, mask=mask, other=0.0).to(tl.float32)
    out = OUT.dtype.element_ty
    tl.store(OUT + o_at, (x1 * c1 - x2 * s1).to(out), mask=mask)
    tl.store(OUT + o_at + half, (x2 * c2 + x1 * s2).to(out), mask=mask)
    if PASS > 0:  # a partial rotary: the columns past the rotated ones are copied
        pcols = tl.arange(0, PASS)
        pmask = (rows < n_rows)[:, None] & (pcols < n_pass)[None, :]
        x_pass = (b * sxb + h * sxh + s * sxs)[:, None] + 2 * half + pcols[None, :]
        o_pass = (b * sob + h * soh + s * sos)[:, None] + 2 * half + pcols[None, :]
        tl.store(OUT + o_pass, tl.load(X + x_pass, mask=pmask), mask=pmask)


def rotate_half_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos[:, None] + rotate_half(x) * sin[:, None]`` for ``x`` of ``[B, H, S, D]`` and
    ``cos``, ``sin`` of ``[B or 1, S, R]`` (unit last strides, an even ``R``); where ``R`` is
    less than ``D`` (a partial rotary, Phi-3's and GPT-NeoX's), the first ``R`` columns are
    rotated and the rest copied. The output has ``x``'s layout (``empty_like``), as eager's
    has."""
    batch, heads, seq, dim = x.shape
    rotated = cos.shape[-1]
    half = rotated // 2
    out = torch.empty_like(x)
    n_rows = batch * heads * seq
    if n_rows == 0:
        return out
    width = triton.next_power_of_2(half)
    n_pass = dim - rotated
    passed = triton.next_power_of_2(n_pass) if n_pass else 0
    rows = max(1, min(32, 4096 // max(width, passed), triton.next_power_of_2(n_rows)))
    cb = cos.stride(0) if cos.shape[0] != 1 else 0
    sb = sin.stride(0) if sin.shape[0] != 1 else 0
    grid = (triton.cdiv(n_rows, rows),)
    _rotary[grid](
        x, cos, sin, out, n_rows, heads, seq, half, n_pass,
        x.stride(0), x.stride(1), x.stride(2), cb, cos.stride(1), sb, sin.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        ROWS=rows, HALF=width, PASS=passed,
    )  # fmt: skip
    return out
