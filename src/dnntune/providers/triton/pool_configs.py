"""Configs of the NHWC pooling kernel: a prior sized by vector loads and a small space around it.

Pooling is memory-bound: each output reads a window of inputs that neighbouring outputs share
through the caches. A program covers ``block_m`` pixels x ``block_n`` channels (a global pool:
``block_m`` input pixels per step of its walk over h*w); its loads run along the channels,
contiguous in NHWC, so:

* ``block_n``: every channel of a pixel up to :data:`PRIOR_CHANNELS` (a 128-byte fp16 row or
  more per pixel and window tap), never wider than the channels need;
* ``block_m``: enough pixels that a program holds about :data:`PROGRAM_VALUES` values (fewer for
  a global pool's step, :data:`GLOBAL_PROGRAM_VALUES`, since its grid has one program per image
  and channel block only);
* ``num_warps``: one 16-byte vector per thread and tap, at most 8 warps; a global pool's step,
  whose values each thread adds into accumulators it keeps over the whole walk: as few warps as
  hold the step at :data:`MAX_VALUES_PER_THREAD` values a thread. On the H200 (ResNet-50's
  global 7x7 average pool, 32 x 2048 channels, fp16, a step of 32 pixels x 64 channels) 2 warps
  ran 4.1 µs, 4 warps 6.1 and 8 warps 8.4, and fewer warps won at every tile measured (likely
  the end of the walk: the cross-thread sum over the step's pixels is cheaper over fewer
  warps; not profiled).

The space: 512 to 4096 values per program for the three widest channel blocks, 4 or 8 warps;
a global pool's steps of 16, 32 or 64 pixels with 2, 4 or 8 warps. Pure Python.
"""

from __future__ import annotations

__all__ = [
    "CHANNEL_BLOCKS",
    "GLOBAL_PROGRAM_VALUES",
    "MAX_VALUES_PER_THREAD",
    "PRIOR_CHANNELS",
    "PROGRAM_VALUES",
    "channel_blocks",
    "pool_prior",
    "pool_space",
]

#: widest channel block of the prior (global pools: half of it, for more programs)
PRIOR_CHANNELS = 128
#: values per program of the prior (windowed pooling) and of a global pool's step
PROGRAM_VALUES = 2048
GLOBAL_PROGRAM_VALUES = 2048
#: fp32 accumulator values one thread may hold
MAX_VALUES_PER_THREAD = 32
#: the channel blocks the kernel takes
CHANNEL_BLOCKS = (256, 128, 64, 32, 16, 8, 4)
#: the most pixels per program
MAX_BLOCK_M = 128

Config = dict[str, int]


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def channel_blocks(channels: int) -> list[int]:
    """``block_n`` choices, widest first, none wider than ``channels`` need."""
    widest = max(CHANNEL_BLOCKS[-1], min(CHANNEL_BLOCKS[0], _next_pow2(channels)))
    return [bn for bn in CHANNEL_BLOCKS if bn <= widest]


def _config(
    block_m: int, block_n: int, itemsize: int, warps: int | None = None, per_thread: int = 0
) -> Config:
    """``per_thread``: the values a thread holds when ``warps`` is not given (0: one 16-byte
    vector)."""
    # at least one warp's worth of values, even where that leaves some pixels masked
    block_m = max(block_m, 32 // block_n)
    if warps is None:
        per_thread = per_thread or max(1, 16 // itemsize)  # one 16-byte vector per thread and tap
        warps = max(1, min(8, -(-block_m * block_n // (32 * per_thread))))
    return {"block_m": block_m, "block_n": block_n, "num_warps": warps}


def pool_prior(channels: int, rows: int, itemsize: int, is_global: bool) -> Config:
    """The default config: ``rows`` is what ``block_m`` tiles (output pixels, or a global
    pool's input pixels per image)."""
    block_n = min(channel_blocks(channels)[0], PRIOR_CHANNELS // (2 if is_global else 1))
    values = GLOBAL_PROGRAM_VALUES if is_global else PROGRAM_VALUES
    block_m = min(MAX_BLOCK_M, _next_pow2(rows), max(1, values // block_n))
    # a global pool's threads keep their accumulators over the walk: fill them
    return _config(block_m, block_n, itemsize, per_thread=MAX_VALUES_PER_THREAD if is_global else 0)


def pool_space(channels: int, rows: int, itemsize: int, is_global: bool) -> list[Config]:
    """Configs worth searching, best guesses first (before the solver prunes them)."""
    widest_rows = _next_pow2(rows)
    out: list[Config] = []
    if is_global:
        for block_n in channel_blocks(channels)[:3]:
            for block_m in (32, 16, 64):
                for warps in (2, 4, 8):
                    out.append(_config(min(block_m, widest_rows), block_n, itemsize, warps))
        return out
    for values in (2048, 1024, 4096, 512):
        for block_n in channel_blocks(channels)[:3]:
            block_m = min(MAX_BLOCK_M, widest_rows, max(1, values // block_n))
            for warps in (4, 8):
                out.append(_config(block_m, block_n, itemsize, warps))
    return out
