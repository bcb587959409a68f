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

PyTorch makes that additive mask inside every call (a ``where`` and two fills): a decoder's
layers all get the one mask its forward built, so a LLaMA-style decode step of 8 layers ran
24 such kernels (39 µs of its 0.84 ms on an H100, session 45). The mask made here is kept on
the boolean mask itself (:func:`shared_additive_mask`), for the next layer's call with the
same mask: made once a forward, freed with the mask, and made again when the mask is written
in place (its version counter) or another dtype is asked for. A mask made under
``torch.inference_mode`` keeps no version counter, so it is converted on every call, as
PyTorch does.
"""

from __future__ import annotations

import torch

from dnntune.torch._buffers import version_of

__all__ = ["additive_mask", "converts", "shared_additive_mask"]

#: where a boolean mask keeps the additive mask made of it: (version, data pointer, dtype, mask)
_KEPT = "_dnntune_additive_mask"


def converts(mask: torch.Tensor, query: torch.Tensor) -> bool:
    """Whether the boolean ``mask`` of an attention call on ``query`` is given to PyTorch's op
    as an additive mask: on ``query``'s CUDA device (PyTorch's CPU kernels take a boolean mask
    as it is)."""
    return query.is_cuda and mask.device == query.device


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` as the additive mask PyTorch makes of a boolean one (0 where True, -inf where
    False), of ``dtype`` and contiguous: a fill and a masked fill, no host sync (it records
    in a CUDA graph)."""
    bias = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device)
    return bias.masked_fill_(mask, 0.0)


def shared_additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`additive_mask` of ``mask``, kept on ``mask`` for the next call with it (the other
    layers of the forward that built it) while its contents and ``dtype`` are the same."""
    version = version_of(mask)
    if version < 0:  # an inference tensor keeps no version: a write in place would not show
        return additive_mask(mask, dtype)
    state = mask.__dict__
    kept = state.get(_KEPT)
    pointer = mask.data_ptr()
    if kept is not None and kept[0] == version and kept[1] == pointer and kept[2] is dtype:
        additive: torch.Tensor = kept[3]
        return additive
    additive = additive_mask(mask, dtype)
    state[_KEPT] = (version, pointer, dtype, additive)
    return additive
