"""A convolution's string padding (``"valid"``, ``"same"``) as explicit padding per side.

PyTorch's ``F.conv2d`` takes ``padding="valid"`` (no padding) and ``padding="same"`` (stride
1 only: the output has the input's size). For ``"same"`` each spatial dim is padded by
``dilation * (kernel - 1)`` in all, half before; where that total is odd (an even kernel, odd
dilation) PyTorch pads the one extra element after (right, bottom). dnntune's convolution
node has a padding per side (``pre_padding``, ``post_padding``), so both cases are one graph.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["string_padding"]


def string_padding(
    padding: str, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(pre, post) padding per spatial dim that PyTorch's convolution applies for ``padding``,
    or None where PyTorch refuses the call (another string; ``"same"`` with a stride other than
    1; a kernel of another rank than the stride's), so that its op raises its own error."""
    if len(kernel) != len(stride) or len(kernel) != len(dilation):
        return None
    if padding == "valid":
        zeros = (0,) * len(kernel)
        return zeros, zeros
    if padding != "same" or any(s != 1 for s in stride):
        return None
    total = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    pre = tuple(t // 2 for t in total)
    post = tuple(t - p for t, p in zip(total, pre, strict=True))
    return pre, post
