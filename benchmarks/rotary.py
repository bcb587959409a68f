"""transformers' rotary position embedding (``apply_rotary_pos_emb``, rotate-half form) as
eager PyTorch runs it and as dnntune's kernel runs it (one Triton kernel a tensor).

On a CUDA device, each case's query and key (the transposed views of a projection's output,
as LLaMA's attention makes them) are embedded by both, side by side in interleaved rounds,
each variant's burst of calls recorded as a CUDA graph and its replays timed with CUDA events
(device time, as a model replay runs it; :func:`patch_embed._time`). The error column is each
variant's largest error against the float64 embedding of the same inputs.

Usage (device)::

    PYTHONPATH=src:benchmarks python benchmarks/rotary.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from patch_embed import _time

#: name: (batch, query heads, key heads, sequence, head size) of LLaMA-style attentions
CASES: dict[str, tuple[int, int, int, int, int]] = {
    "decode_1tok_16h": (1, 16, 4, 1, 128),
    "decode_8x1tok_32h": (8, 32, 8, 1, 128),
    "prefill_2048_16h": (1, 16, 4, 2048, 128),
    "batch_8x512_32h": (8, 32, 8, 512, 128),
}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def eager_form() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """transformers' own function where transformers is installed, else the same form."""
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:

        def apply_rotary_pos_emb(
            q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s

    return apply_rotary_pos_emb  # type: ignore[no-any-return]


def _tables(seq: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device="cuda") / dim))
    freqs = torch.outer(torch.arange(seq, device="cuda", dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def measure(name: str, dtype: torch.dtype, rounds: int, burst: int) -> str:
    from dnntune.providers.triton.kernels.rotary import rotate_half_embedding

    b, hq, hk, s, d = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    cos, sin = _tables(s, d, dtype)
    eager = eager_form()
    fns: dict[str, Callable[[], object]] = {
        "eager": lambda: eager(q, k, cos, sin),
        "kernel": lambda: (rotate_half_embedding(q, cos, sin), rotate_half_embedding(k, cos, sin)),
    }
    c64, s64 = cos.double()[:, None], sin.double()[:, None]
    want = q.double() * c64 + _rotate_half(q.double()) * s64
    errors = {
        "eager": (eager(q, k, cos, sin)[0].double() - want).abs().max().item(),
        "kernel": (rotate_half_embedding(q, cos, sin).double() - want).abs().max().item(),
    }
    us = _time(fns, rounds, burst)
    cells = " | ".join(f"{us[v]:.2f}" for v in fns)
    errs = " | ".join(f"{errors[v]:.1e}" for v in fns)
    return (
        f"| {name} | {b}x{hq}/{hk}x{s}x{d} | {cells} | {us['eager'] / us['kernel']:.2f}x | {errs} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the rotary kernel runs on CUDA only; nothing timed")
        return
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, device us per call of q and k")
    print(f"(CUDA-graph replays of {args.burst} calls, median of {args.rounds} rounds)")
    print("| case | BxHq/HkxSxD | eager | kernel | eager / kernel | eager err | kernel err |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in CASES:
        print(measure(name, dtype, args.rounds, args.burst), flush=True)


if __name__ == "__main__":
    main()
