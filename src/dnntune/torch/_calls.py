"""What every dnntune.torch op does around its kernel: argument checks, and running dnntune
or, when it cannot, PyTorch's own op with a one-time warning."""

from __future__ import annotations

import contextvars
import functools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from dnntune.errors import DnnTuneError
from dnntune.torch._memo import NATIVE, native_memo
from dnntune.torch._support import unsupported_reason, warn_fallback, warn_once
from dnntune.torch.graphs import ACTIVATIONS

if TYPE_CHECKING:
    from dnntune.torch.runtime import Kernel

__all__ = [
    "autocast_on",
    "check_activation",
    "declined",
    "grad_wanted",
    "guarded",
    "mixed",
    "pair",
    "prepared_call",
    "pytorch_when_flagged",
]

_log = logging.getLogger("dnntune.torch.functional")
T = TypeVar("T")

#: True while a module that ``optimize(..., refine=True)`` found faster on PyTorch's own ops
#: runs: every dnntune.torch op it calls runs PyTorch's op (``guarded`` returns the fallback)
_pytorch_forced: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dnntune_pytorch_forced", default=False
)
#: the instance attribute that marks such a module
PYTORCH_FLAG = "_dnntune_pytorch"
#: read first by every op's hot path (one global lookup, not two)
_grad_enabled = torch.is_grad_enabled
M = TypeVar("M", bound=Callable[..., Any])


def pytorch_when_flagged(method: M) -> M:
    """Run a DnnTune module's method with PyTorch's own ops when the module carries
    ``PYTORCH_FLAG`` (set by ``optimize(..., refine=True)``); otherwise as it is."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(PYTORCH_FLAG):
            return method(self, *args, **kwargs)
        token = _pytorch_forced.set(True)
        try:
            return method(self, *args, **kwargs)
        finally:
            _pytorch_forced.reset(token)

    return wrapper  # type: ignore[return-value]


def pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """``value`` (an int, or a sequence of one or two ints) as a pair; TypeError as PyTorch's
    ops raise for anything else (a float: PyTorch does not round it either)."""
    try:
        if not isinstance(value, tuple | list | torch.Size):
            return (operator.index(value), operator.index(value))  # type: ignore[arg-type]
        values = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {value!r}")
    return (values[0], values[1])


#: the reason of the route a call that wants gradients takes: PyTorch's own op, whose backward
#: autograd has. An expected route (a training step), logged at debug level, never a warning
#: (a training step through an optimized model warned once per pooling and attention op,
#: while norms, which the modules route before this, were quiet; new-user audit, session 15)
GRADIENT_ROUTE = "gradients wanted: PyTorch's own op, whose backward autograd runs"


def guarded(
    op: str,
    tensors: Sequence[torch.Tensor | None],
    run: Callable[[], T],
    fallback: Callable[[], T],
    extra_reason: str | None = None,
    memo: tuple[Any, ...] | None = None,
) -> T:
    """``run()``, or PyTorch's op (``fallback()``) with a one-time warning where dnntune
    cannot run the call. ``memo``, the call memo's key of the signature: where ``run`` failed
    (dnntune cannot run it), the signature is remembered to run PyTorch's op, so its later
    calls do not build and fail again (a 1-D ``linear`` weight cost 119 µs a call, PyTorch's
    op 2 µs; new-user audit)."""
    if _pytorch_forced.get():
        return fallback()  # this module runs faster on PyTorch's ops in the whole forward
    if extra_reason == GRADIENT_ROUTE:
        _log.debug("dnntune.torch.%s: %s", op, GRADIENT_ROUTE)
        return fallback()
    reason = extra_reason or unsupported_reason(tensors)
    failed = False
    if reason is None:
        if any(t is not None and t.numel() == 0 for t in tensors):
            # an empty batch (a detector's frame with no boxes): no graph has a zero-sized
            # dim, and PyTorch's op returns the empty result; an expected route, not a
            # failure, so it neither warns nor uses up the op's one warning. Before the graph
            # is built: building it and failing cost every such call 75-100 µs (a conv, a
            # layer norm; PyTorch's op 2 µs), since a failed signature is not remembered
            _log.debug("dnntune.torch.%s: an empty tensor: PyTorch's own op", op)
            return fallback()
        try:
            return run()
        except DnnTuneError as exc:
            reason = f"dnntune cannot run it ({exc})"
            _log.info("dnntune.torch.%s: %s", op, reason)
            failed = True
    # PyTorch's op first, the warning after it: where PyTorch's op refuses the call too (an
    # input of the wrong shape, a pool window larger than the input), the arguments are the
    # caller's error, which PyTorch's exception says; a warning that dnntune "cannot run it"
    # would blame dnntune and use up the op's one warning, so that a real failure later in
    # the process went unwarned (new-user audit: a wrong example-input shape in optimize)
    result = fallback()
    if failed and memo is not None:
        native_memo.remember(memo, NATIVE)  # it fails the same way every call
    if reason.startswith("dnntune cannot"):
        # one warning per op for every such failure, naming the first one's cause
        cause = reason.removeprefix("dnntune cannot run it (").removesuffix(")")
        warn_once(
            (op, "dnntune cannot run it"),
            f"dnntune.torch.{op}: dnntune cannot run it ({_first_line(cause)}); using "
            "PyTorch's own op for such calls",
            3,
        )
    else:
        warn_fallback(op, reason)
    return result


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def check_activation(activation: str | None) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}"
        )


def grad_wanted(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


Views = Callable[..., Sequence["torch.Tensor | None"]]


def prepared_call(
    kernel: Kernel,
    raw: Sequence[torch.Tensor | None],
    derived: Sequence[torch.Tensor | None],
    views: Views,
    out_shape: Sequence[int] | None = None,
) -> Callable[..., torch.Tensor]:
    """What a signature's later calls run: ``call(*raw) -> output``, for a one-output kernel.

    ``raw`` are the op's tensor arguments of the first call and ``derived`` the kernel's
    inputs made from them, position by position (None where absent); ``views(*raw)`` makes
    ``derived`` again. When the plan reads only addresses (``Kernel.takes_pointers``) and every
    derived tensor starts where its raw one does (a view, not a copy: the same for every call
    of the signature, whose layouts are fixed), the raw tensors are passed as they are and the
    output is allocated in ``out_shape`` directly. Otherwise the views are made per call and
    the output reshaped to ``out_shape``.
    """
    present = tuple(i for i, t in enumerate(derived) if t is not None)
    same = all(
        d is None or (r is not None and d.data_ptr() == r.data_ptr())
        for r, d in zip(raw, derived, strict=True)
    )
    arity = len(derived)
    if same and kernel.takes_pointers and (out_shape is None or _row_major(kernel)):
        return kernel.output_call(present, arity, None, out_shape)
    return kernel.output_call(present, arity, views, out_shape)


def _row_major(kernel: Kernel) -> bool:
    from dnntune.graph.tensor import contiguous_strides

    _, dims, strides, _ = kernel.out_layouts[0]
    return list(strides) == contiguous_strides(list(dims))


#: True under ``torch.autocast`` (any device): PyTorch's ops then choose each op's type, which
#: dnntune's graphs, built for their inputs' types, would not follow
def _autocast_cpu_or_cuda() -> bool:
    return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")


autocast_on: Callable[[], bool] = getattr(  # one C call where PyTorch has it
    torch._C,  # noqa: SLF001
    "_is_any_autocast_enabled",
    _autocast_cpu_or_cuda,
)


def mixed(first: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Tensors of several dtypes, which PyTorch's op refuses for these arguments."""
    return any(t is not None and t.dtype != first.dtype for t in others)


def declined(
    op: str,
    memo: tuple[Any, ...] | None,
    tensors: list[torch.Tensor | None],
    fallback: Callable[[], torch.Tensor],
    reason: str,
) -> torch.Tensor:
    """PyTorch's op for tensors dnntune's plans do not take (:func:`unsupported_kind`), with the
    one-time warning; later calls of the signature go to PyTorch's op from the memo (its key
    holds the tensors' types; a sparse COO tensor's all-zero strides may also be a broadcast
    dense tensor's, which then runs PyTorch's op too: the same result)."""
    if memo is not None:
        native_memo.remember(memo, NATIVE)
    return guarded(op, tensors, fallback, fallback, reason)
