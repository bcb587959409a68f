"""Solvers of the NHWC pixel x channel kernels: pooling and batch-norm inference. Each program
takes ``block_m`` pixels x ``block_n`` channels; the spaces are sized by bytes in
:mod:`.pool_configs` and :mod:`.batchnorm_configs`."""

from __future__ import annotations

import math

from dnntune.providers.triton import batchnorm_configs, pool_configs
from dnntune.providers.triton.batchnorm_match import BatchnormMatch
from dnntune.providers.triton.patterns import Match, PoolMatch
from dnntune.providers.triton.solver_base import Config, DeviceLimits, Solver, Violation, _pow2

__all__ = ["BatchnormSolver", "PoolSolver"]


# ---- pooling --------------------------------------------------------------------------------
class PoolSolver(Solver):
    """NHWC pooling: ``block_m`` pixels x ``block_n`` channels per program (a global pool:
    ``block_m`` input pixels per step of its walk over h*w). The default and the space are
    :func:`~.pool_configs.pool_prior` and :func:`~.pool_configs.pool_space`."""

    kernel = "pool"
    values = {
        "block_m": tuple(_pow2(1, pool_configs.MAX_BLOCK_M)),
        "block_n": tuple(sorted(pool_configs.CHANNEL_BLOCKS)),
        "num_warps": (1, 2, 4, 8),
    }
    #: the most channel blocks a launch may have (CUDA's grid limit on its second axis)
    max_channel_blocks = 65535

    @staticmethod
    def _problem(match: Match) -> tuple[int, int, int, bool]:
        assert isinstance(match, PoolMatch)
        rows = match.h * match.w if match.is_global else match.pixels
        return match.c, rows, match.x.dtype.itemsize, match.is_global

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        return pool_configs.pool_prior(*self._problem(match))

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        return pool_configs.pool_space(*self._problem(match))

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        channels = self._problem(match)[0]
        return _pixel_block_violation(
            config, channels, pool_configs.MAX_VALUES_PER_THREAD, self.max_channel_blocks
        )


def _pixel_block_violation(
    config: Config, channels: int, most: int, max_channel_blocks: int
) -> Violation | None:
    """The register and grid limits of a ``block_m`` pixels x ``block_n`` channels program
    (the NHWC pooling and batch-norm kernels)."""
    bm, bn, warps = config["block_m"], config["block_n"], config["num_warps"]
    per_thread = bm * bn / (32 * warps)
    if per_thread > most:
        return Violation(
            ("num_warps", "block_m", "block_n"),
            f"{bm} pixel(s) x {bn} channels over {warps} warps is {per_thread:g} values per "
            f"thread (more than {most}: the registers spill); use more warps or a smaller block",
        )
    if per_thread < 1:
        return Violation(
            ("num_warps",), f"{warps} warps for {bm}x{bn} values leaves threads without work"
        )
    if math.ceil(channels / bn) > max_channel_blocks:
        return Violation(
            ("block_n",),
            f"{channels} channels in blocks of {bn} exceed {max_channel_blocks} programs on the "
            "grid's second axis; use a larger block",
        )
    return None


# ---- batch norm -----------------------------------------------------------------------------
class BatchnormSolver(Solver):
    """NHWC batch-norm inference: ``block_m`` pixels x ``block_n`` channels per program. The
    default and the space are :func:`~.batchnorm_configs.bn_prior` and
    :func:`~.batchnorm_configs.bn_space` (sized by bytes)."""

    kernel = "batchnorm"
    values = {
        "block_m": tuple(_pow2(1, batchnorm_configs.MAX_BLOCK_P)),
        "block_n": tuple(_pow2(1, batchnorm_configs.MAX_BLOCK_C)),
        "num_warps": tuple(_pow2(1, batchnorm_configs.MAX_WARPS)),
    }
    #: the most channel blocks a launch may have (CUDA's grid limit on its second axis)
    max_channel_blocks = 65535

    @staticmethod
    def _problem(match: Match, limits: DeviceLimits) -> tuple[int, int, int, int]:
        assert isinstance(match, BatchnormMatch)
        return match.pixels, match.channels, match.x.dtype.itemsize, limits.sm_count

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        return batchnorm_configs.bn_prior(*self._problem(match, limits))

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        return batchnorm_configs.bn_space(*self._problem(match, limits))

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        channels = self._problem(match, limits)[1]
        return _pixel_block_violation(
            config, channels, batchnorm_configs.MAX_VALUES_PER_THREAD, self.max_channel_blocks
        )
