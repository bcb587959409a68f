"""A residual stream laid out with its last dimension strided is made row-major once, before
the first of the blocks it flows through.

transformers' Whisper encoder (and others built the same way) turns its convolution's
``[batch, hidden, time]`` output into ``[batch, time, hidden]`` with ``permute(0, 2, 1)`` and
adds the positions to it. The add keeps the permuted layout, and so does every residual add
after it: the whole stream runs with the hidden dimension strided by the sequence length. Each
layer norm then copies its input first, and each residual add mixes two layouts, which
PyTorch's elementwise kernel reads slowly. On an H100 (session 57, whisper-base's encoder,
4x3000 frames, bf16) that was 610 of the forward's 2,097 us, in eager and dnntune's forward
alike; the same model with the stream made contiguous once before its first layer replayed at
1,570 us (1.34x), its output bit for bit the same and laid out as eager's.

So ``optimize`` looks, in one eager forward of the example, at the first block of each run of
blocks of one class (an ``nn.ModuleList`` or ``nn.Sequential``): where its first argument is a
floating-point tensor whose last dimension is not unit-strided (and not a channels-last image,
a layout PyTorch's convolutions choose) and its output keeps that layout (the stream carries
it on), where the block neither writes into that argument nor returns it (the caller holds
it too, and a copy would be left unwritten), and where a second eager forward with that
argument made contiguous gives the model's outputs the same shapes, layouts and dtypes, the
block's class is swapped for one whose forward makes the argument contiguous first
(:func:`install`). In training mode, on PyTorch's route and in recorded programs the block
runs its own forward (its input as given, as eager does). So it does in a call of the model
whose options differ from the example's (:func:`gate`): the layouts were checked for the
example's call, and another (transformers' ``output_hidden_states=True``) may return the
stream itself, which eager returns strided (new-user audit).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from dnntune.torch._example import Example
from dnntune.torch._fresh_outputs import tensors_of
from dnntune.torch._recorded import LEAVES
from dnntune.torch._subclass import original_class, wrap_forward
from dnntune.torch._support import pytorch_route, tracing

__all__ = [
    "GATE",
    "MARKER",
    "find",
    "gate",
    "install",
    "install_all",
    "options_of",
    "strided_last",
]

#: the class attribute of a block that makes its first argument row-major
MARKER = "_dnntune_row_major_input"
#: the class attribute of a model whose forward says whether its call is the example's kind
GATE = "_dnntune_row_major_gate"
#: where that model keeps its example call's options (dnntune's state: never saved)
_OPTIONS = "_dnntune_row_major_options"
#: True inside a forward of such a model called with the example's options
_EXAMPLES_KIND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dnntune_row_major", default=False
)


def options_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a call is not its tensors' values or layouts: which arguments are tensors, each
    plain value itself, the type of anything else, and the keywords given."""
    return (tuple(_option(a) for a in args), tuple((k, _option(v)) for k, v in kwargs.items()))


def _option(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.Tensor
    if value is None or isinstance(value, bool | int | float | str):
        return (type(value), value)
    if isinstance(value, tuple | list):
        return (type(value), tuple(_option(v) for v in value[:8]), len(value))
    return type(value)


def strided_last(x: object) -> bool:
    """Whether ``x`` is a dense floating-point tensor of 2 or more dimensions whose last
    dimension (longer than 1) is not unit-strided, and not a channels-last image or volume."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
        return False
    if x.layout is not torch.strided or x.is_nested:
        # a sparse COO tensor's strides read 0, and ``contiguous()`` of one raises; a CSR or
        # nested tensor has none (``stride()`` raises)
        return False
    if x.shape[-1] <= 1 or x.stride(-1) == 1:
        return False
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return False
    return not (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d))


def _first_blocks(root: nn.Module) -> list[nn.Module]:
    """The first module of each run of two or more children of one class in a
    ``ModuleList`` or ``Sequential``."""
    firsts = []
    for container in root.modules():
        if not isinstance(container, nn.ModuleList | nn.Sequential):
            continue
        children = list(container.children())
        # the classes from before any optimize: a model optimized before has its first block
        # (and others) on classes made for it
        if len(children) >= 2 and original_class(type(children[0])) is original_class(
            type(children[1])
        ):
            firsts.append(children[0])
    return firsts


def _layouts(output: Any) -> list[tuple[Any, ...]]:
    """The shape, strides and dtype of every tensor in ``output`` (tuples, lists, dicts and
    transformers' output objects, which are dicts; any other object's attributes, a dataclass's
    fields), in order. Raises ``TypeError`` for an object whose tensors cannot be walked."""
    if isinstance(output, torch.Tensor):
        return [(tuple(output.shape), output.stride(), output.dtype)]
    if isinstance(output, dict):
        return [x for v in output.values() for x in _layouts(v)]
    if isinstance(output, tuple | list):
        return [x for v in output for x in _layouts(v)]
    if isinstance(output, LEAVES):
        return [(type(output),)]
    # a dataclass or another object of the user's: its tensors are outputs too (before, only
    # its type was compared, and a stream it held came out row-major where eager's was strided)
    tensors = tensors_of(output)
    if tensors is None:
        raise TypeError(f"the layouts of a {type(output).__name__} cannot be read")
    return [(type(output),), *(x for t in tensors for x in _layouts(t))]


def find(root: nn.Module, call: Callable[[nn.Module], Any]) -> list[nn.Module]:
    """The blocks whose first argument ``install`` should make row-major: one eager forward
    ``call(root)`` under ``no_grad`` finds them, a second confirms the model's outputs keep
    their layouts. None where a forward raises (the forwards ``optimize`` runs next raise it
    as before), its outputs hold an object whose tensors cannot be read, or nothing
    qualifies."""
    firsts = _first_blocks(root)
    if not firsts:
        return []
    found: list[nn.Module] = []
    # blocks that write into their first argument or return it (or a view of it): the caller
    # holds that tensor too, and a copy would leave it unwritten or no longer aliased
    aliased: list[nn.Module] = []
    versions: list[int] = []

    def called(module: nn.Module, args: tuple[Any, ...]) -> None:
        versions.append(args[0]._version if args and strided_last(args[0]) else -1)  # noqa: SLF001

    def seen(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        version = versions.pop()
        if not (args and strided_last(args[0])):
            return
        first = output[0] if isinstance(output, tuple | list) and output else output
        stream = args[0].untyped_storage().data_ptr()
        if args[0]._version != version or (  # noqa: SLF001
            isinstance(first, torch.Tensor) and first.untyped_storage().data_ptr() == stream
        ):
            aliased.append(module)
        elif (
            strided_last(first)
            and first.stride() == args[0].stride()  # the stream carries the layout on
            and module not in found
        ):
            found.append(module)

    hooks = [m.register_forward_pre_hook(called) for m in firsts]
    before = _forward(root, call, hooks + [m.register_forward_hook(seen) for m in firsts])
    found = [m for m in found if m not in aliased]
    if before is None or not found:
        return []

    def row_major(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].contiguous(), *args[1:])

    after = _forward(root, call, [m.register_forward_pre_hook(row_major) for m in found])
    return found if after == before else []


def _forward(
    root: nn.Module, call: Callable[[nn.Module], Any], handles: list[RemovableHandle]
) -> list[tuple[Any, ...]] | None:
    """The layouts of ``call(root)``'s outputs (under ``no_grad``, on PyTorch's route) with the
    hooks ``handles`` in place, removed after; None where it raises (or :func:`_layouts` does).

    On PyTorch's route, so that the forwards are eager's in a model optimized before too: there
    a block an earlier ``optimize`` made row-major ran its wrapper, its output no longer kept
    its input's layout, and (its class no longer its neighbours') the second ``optimize``'s
    report no longer listed it."""
    route = pytorch_route.on
    pytorch_route.on = True
    try:
        with torch.no_grad():
            return _layouts(call(root))
    except Exception:
        return None
    finally:
        pytorch_route.on = route
        for handle in handles:
            handle.remove()


def install(block: nn.Module) -> None:
    """Swap ``block``'s class for one whose forward makes its first argument row-major
    (``contiguous()``) where its last dimension is strided; in training mode, on PyTorch's
    route and in recorded programs it runs its own forward."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            # not in training mode, as no fusion runs there: dropout draws its mask in the
            # order of its input's memory, and a seeded training forward drew other masks
            # than eager's on the row-major stream (new-user audit)
            if (
                args
                and _EXAMPLES_KIND.get()
                and not (self.training or pytorch_route.on or tracing())
                and strided_last(args[0])
            ):
                args = (args[0].contiguous(), *args[1:])
            return original(self, *args, **kwargs)

        return forward

    wrap_forward(block, MARKER, wrap)


def gate(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Swap ``model``'s class for one whose forward lets its row-major blocks (:func:`install`)
    act only in calls with the options of the example call ``args``/``kwargs``
    (:func:`options_of`): other calls run the blocks as they are."""
    model.__dict__[_OPTIONS] = options_of(args, kwargs)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            kind = options_of(args, kwargs) == self.__dict__.get(_OPTIONS)
            token = _EXAMPLES_KIND.set(kind)
            try:
                return original(self, *args, **kwargs)
            finally:
                _EXAMPLES_KIND.reset(token)

        return forward

    wrap_forward(model, GATE, wrap)


def install_all(model: nn.Module, blocks: list[nn.Module], example: Example) -> list[str]:
    """:func:`gate` ``model`` on ``example``'s options and :func:`install` each of ``blocks``
    (:func:`find`'s); the report's line for each."""
    gate(model, example.args, example.kwargs)
    names = {id(m): n for n, m in model.named_modules()}
    lines = []
    for block in blocks:
        install(block)
        lines.append(
            f"{names.get(id(block), type(block).__name__)}: its input made row-major once "
            "(a residual stream with its last dimension strided)"
        )
    return lines
