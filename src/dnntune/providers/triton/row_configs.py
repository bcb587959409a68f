"""Configs of the row kernels (norm, reduction): a byte-count prior and a space pruned around it.

A row kernel reads each element once and does a few flops per byte: it is memory-bound, and
what decides its speed is how many bytes every SM keeps in flight, how wide each access is and
what each program costs on top (scheduling, the weight load, the cross-warp reduction). So the
prior sizes a config by bytes, not by elements:

* ``block_n``: the next power of two of the row, kept whole in registers (one read of the row)
  up to :data:`SINGLE_PASS_DEFAULT_N`; longer rows are walked in :data:`CHUNK_N` chunks.
* ``block_m``: rows of :data:`ALONE_N` elements or more get a program each; shorter rows are
  packed until a program moves about :data:`PROGRAM_BYTES` of input, as long as every SM still
  gets :data:`MIN_PROGRAMS_PER_SM` programs (small problems spread out instead).
* ``num_warps``: enough threads that each holds :data:`BYTES_PER_THREAD` of the block (four
  16-byte vector loads), so it scales with ``block_m * block_n``; at most 16 warps. Compiled
  for sm_90 (ptxas), that is 50-65 registers without spills for both norms, and the most
  input bytes resident per SM (64-72 KiB: 4 blocks of an 8192-wide bf16 row at 8 warps, where
  16 warps fit only 3 blocks, 48 KiB, and leave a 0.3 tail wave on 4096 rows). A grid with
  fewer programs than SMs is latency-bound instead: one 16-byte vector per thread, more warps.

The search space is that prior's neighbourhood only: half, the same and twice the rows per
program (short rows), and 16 to 128 bytes per thread. Configs that would give a thread less
than one 16-byte vector are not searched (a pinned knob can still ask for them), nor rows of
4096 or more several to a program. Pure Python.
"""

from __future__ import annotations

import math

__all__ = [
    "ALONE_N",
    "BYTES_PER_THREAD",
    "CHUNK_N",
    "MIN_PROGRAMS_PER_SM",
    "PROGRAM_BYTES",
    "SINGLE_PASS_DEFAULT_N",
    "SINGLE_PASS_MAX_N",
    "row_prior",
    "row_space",
]

Config = dict[str, int]

#: bytes of the block each thread holds in the prior: four 16-byte vectors (32 bf16, 16 fp32)
BYTES_PER_THREAD = 64
#: bytes per thread of the prior when there are fewer programs than SMs (one vector)
SMALL_GRID_BYTES_PER_THREAD = 16
#: bytes per thread the search tries: one to eight 16-byte vectors (less than one vector per
#: thread leaves load bandwidth unused, so it is never searched)
SEARCH_BYTES_PER_THREAD = (64, 32, 128, 16)
#: input bytes one program of short rows should move (amortises the per-program costs)
PROGRAM_BYTES = 8192
#: rows at least this long get one program each
ALONE_N = 4096
#: the prior keeps at least this many programs per SM (short problems spread out)
MIN_PROGRAMS_PER_SM = 4
#: most rows per program
MAX_BLOCK_M = 16
#: longest row the prior keeps whole in registers (16 warps x 32 values per thread)
SINGLE_PASS_DEFAULT_N = 16384
#: longest row any searched config keeps whole
SINGLE_PASS_MAX_N = 65536
#: chunk width of the prior for longer rows, and the chunk widths searched
CHUNK_N = 4096
SEARCH_CHUNKS_N = (4096, 8192)
#: most warps of the prior (the search goes up to 32)
PRIOR_MAX_WARPS = 16
MAX_WARPS = 32
#: fp32 values one thread may hold (more spills registers); the solver's check enforces it
MAX_VALUES_PER_THREAD = 64


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _whole(n: int) -> int:
    """The row width in registers: a power of two, at least one warp's worth."""
    return max(32, _next_pow2(n))


def _warps(block_m: int, block_n: int, values_per_thread: int, most: int) -> int:
    return min(max(block_m * block_n // (32 * values_per_thread), 1), most)


def row_prior(rows: int, n: int, itemsize: int, sm_count: int) -> Config:
    """The default config of a row kernel over ``rows`` rows of ``n`` elements of ``itemsize``
    bytes on a device with ``sm_count`` SMs (see the module docstring)."""
    whole = _whole(n)
    block_n = whole if whole <= SINGLE_PASS_DEFAULT_N else CHUNK_N
    block_m = 1
    if whole < ALONE_N:
        block_m = min(max(PROGRAM_BYTES // (whole * itemsize), 1), MAX_BLOCK_M)
        while block_m > 1 and math.ceil(rows / block_m) < MIN_PROGRAMS_PER_SM * sm_count:
            block_m //= 2
    # a grid smaller than the device is latency-bound: more threads per row, one vector each
    few = math.ceil(rows / block_m) < sm_count
    per_thread = max(1, (SMALL_GRID_BYTES_PER_THREAD if few else BYTES_PER_THREAD) // itemsize)
    warps = _warps(block_m, block_n, per_thread, PRIOR_MAX_WARPS)
    return {"block_m": block_m, "block_n": block_n, "num_warps": warps}


def _distance(config: Config, prior: Config) -> tuple[int, int, int]:
    """How far a config is from the prior: chunk change, then rows, then warps (log2 steps)."""

    def steps(key: str) -> int:
        return abs(config[key].bit_length() - prior[key].bit_length())

    return steps("block_n"), steps("block_m"), steps("num_warps")


def row_space(rows: int, n: int, itemsize: int, sm_count: int) -> list[Config]:
    """The configs worth timing, nearest the prior first (the prior itself included)."""
    prior = row_prior(rows, n, itemsize, sm_count)
    whole = _whole(n)
    widths = [whole] if whole <= SINGLE_PASS_MAX_N else []
    if whole > SINGLE_PASS_DEFAULT_N:
        widths += [c for c in SEARCH_CHUNKS_N if c < whole]
    out: list[Config] = []
    seen: set[tuple[int, int, int]] = set()
    for block_n in widths:
        if block_n >= ALONE_N:
            row_choices: tuple[int, ...] = (1,)
        else:
            bm = prior["block_m"]
            row_choices = tuple(sorted({max(1, bm // 2), bm, min(MAX_BLOCK_M, bm * 2)}))
        for block_m in row_choices:
            for nbytes in SEARCH_BYTES_PER_THREAD:
                per_thread = max(1, nbytes // itemsize)
                if per_thread > MAX_VALUES_PER_THREAD:
                    continue
                exact = block_m * block_n // (32 * per_thread)
                if exact > MAX_WARPS:
                    continue
                warps = max(exact, 1)
                key = (block_m, block_n, warps)
                if key not in seen:
                    seen.add(key)
                    out.append({"block_m": block_m, "block_n": block_n, "num_warps": warps})
    out.sort(key=lambda c: _distance(c, prior))
    return out
