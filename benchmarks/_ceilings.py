"""The two ceilings every row is compared with, measured at the start of the run.

* Matrix rate: ``torch.matmul`` of two random n x n matrices (bf16 on CUDA, n = 8192; float32 on
  the CPU), 2 n^3 FLOP per product over the median of event-timed products.
* Copy bandwidth: ``dst.copy_(src)`` of a large buffer (2 GiB on CUDA), counting bytes read plus
  bytes written, over the median.

Random data, never zeros (a bf16 product on zeros ran 13% faster on an H200 of this workplace).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from dnntune import Handle

__all__ = ["measure_ceilings"]


def _median_ms(handle: Handle, fn: Any, warmup: int, samples: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    handle.synchronize()
    times = [handle.timer.time_ms(fn) for _ in range(samples)]
    return statistics.median(times), times


def _time_gemm(
    handle: Handle, n: int, dtype: torch.dtype, gen: torch.Generator, samples: int
) -> tuple[float, list[float]]:
    a = torch.randn(n, n, device=handle.device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=handle.device, dtype=dtype, generator=gen)
    c = torch.empty(n, n, device=handle.device, dtype=dtype)
    return _median_ms(handle, lambda: torch.matmul(a, b, out=c), 3, samples)


def _time_copy(
    handle: Handle, copy_bytes: int, gen: torch.Generator, samples: int
) -> tuple[float, list[float]]:
    src = torch.empty(copy_bytes // 2, device=handle.device, dtype=torch.float16)
    src.uniform_(-1.0, 1.0, generator=gen)
    dst = torch.empty_like(src)
    return _median_ms(handle, lambda: dst.copy_(src), 3, samples)


def measure_ceilings(handle: Handle, quick: bool = False) -> dict[str, Any]:
    """Measured GEMM rate (FLOP/s) and copy bandwidth (bytes/s) on ``handle``'s device."""
    cuda = handle.is_cuda
    device = handle.device
    if cuda:
        n = 4096 if quick else 8192
        dtype = torch.bfloat16
        copy_bytes = (512 << 20) if quick else (2 << 30)
    else:
        n = 256 if quick else 1024
        dtype = torch.float32
        copy_bytes = (32 << 20) if quick else (256 << 20)
    gen = torch.Generator(device=device).manual_seed(1234)
    samples = 10 if quick else 20
    gemm_ms, gemm_times = _time_gemm(handle, n, dtype, gen, samples)
    copy_ms, copy_times = _time_copy(handle, copy_bytes, gen, samples)
    if cuda:
        torch.cuda.empty_cache()
    flops = 2.0 * n**3 / (gemm_ms * 1e-3)
    bandwidth = 2.0 * copy_bytes / (copy_ms * 1e-3)
    return {
        "gemm": {
            "what": f"torch.matmul {n}x{n}x{n} {str(dtype).removeprefix('torch.')}",
            "median_ms": gemm_ms,
            "samples_ms": gemm_times,
            "flops_per_s": flops,
            "tflops": flops / 1e12,
        },
        "copy": {
            "what": f"dst.copy_(src), {copy_bytes / (1 << 30):.3g} GiB, read + write counted",
            "median_ms": copy_ms,
            "samples_ms": copy_times,
            "bytes_per_s": bandwidth,
            "gbps": bandwidth / 1e9,
        },
        #: FLOP per byte above which a graph is compute-bound on this device
        "ridge_flop_per_byte": flops / bandwidth,
    }
