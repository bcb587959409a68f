"""The attention kernel's config space (:mod:`.kernels.attention`). Pure Python.

``block_m`` query rows per program, ``block_n`` keys per step of the online softmax, the key
and value loads pipelined over ``num_stages``. The kernel is offered for windows (at most
:data:`~dnntune.providers.triton.attention_match.MAX_KEYS` keys), many small problems: small
tiles by default, many programs a multiprocessor; a head wider than 64 channels takes 64-row
blocks (registers).
"""

from __future__ import annotations

from dnntune.providers.triton.attention_match import AttentionMatch
from dnntune.providers.triton.match_base import Match
from dnntune.providers.triton.solver_base import (
    MAX_ACC_PER_THREAD,
    Config,
    DeviceLimits,
    Solver,
    Violation,
    next_pow2,
)

__all__ = ["AttentionSolver"]

_ELEMENT_BYTES = 4  # the shared-memory estimate's element size: fp32 covers every input type


def _head_block(match: AttentionMatch) -> int:
    return max(16, next_pow2(match.d))


def _per_thread(block_m: int, block_n: int, block_d: int, warps: int) -> float:
    """fp32 values one thread holds: the accumulator, the scores and their exponentials."""
    return (block_m * block_d + 2 * block_m * block_n) / (32 * warps)


class AttentionSolver(Solver):
    kernel = "attention"
    values = {
        "block_m": (16, 32, 64, 128),
        "block_n": (16, 32, 64, 128),
        "num_warps": (1, 2, 4, 8),
        "num_stages": (1, 2, 3, 4),
    }

    @staticmethod
    def _attn(match: Match) -> AttentionMatch:
        assert isinstance(match, AttentionMatch)
        return match

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        m = self._attn(match)
        bd = _head_block(m)
        if bd <= 64:
            # small tiles, more programs a multiprocessor. Swin-T's windows (49 keys of 32
            # channels, H100, session 48): 32x32 over 2 warps, 2 stages, 92-99 µs a call at
            # batch 32 where 64x64 over 4 warps in one pass took 225-242 µs (cuDNN's flash
            # kernel through PyTorch 339-358, PyTorch's memory-efficient kernel 114-162)
            block_m = min(32, max(16, next_pow2(m.sq)))
            block_n = min(32, max(16, next_pow2(m.skv)))
            return {
                "block_m": block_m,
                "block_n": block_n,
                "num_warps": 2,
                "num_stages": 1 if m.skv <= block_n else 2,
            }
        block_m = min(64, max(16, next_pow2(m.sq)))
        block_n = min(64, max(16, next_pow2(m.skv)))
        warps = 4
        while warps < 8 and _per_thread(block_m, block_n, bd, warps) > MAX_ACC_PER_THREAD:
            warps *= 2  # the accumulator and scores over more threads
        return {
            "block_m": block_m,
            "block_n": block_n,
            "num_warps": warps,
            "num_stages": 1 if m.skv <= block_n else 2,
        }

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        m = self._attn(match)
        return [  # best guesses first: small tiles (the default's reasoning)
            {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}
            for bm in (32, 16, 64)
            for bn in (32, 16, 64)
            for w in (2, 1, 4, 8)
            for st in ((1,) if m.skv <= bn else (2, 3))
        ]

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        m = self._attn(match)
        bm, bn, warps = config["block_m"], config["block_n"], config["num_warps"]
        bd = _head_block(m)
        per_thread = _per_thread(bm, bn, bd, warps)
        if per_thread > MAX_ACC_PER_THREAD:
            return Violation(
                ("block_m", "block_n", "num_warps"),
                f"{bm}x{bd} accumulator and {bm}x{bn} scores over {warps} warps is "
                f"{per_thread:g} fp32 values per thread (more than {MAX_ACC_PER_THREAD}); use "
                "smaller blocks or more warps",
            )
        smem = (bm + 2 * bn * config["num_stages"]) * bd * _ELEMENT_BYTES
        if smem > limits.smem_per_block:
            return Violation(
                ("block_n", "num_stages"),
                f"needs about {smem} bytes of shared memory, more than the device's "
                f"{limits.smem_per_block}; use fewer stages or a smaller block_n",
            )
        if bm > max(16, next_pow2(m.sq)):
            return Violation(("block_m",), f"block_m {bm} exceeds the {m.sq} query rows")
        return None
