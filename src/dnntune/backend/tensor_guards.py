"""PyTorch's C++ tensor guards as ``Graph.execute``'s bound-pack check (issue 22).

``torch._C._dynamo.guards.TensorGuards`` checks a tensor's dtype, device, dims, strides and
dispatch keys (also ``requires_grad`` and a negative or conjugate view) in one C++ call: four
tensors in 0.27 µs on the CPU, against 1.3 µs for the generated Python comparison of
:mod:`dnntune.backend.variant_pack`. It is a private API, so it is probed once per process
(:func:`guards_class`) and used only where it checks what the binding relies on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["guards_class", "tensor_guard"]


@functools.cache
def guards_class() -> Any:
    """PyTorch's ``TensorGuards``, or None where it is not there or does not check what this
    module relies on (probed once, on small CPU tensors: the same layout passes; one more
    row, another dtype and other strides fail)."""
    import torch

    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)  # noqa: SLF001
    make = getattr(guards, "TensorGuards", None)
    if make is None:
        return None
    try:
        t = torch.empty(2, 3)
        guard = make(t, dynamic_dims_sizes=[[2, 3]], dynamic_dims_strides=[[3, 1]])
        works = guard.check(torch.empty(2, 3)) is True and not any(
            guard.check(other)
            for other in (
                torch.empty(3, 3),
                torch.empty(2, 3, dtype=torch.float16),
                torch.empty(3, 2).t(),
            )
        )
    except Exception:  # another PyTorch's signature
        return None
    return make if works else None


def tensor_guard(
    layout: Sequence[tuple[torch.dtype, torch.Size, tuple[int, ...], bool]],
    on_device: str,
    examples: Sequence[Any],
) -> Callable[..., bool] | None:
    """``guard(*tensors)``: True when each tensor has its example's layout, through PyTorch's
    C++ tensor guards (``torch._C._dynamo.guards.TensorGuards``), or None where they are not
    there or an example is not exactly of its bound layout (the Python comparison then)."""
    import torch

    if len(examples) != len(layout):
        return None
    for t, (dtype, dims, bound_strides, _) in zip(examples, layout, strict=True):
        if type(t) is not torch.Tensor or not getattr(t, on_device):
            return None
        if (t.dtype, t.shape, t.stride()) != (dtype, dims, bound_strides):
            return None
    make = guards_class()
    if make is None:
        return None
    try:
        # each dim's size and stride given: checked as they are (None would let it vary)
        sizes = [list(t.shape) for t in examples]
        strides = [list(t.stride()) for t in examples]
        guard = make(*examples, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        if guard.check(*examples) is not True:
            return None
        check: Callable[..., bool] = guard.check
        return check
    except Exception:  # another PyTorch's signature: the Python comparison
        return None
