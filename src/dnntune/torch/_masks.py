"""Boolean attention masks that PyTorch's fused attention kernels refuse.

Hugging Face's mask builders broadcast a padding mask over the query and key positions with
zero strides: inside a CUDA-graph recording (where they cannot read the mask on the host to
drop an all-true one) BERT-base's attention got a ``[32, 1, 128, 128]`` boolean mask with
strides ``(0, 128, 1, 0)``. PyTorch's dispatcher gave none of its fused kernels that mask
(the recording's kernels were its float32 math path: GEMMs, softmax, a boolean reduction), so
each of BERT's 12 attention calls took 295 µs against 19-41 µs for the fused kernels on the
same mask made dense or additive,
and a replay of the whole forward took 5.0 ms against 1.9 ms of kernels in the eager forward
(H200, session 30). PyTorch turns a boolean mask into an additive one (0 where True, -inf
where False) for those kernels itself; made here, densely, they take it. The result is the
same: fully masked rows come out as zeros on every backend either way.
"""

from __future__ import annotations

import torch

__all__ = ["additive_mask", "fused_kernels_refuse"]


def fused_kernels_refuse(mask: torch.Tensor, query: torch.Tensor) -> bool:
    """A boolean ``mask`` on ``query``'s CUDA device whose last dimension is not unit-strided
    (broadcast along the keys): such a mask may get none of PyTorch's fused kernels (BERT-base's
    recorded one ran the math path), and converting it costs what PyTorch's own conversion
    for those kernels costs."""
    return (
        query.is_cuda
        and mask.device == query.device
        and mask.dim() > 0
        and mask.shape[-1] > 1
        and mask.stride(-1) != 1
    )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` as the additive mask PyTorch makes of a boolean one (0 where True, -inf where
    False), of ``dtype`` and contiguous: a fill and a masked fill, no host sync (it records
    in a CUDA graph)."""
    bias = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
    return bias.masked_fill_(mask, 0.0)
