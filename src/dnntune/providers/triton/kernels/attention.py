"""Scaled dot-product attention forward: one program per ``block_m`` query rows of one
(batch, head), the keys walked in ``block_n`` chunks with an online softmax (flash attention's
loop), the scores and their running statistics in float32.

Made for the attention the fused library kernels serve badly: short sequences with an additive
mask (a Swin window: 49 tokens of 32 channels, a relative position bias and a shift mask; on an
H100 cuDNN's flash kernel took 114 µs a call of Swin-T's, where the whole problem reads about
40 MB). A sequence that fits one chunk is one pass: scores, mask, softmax and the product with
the values, every operand read once.

The mask is read through its own strides (0 on a broadcast dimension), additive (added to the
scaled scores) or boolean (False drops the key); causal masking, top-left or bottom-right, is
computed from the indices. Grouped-query heads read key/value head ``h // group``. A row whose
every key is dropped gives 0, as the reference and flash kernels do. Scores are kept in log2
units (``exp2``), the scale and an additive mask multiplied by log2(e).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.patterns import AttentionMatch
from dnntune.providers.triton.solvers import Config

__all__ = ["AttentionLauncher"]

_LOG2E = 1.4426950408889634


@triton.jit
def _attention_fwd(
    Q, K, V, MASK, OUT,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, smb, smh, sms, smt, sob, soh, sos,
    H, GROUP, SQ, SKV, qk_scale, causal_offset,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    # one axis of programs (2^31 of them; a second axis takes only 65535: Swin-T's windows
    # x heads pass that at a batch of 342), the query blocks of one (batch, head) adjacent,
    # so that they read its keys and values while they are in L2
    blocks = tl.cdiv(SQ, BLOCK_M)
    pid = tl.program_id(0)
    pid_bh = pid // blocks
    pid_m = pid % blocks
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    rmask = rows < SQ
    rows64 = rows.to(tl.int64)  # a row's offset may pass 2^31 elements
    dmask = dims < D
    q = tl.load(
        Q + b * sqb + h * sqh + rows64[:, None] * sqs + dims[None, :],
        mask=rmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_base = MASK + b * smb + h * smh + rows64[:, None] * sms
    for start in range(0, SKV, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < SKV
        cols64 = cols.to(tl.int64)
        k = tl.load(
            k_base + cols64[:, None] * sks + dims[None, :],
            mask=cmask[:, None] & dmask[None, :],
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale
        valid = rmask[:, None] & cmask[None, :]
        if MASK_KIND == 1:  # additive
            add = tl.load(m_base + cols64[None, :] * smt, mask=valid, other=0.0)
            s = s + add.to(tl.float32) * 1.4426950408889634
        if MASK_KIND == 2:  # boolean: False drops the key
            keep = tl.load(m_base + cols64[None, :] * smt, mask=valid, other=0)
            valid = valid & (keep != 0)
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None] + causal_offset)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key kept yet: no NaN
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_base + cols64[:, None] * svs + dims[None, :],
            mask=cmask[:, None] & dmask[None, :],
            other=0.0,
        )
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = tl.where(l_i[:, None] > 0.0, acc / l_i[:, None], 0.0)  # every key dropped: 0
    tl.store(
        OUT + b * sob + h * soh + rows64[:, None] * sos + dims[None, :],
        out.to(OUT.dtype.element_ty),
        mask=rmask[:, None] & dmask[None, :],
    )


class AttentionLauncher(OneKernel):
    """One plan's launch of ``_attention_fwd`` with everything but the buffers fixed."""

    def __init__(self, match: AttentionMatch, config: Config) -> None:
        mask = match.mask
        self.uids = [
            match.q.uid,
            match.k.uid,
            match.v.uid,
            mask.uid if mask is not None else match.q.uid,
            match.o.uid,
        ]
        block_m, block_n = config["block_m"], config["block_n"]
        self.scalars = (
            *match.q.strides[:3],  # (batch, head, row): the channels are contiguous
            *match.k.strides[:3],
            *match.v.strides[:3],
            *(mask.strides if mask is not None else (0, 0, 0, 0)),  # (batch, head, row, key)
            *match.o.strides[:3],
            match.heads,
            match.group,
            match.sq,
            match.skv,
            match.scale * _LOG2E,
            match.causal_offset,
        )
        meta = {
            "D": match.d,
            "BLOCK_D": max(16, 1 << (match.d - 1).bit_length()),
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "MASK_KIND": 0 if mask is None else (2 if match.mask_is_bool else 1),
            "CAUSAL": match.causal,
            "IEEE": match.ieee,
            "num_warps": config["num_warps"],
            "num_stages": config["num_stages"],
        }
        grid = (max(1, match.batch * match.heads * math.ceil(match.sq / block_m)),)
        super().__init__(_attention_fwd, grid, meta, self.uids, self.scalars)
