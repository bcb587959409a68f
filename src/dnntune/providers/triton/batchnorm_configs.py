"""Configs of the NHWC batch-norm kernel: a prior sized by bytes and a small space around it.

Batch-norm inference reads each input once, writes each output once and does two flops per
element: it is a pure stream, and its speed is how many bytes every SM keeps in flight and how
wide each access is. A program covers ``block_m`` pixels x ``block_n`` channels, a tile whose
rows are contiguous runs of channels (16-byte vector loads along C), and loads the program's
per-channel statistics once. So the prior sizes a config by bytes:

* ``block_n``: every channel of a pixel up to :data:`CHANNEL_BYTES` of them (128 fp16 or 64
  fp32 channels), never wider than the channels need; wider rows are split over programs;
* ``block_m``: enough pixels that a program moves about :data:`PROGRAM_BYTES` of input, halved
  while the grid would give an SM fewer than :data:`MIN_PROGRAMS_PER_SM` programs;
* ``num_warps``: enough threads that each holds :data:`BYTES_PER_THREAD` of the tile (four
  16-byte vectors), at most :data:`MAX_WARPS`.

The space (at most 12 configs): 8, 16 and 32 KiB programs, the prior's channel block and one
neighbour (twice as wide when the channels allow, else half as wide), 64 or 32 bytes per
thread. Pure Python.
"""

from __future__ import annotations

import math

__all__ = [
    "BYTES_PER_THREAD",
    "CHANNEL_BYTES",
    "MAX_BLOCK_C",
    "MAX_BLOCK_P",
    "MAX_VALUES_PER_THREAD",
    "MAX_WARPS",
    "MIN_PROGRAMS_PER_SM",
    "PROGRAM_BYTES",
    "bn_config",
    "bn_prior",
    "bn_space",
]

Config = dict[str, int]

#: input bytes one program moves in the prior (the space also tries half and twice this)
PROGRAM_BYTES = 16384
SEARCH_PROGRAM_BYTES = (16384, 8192, 32768)
#: widest channel block of the prior, in bytes of input per pixel
CHANNEL_BYTES = 256
#: bytes of the tile each thread holds in the prior (the space also tries 32: two vectors)
BYTES_PER_THREAD = 64
SEARCH_BYTES_PER_THREAD = (64, 32)
#: the prior keeps at least this many programs per SM (small problems spread out)
MIN_PROGRAMS_PER_SM = 4
#: bounds of the tile and the warps
MAX_BLOCK_P = 1024
MAX_BLOCK_C = 512
MAX_WARPS = 16
#: fp32 values one thread may hold (more spills registers); the solver's check enforces it
MAX_VALUES_PER_THREAD = 64


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _prior_block_c(channels: int, itemsize: int) -> int:
    return min(_next_pow2(channels), max(1, CHANNEL_BYTES // itemsize), MAX_BLOCK_C)


def bn_config(
    pixels: int,
    channels: int,
    itemsize: int,
    sm_count: int,
    block_c: int,
    program_bytes: int = PROGRAM_BYTES,
    thread_bytes: int = BYTES_PER_THREAD,
) -> Config:
    """The config with ``block_c`` channels per program that moves about ``program_bytes`` of
    input per program with ``thread_bytes`` of it per thread (see the module docstring)."""
    block_p = min(MAX_BLOCK_P, _next_pow2(pixels), max(1, program_bytes // (block_c * itemsize)))
    channel_blocks = math.ceil(channels / block_c)
    while block_p > 1 and math.ceil(pixels / block_p) * channel_blocks < (
        MIN_PROGRAMS_PER_SM * sm_count
    ):
        block_p //= 2
    # at least one warp's worth of values, even where that leaves some pixels masked
    block_p = max(block_p, 32 // block_c)
    per_thread = max(1, thread_bytes // itemsize)
    warps = min(MAX_WARPS, max(1, block_p * block_c // (32 * per_thread)))
    return {"block_m": block_p, "block_n": block_c, "num_warps": warps}


def bn_prior(pixels: int, channels: int, itemsize: int, sm_count: int) -> Config:
    """The default config of ``pixels`` x ``channels`` of ``itemsize``-byte input on a device
    with ``sm_count`` SMs."""
    return bn_config(pixels, channels, itemsize, sm_count, _prior_block_c(channels, itemsize))


def bn_space(pixels: int, channels: int, itemsize: int, sm_count: int) -> list[Config]:
    """Configs worth timing, the prior first (before the solver prunes them)."""
    block_c = _prior_block_c(channels, itemsize)
    if _next_pow2(channels) > block_c:
        widths = [block_c, min(MAX_BLOCK_C, 2 * block_c)]
    else:
        widths = [block_c, max(1, block_c // 2)]
    out: list[Config] = []
    for program_bytes in SEARCH_PROGRAM_BYTES:
        for width in dict.fromkeys(widths):
            for thread_bytes in SEARCH_BYTES_PER_THREAD:
                config = bn_config(
                    pixels, channels, itemsize, sm_count, width, program_bytes, thread_bytes
                )
                if config not in out:
                    out.append(config)
    return out
