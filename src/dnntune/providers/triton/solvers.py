"""Solvers: each kernel's config space, its constraints and its default config per shape.

The analogue of MIOpen's solvers: a config is a dict of the kernel's parameters (``block_m``,
``num_warps``...), advertised as ``triton.<name>`` knobs whose value 0 means "auto" (the perf-db
record, the search winner or the default heuristic). A non-zero knob value pins the parameter:
the search then only varies the others, and the perf db keys its records by the pins.

Constraints reject configs that cannot fit the device (shared memory per block, registers per
thread, workspace limit) before anything is compiled; ``check`` says which knob to change.
Pure Python: everything here runs without a GPU.
"""

from __future__ import annotations

import math

from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType
from dnntune.graph.types import DataType
from dnntune.providers.triton.patterns import (
    Match,
    MatmulMatch,
    NormMatch,
    PointwiseMatch,
    ReductionMatch,
)
from dnntune.providers.triton.row_configs import row_prior, row_space
from dnntune.providers.triton.solver_base import (
    _DESCRIPTIONS,
    KNOB_PREFIX,
    MAX_ACC_PER_THREAD,
    MAX_CANDIDATES,
    MAX_ROW_VALUES_PER_THREAD,
    Config,
    DeviceLimits,
    Solver,
    Violation,
    _pow2,
    device_limits,
    next_pow2,
)
from dnntune.providers.triton.solvers_attention import AttentionSolver
from dnntune.providers.triton.solvers_nhwc import BatchnormSolver, PoolSolver

__all__ = [
    "KNOB_PREFIX",
    "MAX_CANDIDATES",
    "AttentionSolver",
    "BatchnormSolver",
    "Config",
    "DeviceLimits",
    "MatmulSolver",
    "NormSolver",
    "PointwiseSolver",
    "PoolSolver",
    "ReductionSolver",
    "Solver",
    "Violation",
    "all_solver_knobs",
    "device_limits",
    "next_pow2",
    "solver_for",
]


# ---- matmul ---------------------------------------------------------------------------------
class MatmulSolver(Solver):
    kernel = "matmul"
    values = {
        "block_m": (16, 32, 64, 128, 256),
        "block_n": (16, 32, 64, 128, 256),
        "block_k": (16, 32, 64, 128, 256),
        "num_warps": (1, 2, 4, 8, 16),
        "num_stages": (1, 2, 3, 4, 5, 6, 7),
        "group_m": (1, 2, 4, 8, 16, 32),
        "split_k": (1, 2, 4, 8, 16, 32),
    }

    @staticmethod
    def _mm(match: Match) -> MatmulMatch:
        assert isinstance(match, MatmulMatch)
        return match

    @staticmethod
    def _split_for(m: MatmulMatch, bm: int, bn: int, bk: int, limits: DeviceLimits) -> int:
        """Smallest split that gives every SM a program, keeping >= 4 K tiles per split."""
        tiles = math.ceil(m.m / bm) * math.ceil(m.n / bn) * m.batch
        k_tiles = math.ceil(m.k / bk)
        split = 1
        while tiles * split < limits.sm_count and k_tiles // (split * 2) >= 4 and split < 16:
            split *= 2
        return split

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        m = self._mm(match)
        fp32 = m.dtype is DataType.FLOAT
        if m.m <= 64:
            bm, bn, bk, warps, stages = max(16, next_pow2(m.m)), 64, 32 if fp32 else 128, 4, 4
        elif fp32:
            bm, bn, bk, warps, stages = 128, 128, 32, 8, 3
        elif math.ceil(m.m / 128) * math.ceil(m.n / 256) * m.batch >= limits.sm_count:
            bm, bn, bk, warps, stages = 128, 256, 64, 8, 3
        else:
            bm, bn, bk, warps, stages = 128, 128, 64, 8, 4
        return {
            "block_m": bm,
            "block_n": bn,
            "block_k": bk,
            "num_warps": warps,
            "num_stages": stages,
            "group_m": 8,
            "split_k": self._split_for(m, bm, bn, bk, limits),
        }

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        m = self._mm(match)
        fp32 = m.dtype is DataType.FLOAT
        tiles: list[tuple[int, int, int, int, int]] = []
        splits: tuple[int, ...] = (1, 2)  # multiples of the SM-filling split to try
        if m.m <= 64:
            # Decode shapes read B once: narrow N tiles and split-K give every SM a share.
            bm = max(16, next_pow2(m.m))
            for bn in (64, 128, 32):
                for bk in (64, 32) if fp32 else (128, 256, 64):
                    tiles.append((bm, bn, bk, 4, 4 if bk < 256 else 3))
            splits = (1, 2, 4)
        elif fp32:
            tiles = [
                (128, 128, 32, 8, 3),
                (128, 64, 32, 4, 3),
                (64, 128, 32, 4, 3),
                (64, 64, 32, 4, 3),
                (128, 128, 16, 8, 4),
                (64, 64, 64, 4, 3),
                (128, 64, 64, 8, 2),
                (32, 64, 32, 4, 4),
            ]
        else:
            tiles = [
                (128, 256, 64, 8, 3),
                (256, 128, 64, 8, 3),
                (128, 256, 64, 8, 4),
                (256, 128, 64, 8, 4),
                (128, 128, 64, 8, 4),
                (128, 128, 64, 4, 4),
                (128, 128, 64, 4, 3),
                (128, 128, 128, 8, 3),
                (128, 128, 128, 4, 3),
                (64, 256, 64, 4, 4),
                (128, 64, 64, 4, 4),
                (64, 128, 64, 4, 4),
                (64, 128, 128, 4, 3),
                (128, 64, 128, 4, 3),
                (64, 64, 64, 4, 4),
                (64, 64, 128, 4, 4),
                (128, 256, 128, 8, 2),
                (32, 64, 128, 4, 4),
                # small tiles for devices with little shared memory per block
                (64, 64, 32, 4, 3),
                (64, 64, 32, 4, 2),
            ]
        out: list[Config] = []
        for bm, bn, bk, warps, stages in tiles:
            split = self._split_for(m, bm, bn, bk, limits)
            for s in sorted({1, *(split * f for f in splits if 1 < split * f <= 32)}):
                out.append(
                    {
                        "block_m": bm,
                        "block_n": bn,
                        "block_k": bk,
                        "num_warps": warps,
                        "num_stages": stages,
                        "group_m": 8,
                        "split_k": s,
                    }
                )
        return out

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        m = self._mm(match)
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        warps, stages, split = config["num_warps"], config["num_stages"], config["split_k"]
        smem = stages * (bm * bk + bk * bn) * m.dtype.itemsize
        if smem > limits.smem_per_block:
            return Violation(
                ("num_stages", "block_k", "block_m", "block_n"),
                f"needs about {smem} bytes of shared memory ({stages} stages of a {bm}x{bk} and "
                f"a {bk}x{bn} {m.dtype.json_name} tile) but the device allows "
                f"{limits.smem_per_block} per block; use fewer stages or smaller tiles",
            )
        acc = bm * bn // (32 * warps)
        if acc > MAX_ACC_PER_THREAD:
            return Violation(
                ("num_warps", "block_m", "block_n"),
                f"a {bm}x{bn} fp32 accumulator over {warps} warps holds {acc} values per thread "
                f"(more than {MAX_ACC_PER_THREAD}: the registers spill); use more warps or a "
                "smaller tile",
            )
        k_tiles = math.ceil(m.k / bk)
        if split > k_tiles:
            return Violation(
                ("split_k", "block_k"),
                f"split_k={split} is more than the {k_tiles} K tile(s) of block_k={bk} "
                f"(K={m.k}); some splits would have no work",
            )
        return None

    def workspace_bytes(self, config: Config, match: Match) -> int:
        m = self._mm(match)
        split = config["split_k"]
        return 0 if split <= 1 else split * m.batch * m.m * m.n * 4


# ---- row kernels: norm and reduction --------------------------------------------------------
class RowSolver(Solver):
    """Rows of ``n`` values reduced per program: ``block_m`` rows, ``block_n``-wide chunks.

    Memory-bound: the default is :func:`~.row_configs.row_prior` (sized by bytes) and the
    search covers only its neighbourhood (:func:`~.row_configs.row_space`).
    """

    values = {
        "block_m": (1, 2, 4, 8, 16, 32),
        "block_n": tuple(_pow2(16, 65536)),
        "num_warps": (1, 2, 4, 8, 16, 32),
    }
    #: 2: byte-sized prior and space, unmasked full-width norm loads
    revision = 2

    @staticmethod
    def _problem(match: Match, limits: DeviceLimits) -> tuple[int, int, int, int]:
        assert isinstance(match, NormMatch | ReductionMatch)
        return match.rows, match.n, match.x.dtype.itemsize, limits.sm_count

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        return row_prior(*self._problem(match, limits))

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        return row_space(*self._problem(match, limits))

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        bm, bn, warps = config["block_m"], config["block_n"], config["num_warps"]
        per_thread = bm * bn / (32 * warps)
        if per_thread > MAX_ROW_VALUES_PER_THREAD:
            return Violation(
                ("num_warps", "block_n", "block_m"),
                f"{bm} row(s) x {bn} values over {warps} warps is {per_thread:g} values per "
                f"thread (more than {MAX_ROW_VALUES_PER_THREAD}: the registers spill); use "
                "more warps or a smaller block",
            )
        if per_thread < 1:
            return Violation(
                ("num_warps",),
                f"{warps} warps for {bm}x{bn} values leaves threads without work",
            )
        return None


class NormSolver(RowSolver):
    kernel = "norm"


class ReductionSolver(RowSolver):
    kernel = "reduction"


# ---- pointwise ------------------------------------------------------------------------------
class PointwiseSolver(Solver):
    kernel = "pointwise"
    values = {
        "block_n": tuple(_pow2(64, 16384)),
        "num_warps": (1, 2, 4, 8, 16),
    }

    def default(self, match: Match, limits: DeviceLimits) -> Config:
        assert isinstance(match, PointwiseMatch)
        block = 1024 if match.numel >= 1024 else max(64, next_pow2(match.numel))
        return {"block_n": block, "num_warps": max(1, min(4, block // 256))}

    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        return [
            {"block_n": bn, "num_warps": w}
            for bn in (1024, 2048, 4096, 512, 8192)
            for w in (4, 8, 2)
        ]

    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        per_thread = config["block_n"] / (32 * config["num_warps"])
        if per_thread > 32:
            return Violation(
                ("block_n", "num_warps"),
                f"{config['block_n']} elements over {config['num_warps']} warps is "
                f"{per_thread:g} per thread (more than 32); use more warps",
            )
        if per_thread < 1:
            return Violation(
                ("num_warps",),
                f"{config['num_warps']} warps for {config['block_n']} elements leaves "
                "threads without work",
            )
        return None


SOLVERS: dict[str, Solver] = {
    s.kernel: s
    for s in (
        MatmulSolver(),
        NormSolver(),
        ReductionSolver(),
        PointwiseSolver(),
        PoolSolver(),
        BatchnormSolver(),
        AttentionSolver(),
    )
}


def solver_for(match: Match) -> Solver:
    return SOLVERS[match.kernel]


def all_solver_knobs() -> list[Knob]:
    """Every solver knob with the union of the kernels' allowed values (graph-less listing)."""
    allowed: dict[str, set[int]] = {}
    for solver in SOLVERS.values():
        for name, vals in solver.values.items():
            allowed.setdefault(name, {0}).update(vals)
    order = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m", "split_k")
    return [
        Knob(
            KNOB_PREFIX + name,
            _DESCRIPTIONS[name],
            KnobValueType.INT64,
            0,
            IntConstraint(valid_values=frozenset(allowed[name])),
        )
        for name in order
    ]
