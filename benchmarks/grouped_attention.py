"""Grouped-query attention with a mask (a ``StaticCache`` decode step's) as transformers runs
it and as dnntune runs it.

transformers' SDPA attention repeats the key/value heads whenever there is a mask
(``repeat_kv``: a copy of the cache, group-size times over) and calls PyTorch's SDPA on them.
Inside an optimized model dnntune's attention gets the heads unrepeated and runs PyTorch's op
with ``enable_gqa`` where one of PyTorch's fused CUDA kernels takes the call with its mask,
else repeats them as transformers does (``dnntune.providers._torch.sdpa.grouped_masked``).

On a CUDA device each case's variants run side by side in interleaved rounds, each burst of
calls recorded as a CUDA graph and its replays timed with CUDA events (device time, as a model
replay runs it; :func:`patch_embed._time`). The error columns are each variant's largest error
against the float64 attention of the same inputs; "shared" says whether dnntune shared the
heads (a fused kernel took ``enable_gqa`` with the mask) or repeated them.

Usage (device)::

    PYTHONPATH=src:benchmarks python benchmarks/grouped_attention.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from patch_embed import _time

#: name: (batch, query heads, key/value heads, cache slots, head size, query rows)
CASES: dict[str, tuple[int, int, int, int, int, int]] = {
    "decode_1x16/4_2048": (1, 16, 4, 2048, 128, 1),
    "decode_8x32/8_2048": (8, 32, 8, 2048, 128, 1),
    "decode_1x32/8_4096": (1, 32, 8, 4096, 128, 1),
    "chunk_1x16/4_2048_q64": (1, 16, 4, 2048, 128, 64),
}


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: [B, Hkv, S, D] -> [B, Hkv * times, S, D], a copy."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, times, s, d).reshape(b, h * times, s, d)


def transformers_form(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group), mask)


def inputs(
    name: str, dtype: torch.dtype, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query (a transposed view, as LLaMA makes it), the cache's keys and values, and the
    boolean mask of a cache filled to just past half."""
    b, hq, hk, slots, d, rows = CASES[name]
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, rows, hq, d, device=device, dtype=dtype, generator=gen).transpose(1, 2)
    k = torch.randn(b, hk, slots, d, device=device, dtype=dtype, generator=gen)
    v = torch.randn(b, hk, slots, d, device=device, dtype=dtype, generator=gen)
    filled = slots // 2 + rows
    mask = torch.zeros(b, 1, rows, slots, dtype=torch.bool, device=device)
    mask[..., :filled] = torch.ones(rows, filled, dtype=torch.bool, device=device).tril(
        filled - rows
    )
    return q, k, v, mask


def measure(name: str, dtype: torch.dtype, rounds: int, burst: int) -> str:
    from dnntune.providers._torch.sdpa import fused_takes_grouped, grouped_masked

    q, k, v, mask = inputs(name, dtype)
    fns: dict[str, Callable[[], object]] = {
        "transformers": lambda: transformers_form(q, k, v, mask),
        "dnntune": lambda: grouped_masked(q, k, v, mask),
    }
    want = transformers_form(q.double(), k.double(), v.double(), mask)
    outs = {
        "transformers": transformers_form(q, k, v, mask),
        "dnntune": grouped_masked(q, k, v, mask),
    }
    errors = {n: (out.double() - want).abs().max().item() for n, out in outs.items()}
    us = _time(fns, rounds, burst)
    shared = "yes" if fused_takes_grouped(q, k, v, mask) else "no (repeated)"
    b, hq, hk, slots, d, rows = CASES[name]
    cells = " | ".join(f"{us[n]:.1f}" for n in fns)
    errs = " | ".join(f"{errors[n]:.1e}" for n in fns)
    ratio = us["transformers"] / us["dnntune"]
    shape = f"{b}x{hq}/{hk}x{rows}x{slots}x{d}"
    return f"| {name} | {shape} | {cells} | {ratio:.2f}x | {shared} | {errs} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: PyTorch's fused attention kernels run on CUDA only; nothing timed")
        return
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, torch {torch.__version__}")
    print(
        f"device us per call (CUDA-graph replays of {args.burst}, median of {args.rounds} rounds)"
    )
    print(
        "| case | BxHq/HkvxQxSxD | transformers | dnntune | ratio | shared | "
        "transformers err | dnntune err |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for name in CASES:
        print(measure(name, dtype, args.rounds, args.burst), flush=True)


if __name__ == "__main__":
    main()
