"""When a call cannot run on dnntune: a one-time warning, then PyTorch's own op."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import torch
import torch.fx._symbolic_trace as _fx_trace
from torch import fx, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = [
    "SUPPORTED_DTYPES",
    "OPTIMIZER_STEPS",
    "DnnTuneFallbackWarning",
    "foreign_capture",
    "own_recording",
    "pytorch_route",
    "recorded",
    "residual_fits",
    "tracing",
    "unsupported_kind",
    "unsupported_reason",
    "warn_fallback",
    "warn_once",
]

SUPPORTED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
_DEVICE_TYPES = frozenset({"cpu", "cuda"})
_TENSOR, _PARAMETER = torch.Tensor, nn.Parameter
_STRIDED = torch.strided

#: optimizer steps taken in this process (a global step hook): a fused optimizer (``fused=True``)
#: updates parameters in place without counting their versions, so a value dnntune derived from
#: them on the host (a batch-norm fold, and a CUDA graph holding one) is made again after a step
OPTIMIZER_STEPS = [0]


def _count_step(*_: object) -> None:
    OPTIMIZER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_step)

#: True while dnntune itself records a CUDA graph of an installed module (its warm-up calls and
#: its capture, :mod:`.cuda_graphs`): values it derived from the weights and holds (a
#: batch-norm fold) are tracked by that recording, which is made again when they change
own_recording: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dnntune_recording", default=False
)
_capturing = torch.cuda.is_current_stream_capturing


class _PyTorchRoute(threading.local):
    """Per thread: ``on`` while an optimized model's forward runs as PyTorch's own, the route
    a race chose or tries for its inputs (:mod:`._route_race`): every module dnntune swapped,
    fused or wrapped then runs the forward of the class it stands in for, first thing, and
    the functional routers stay off, so the call runs PyTorch's code as an unoptimized model
    does (one attribute read per module call on dnntune's route)."""

    on = False


pytorch_route = _PyTorchRoute()


def foreign_capture(t: torch.Tensor) -> bool:
    """Whether ``t`` is a CUDA tensor and the current CUDA stream is being captured into a graph
    that is not one of dnntune's own recordings (a user's ``torch.cuda.graph`` around an
    optimized model): such a graph reads what dnntune hands its kernels at the addresses of the
    capture, and nothing of dnntune's runs at its replays."""
    return t.is_cuda and _capturing() and not own_recording.get()


_compiling = torch.compiler.is_compiling  # the public check: Dynamo reads it as a constant
_jit_tracing = torch._C._is_tracing  # noqa: SLF001  (torch.jit.is_tracing less a Python call)
_functorch_transforms = torch._C._are_functorch_transforms_active  # noqa: SLF001


def tracing() -> bool:
    """True while PyTorch records a program instead of running it: ``torch.compile`` and
    ``torch.export`` (Dynamo, and non-strict export on fake tensors), ``torch.jit.trace``,
    ``torch.fx.symbolic_trace``. dnntune's ops then run PyTorch's own (an expected route: no
    warning), so the recorded program is PyTorch's: a cached tensor (a folded batch norm) would
    be recorded as a constant, and a fake tensor has no address for dnntune's plans. (A CUDA
    graph's capture is no such recording: it records the kernels dnntune launches.)

    Also true inside a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``, ``jvp``): its
    tensors are wrappers (a batched tensor's logical shape is one example's) that only
    PyTorch's ops know how to transform; a plan given one ran as if on the plain tensor, or
    failed inside the user's forward (new-user audit: ``vmap`` of an optimized CNN raised
    ExecutionError on a kernel-path plan, its signature taken from the call memo).

    Runs on every op's call: 0.2-0.25 µs on this repo's CPU machine. Dynamo's check comes
    first: under Dynamo it is a constant True that ends the expression, so the others,
    module globals Dynamo would guard on, are never traced.
    """
    return (
        _compiling()
        or _jit_tracing()
        or _fx_trace._is_fx_tracing_flag  # noqa: SLF001
        or _functorch_transforms()
    )


def recorded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """While ``torch.fx`` traces symbolically (``optimize``'s fusion trace too) with a proxy
    among the arguments: ``op``'s call recorded as one node of the graph, so a forward made
    from the graph calls the dnntune op as the traced code did; else None. The dnntune ops
    call it once :func:`tracing` is true."""
    if not _fx_trace._is_fx_tracing_flag:  # noqa: SLF001
        return None
    proxies: list[fx.Proxy] = []

    def find(value: Any) -> Any:
        if isinstance(value, fx.Proxy):
            proxies.append(value)
        return value

    fx.node.map_aggregate(args, find)
    fx.node.map_aggregate(kwargs, find)
    if not proxies:
        return None
    return proxies[0].tracer.create_proxy("call_function", op, args, kwargs)


class DnnTuneFallbackWarning(UserWarning):
    """dnntune.torch ran PyTorch's own op because dnntune cannot run this call."""


_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def unsupported_kind(tensors: Sequence[torch.Tensor | None]) -> str | None:
    """Why these tensors are not the kind dnntune's plans take, or None: each must be a plain
    ``torch.Tensor`` or ``nn.Parameter`` (not a subclass: a ``__torch_function__`` or wrapper
    subclass such as DTensor, a jagged nested tensor, a fake tensor; PyTorch's op keeps their
    type), not nested and strided (not sparse or mkldnn). A first call of a signature checks it
    before it reads a shape (a nested tensor of the strided layout has none)."""
    for t in tensors:
        if t is None:
            continue
        cls = type(t)
        if cls is not _TENSOR and cls is not _PARAMETER:
            return f"tensors of type {cls.__name__} are not supported (torch.Tensor is)"
        if t.is_nested:
            return "nested tensors are not supported"
        if t.layout is not _STRIDED:
            return f"tensors of layout {t.layout} are not supported (torch.strided is)"
        if t.is_neg():
            return (
                "lazy negative views (z.conj().imag, torch._neg_view) are not supported: a "
                "plan reads the memory, which holds the values before the negation"
            )
    return None


def lazy_view(*tensors: torch.Tensor | None) -> bool:
    """A lazy negative view among ``tensors`` (:func:`unsupported_kind` names it): the call
    memo's key does not hold it, so such a call never takes the memo."""
    for t in tensors:  # noqa: SIM110  (a loop: a generator for any() costs more per call)
        if t is not None and t.is_neg():
            return True
    return False


def unsupported_reason(tensors: Sequence[torch.Tensor | None]) -> str | None:
    """Why these tensors cannot go through dnntune (kind, device, dtype), or None.

    Runs on the first call of a signature (on every batch_norm call): one pass, no set, each
    tensor's device read once.
    """
    first: torch.device | None = None
    for t in tensors:
        if t is None:
            continue
        cls = type(t)
        if (
            (cls is not _TENSOR and cls is not _PARAMETER)
            or t.is_nested
            or t.layout is not _STRIDED
        ):
            return unsupported_kind((t,))
        device = t.device
        if device.type not in _DEVICE_TYPES:
            return f"tensors on {device.type} are not supported (cpu and cuda are)"
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {t.dtype} is not supported (float32, float16, bfloat16 are)"
        if first is None:
            first = device
        elif device != first:
            devices = {str(x.device) for x in tensors if x is not None}
            return f"tensors are on different devices: {sorted(devices)}"
    return None


def warn_fallback(op: str, reason: str) -> None:
    """Warn once per (op, reason) that PyTorch's op is used instead."""
    warn_once(
        (op, reason), f"dnntune.torch.{op}: {reason}; using PyTorch's own op for such calls", 4
    )


def warn_once(key: tuple[str, str], message: str, stacklevel: int = 3) -> None:
    """A ``DnnTuneFallbackWarning`` with ``message``, once per ``key`` in this process,
    attributed to the caller's own line: the first frame outside dnntune and PyTorch (a
    ``dtt.linear(...)`` call, the line of a model's forward that called the layer), or
    ``stacklevel`` where there is none. A fixed stack level named a line of dnntune's own
    (``functional.py:361``), so the user could not tell which of their calls fell back
    (new-user audit)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, DnnTuneFallbackWarning, stacklevel=_callers_level(stacklevel))


#: where dnntune's and PyTorch's own source files are: frames there are not the user's
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (sys.modules["dnntune"].__file__, torch.__file__)
    if path is not None
)


#: how the file name of torch.fx's generated code begins (``torch.fx.graph_module``)
_FX_CODE = "<eval_with_key>"


def _callers_level(default: int) -> int:
    """The ``stacklevel`` for :func:`warn_once`'s ``warnings.warn`` that names the first frame
    outside dnntune and PyTorch, or ``default`` (relative to ``warn_once``) if there is none."""
    frame: FrameType | None = sys._getframe(2)  # noqa: SLF001  (the caller of warn_once)
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        # a forward optimize rewrote runs as torch.fx's generated code ("<eval_with_key>.3
        # from model.py:12 in forward"), whose line reads dnntune's names
        # (``dnntune_torch_routing_scaled_dot_product_attention(transpose, ...)``): the
        # user's line is the one that called that module (new-user audit)
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith(_FX_CODE):
            return level
        frame = frame.f_back
        level += 1
    return default


def reset_warnings() -> None:
    with _lock:
        _warned.clear()


@contextlib.contextmanager
def callers_rng_kept(device: torch.device) -> Iterator[None]:
    """No gradient, and the caller's random numbers left as they were: tuning and timing
    (their inputs, a verifier's draws) take none of them (a dropout after a tuned layer drew
    other masks; new-user audit)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        yield


def residual_fits(x: torch.Tensor, residual: torch.Tensor, out_features: int) -> bool:
    """Whether ``residual`` can be the epilogue of a linear layer of ``out_features`` on ``x``:
    the output's shape, ``x``'s type and device, and contiguous (eager's add keeps a residual's
    layout, where the fused GEMM's output is contiguous)."""
    try:
        shaped = residual.shape == (*x.shape[:-1], out_features)
    except RuntimeError:  # a nested tensor of the strided layout has no shape
        return False
    return (
        shaped
        and residual.dtype == x.dtype
        and residual.device == x.device
        and residual.is_contiguous()
    )
