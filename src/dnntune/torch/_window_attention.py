"""torchvision's Swin window attention (``ShiftedWindowAttention``, Swin V1) on dnntune.

Its forward is one function, ``shifted_window_attention``: the feature map padded to whole
windows and cyclically shifted, cut into windows, ``F.linear`` with the module's ``qkv``
weights (so the ``qkv`` and ``proj`` children never run as modules, and stay on PyTorch's op),
the query scaled, ``q @ k^T``, the relative position bias added, for a shifted block a mask
built on every call (nine slice writes: -100 between tokens of a window that came from
different regions of the map) added too, softmax, ``@ v``, the projection, and the windows put
back. In a CUDA-graph replay of Swin-T that is most of the model's copies, adds and small
kernels: 1.0 ms of copies, 0.8 ms of elementwise and 0.5 ms of other kernels a forward against
the compiler's 0.36, 0.29 and 0.03 ms (H100, session 47).

Here the same arithmetic runs as: on a map of whole windows (Swin-T's at 224x224), the roll
and the cut into windows as one gather of whole pixels (``index_select`` of their channels'
bytes, 8 a load) and the way back as another, where torchvision runs a roll and a permuted
copy each way (a padded map takes torchvision's pad, roll and views); ``self.qkv`` and
``self.proj`` called as modules (dnntune's linear layers, tuned as any other); and one
``F.scaled_dot_product_attention``, which an optimized model's forward routes to dnntune's
(tuned), with the bias and the shift mask as its additive mask. The shift mask and the pixel
order depend only on the map's size, the window and the shift: they are made once per size
and kept on the module (never inside a CUDA-graph capture, whose memory is not written until
a replay).
Where the window covers the padded map torchvision sets the shift to 0: before 0.28 in the
module's own ``shift_size`` list (so later calls, on larger maps too, run unshifted), from 0.28
in a copy; this one does as the installed version's function does.

The module's own forward runs where this one would not compute what it does: a dropout
probability other than 0 (torchvision's ``F.dropout`` calls drop also in eval mode), gradients
wanted, a weight of another type than the input, autocast, hooks on the children (which
torchvision never calls), refine's flag, or a recorded program.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dnntune.torch._calls import PYTORCH_FLAG, autocast_on
from dnntune.torch._fused_parts import hooked
from dnntune.torch._support import pytorch_route, tracing
from dnntune.torch._words import as_words
from dnntune.torch.modules import ATTRIBUTED, _attributed

__all__ = ["window_attention_forward", "window_attention_like"]

_LIBRARY = "torchvision.models.swin_transformer"
#: what torchvision adds between tokens of one window that come from different regions
_APART = -100.0
#: where the module keeps its shift masks and window orders, by size (dnntune attributes: not
#: forward state)
_MASKS = "_dnntune_window_masks"
_ORDERS = "_dnntune_window_orders"


def window_attention_like(module: nn.Module) -> bool:
    """Whether ``module`` is exactly torchvision's ``ShiftedWindowAttention`` (not a subclass,
    not V2), running the library's own forward and attention function, with linear ``qkv`` and
    ``proj`` children."""
    cls = type(module)
    if (cls.__module__, cls.__qualname__) != (_LIBRARY, "ShiftedWindowAttention"):
        return False
    if "forward" in module.__dict__:  # a forward set on the instance
        return False
    function = getattr(sys.modules.get(_LIBRARY), "shifted_window_attention", None)
    for own in (
        function,
        cls.__dict__.get("forward"),
        cls.__dict__.get("get_relative_position_bias"),
    ):
        if own is None or getattr(own, "__module__", None) != _LIBRARY:
            return False
    children = module.__dict__["_modules"]
    return isinstance(children.get("qkv"), nn.Linear) and isinstance(
        children.get("proj"), nn.Linear
    )


def window_attention_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The stand-in's forward: :func:`_window_attention` where it computes what ``original``
    does (the module's docstring), else ``original``."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        state = self.__dict__
        if (
            pytorch_route.on  # the forward runs on PyTorch's route (._route_race)
            or state.get(PYTORCH_FLAG)
            or tracing()
            or not isinstance(x, torch.Tensor)
            or x.dim() != 4
            or state.get("attention_dropout") != 0.0
            or state.get("dropout") != 0.0
            or not _same_types(self, x)
            or autocast_on()  # torchvision's adds then promote to the bias's type, not here
            # torchvision's forward never calls its children: their hooks would run here only
            or hooked(state["_modules"]["qkv"], state["_modules"]["proj"])
            or (torch.is_grad_enabled() and _grad_wanted(self, x))
        ):
            return original(self, x)
        if ATTRIBUTED in state:  # optimize's example forward
            return _attributed(self, lambda: _window_attention(self, x))
        return _window_attention(self, x)

    return forward


def _same_types(module: nn.Module, x: torch.Tensor) -> bool:
    table = module.__dict__["_parameters"].get("relative_position_bias_table")
    if table is None or table.dtype != x.dtype or table.device != x.device:
        return False
    children = module.__dict__["_modules"]
    return all(p.dtype == x.dtype for name in ("qkv", "proj") for p in children[name].parameters())


def _grad_wanted(module: nn.Module, x: torch.Tensor) -> bool:
    return x.requires_grad or any(p.requires_grad for p in module.parameters())


def _window_attention(module: Any, x: torch.Tensor) -> torch.Tensor:
    """torchvision's ``shifted_window_attention`` for ``module`` (dropouts 0), its attention one
    ``scaled_dot_product_attention`` with the bias and shift mask as the additive mask."""
    batch, height, width, channels = x.shape
    window, shift, heads = module.window_size, module.shift_size, module.num_heads
    if not _shift_kept():
        shift = list(shift)  # torchvision 0.28 and later turn a shift off in a copy
    pad_right = (window[1] - width % window[1]) % window[1]
    pad_bottom = (window[0] - height % window[0]) % window[0]
    size = (height + pad_bottom, width + pad_right)
    # as torchvision does: no shift where one window covers the padded map
    if window[0] >= size[0]:
        shift[0] = 0
    if window[1] >= size[1]:
        shift[1] = 0
    shifted = sum(shift) > 0
    rows, cols = size[0] // window[0], size[1] // window[1]
    windows, tokens = rows * cols, window[0] * window[1]
    key = (size, tuple(window), tuple(shift))
    gathered = not (pad_right or pad_bottom)
    if gathered:  # the roll and the windows as one gather of whole pixels
        order, back = _kept(module, _ORDERS, key, x, lambda d: _window_order(*key, d))
        x = _pixels(x.reshape(batch, height * width, channels), order)
    else:
        x = F.pad(x, (0, 0, 0, pad_right, 0, pad_bottom))
        if shifted:
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        x = x.view(batch, rows, window[0], cols, window[1], channels).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(batch * windows, tokens, channels)
    qkv = module.qkv(x).reshape(batch * windows, tokens, 3, heads, channels // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    mask = module.get_relative_position_bias()  # (1, heads, tokens, tokens)
    if shifted:
        (apart,) = _kept(module, _MASKS, key, x, lambda d: (_regions_apart(*key, d),))
        mask = (apart + mask).repeat(batch, 1, 1, 1)  # (batch * windows, heads, ...)
    # PyTorch's function, which an optimized model's forward routes to dnntune's (routing.py:
    # an engine's own call of it inside that one then reaches PyTorch's op, not this again)
    scale = (channels // heads) ** -0.5
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    x = module.proj(out.transpose(1, 2).reshape(batch * windows, tokens, channels))
    if gathered:
        x = _pixels(x.reshape(batch, height * width, channels), back)
        return x.view(batch, height, width, channels)
    x = x.view(batch, rows, cols, window[0], window[1], channels)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(batch, *size, channels)
    if shifted:
        x = torch.roll(x, shifts=(shift[0], shift[1]), dims=(1, 2))
    return x[:, :height, :width, :].contiguous()


def _shift_kept() -> bool:
    """Whether the library's ``shifted_window_attention`` turns a shift off in the list it is
    given, the module's own (torchvision before 0.28), rather than in a copy of it (from 0.28:
    ``shift_size = shift_size.copy()`` first)."""
    function = getattr(sys.modules.get(_LIBRARY), "shifted_window_attention", None)
    return _kept_by(getattr(function, "__code__", None))


@functools.lru_cache(maxsize=8)
def _kept_by(code: Any) -> bool:
    """Read once per function's code: whether it copies the list (calls a ``copy``)."""
    return code is not None and "copy" not in code.co_names


def _kept(
    module: nn.Module,
    where: str,
    key: tuple[Any, ...],
    like: torch.Tensor,
    make: Callable[[torch.device], tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """``make(device)``'s tensors, made on ``like``'s device by its kernels (no copy from the
    host, which a CUDA-graph capture refuses), floating ones in ``like``'s type; kept on the
    module under ``where`` by ``key``, except inside a capture (made there, not kept: a capture
    writes no memory until its replay)."""
    key = (*key, like.device, like.dtype)
    kept: dict[Any, tuple[torch.Tensor, ...]] = module.__dict__.setdefault(where, {})
    found = kept.get(key)
    if found is None:
        found = tuple(
            t.to(dtype=like.dtype) if t.is_floating_point() else t for t in make(like.device)
        )
        if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            kept[key] = found
    return found


def _window_order(
    size: tuple[int, int], window: tuple[int, ...], shift: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """For a map of ``size`` (no padding): the pixel each token of the windows reads, in the
    windows' order, after torchvision's roll by ``-shift``, and the inverse (where each pixel's
    token is, after the roll back)."""
    h, w = size
    rows = (torch.arange(h, device=device) + shift[0]) % h  # rolled row r reads row r + shift
    cols = (torch.arange(w, device=device) + shift[1]) % w
    pixel = rows[:, None] * w + cols[None, :]
    order = pixel.view(h // window[0], window[0], w // window[1], window[1]).permute(0, 2, 1, 3)
    order = order.reshape(-1)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=device)
    return order, back


def _pixels(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(1, index)`` for ``x`` of (batch, pixels, channels), each pixel's
    channels moved 8 bytes a load where their bytes come in whole words (:mod:`._words`)."""
    words = as_words(x)
    if words is not None:
        return words.index_select(1, index).view(x.dtype)
    return x.index_select(1, index)


def _regions_apart(
    size: tuple[int, int], window: tuple[int, ...], shift: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """The mask as torchvision makes it, in float32: each region of the map (its slice writes,
    in their order: a later one overwrites an earlier) numbered, then per window the pairs of
    tokens from different regions."""
    regions = torch.zeros(size, device=device)
    bounds = [((0, -window[i]), (-window[i], -shift[i]), (-shift[i], None)) for i in range(2)]
    for n, ((top, bottom), (left, right)) in enumerate(
        (h, w) for h in bounds[0] for w in bounds[1]
    ):
        regions[top:bottom, left:right] = n
    rows, cols = size[0] // window[0], size[1] // window[1]
    regions = regions.view(rows, window[0], cols, window[1]).permute(0, 2, 1, 3)
    regions = regions.reshape(rows * cols, window[0] * window[1])
    apart = regions.unsqueeze(1) != regions.unsqueeze(2)
    mask = torch.zeros(apart.shape, device=device).masked_fill_(apart, _APART)
    return mask.unsqueeze(1)
