"""Whole-forward CUDA graphs for an optimized module (``optimize(..., cuda_graph=True)``).

With every layer's plan chosen, what is left of an inference forward on the GPU is host work:
Python, dispatch and one launch per kernel. For small batches (LLM decode) that host work, not
the kernels, sets the speed. This module records the forward once per input signature as a
CUDA graph and replays it, as ``torch.compile(mode="max-autotune")`` and
``torch.cuda.make_graphed_callables`` do.

Rules (when any fails, the module runs its ordinary forward, uncaptured):

* inference: the module is in eval mode and no gradient is wanted (``torch.no_grad()``,
  ``torch.inference_mode()``, or no parameter and no input requires grad);
* training: gradients are wanted; the forward and the backward of its outputs are recorded as
  two graphs and replayed through one autograd function (``_train_graphs``, its own rules);
  train mode without autograd runs uncaptured;
* every tensor argument is on the same CUDA device, and there is at least one;
* non-tensor arguments are hashable; they, each tensor's shape, strides, dtype and
  requires_grad, the mode and the autocast state form the signature, and each signature is
  captured once (at most ``max_graphs``, least recently used dropped);
* a forward that cannot be recorded (it reads a value on the host, say) warns once and runs
  uncaptured for that signature from then on: never an error in the user's forward.

Inputs are copied into the graph's static buffers before each replay; outputs are cloned so a
later call never overwrites a result the caller holds. The parameters' and buffers' storage and
version counters are part of the inference check: an optimizer step, ``load_state_dict`` or any
in-place change re-records the graph on the next call, so a replay never runs with stale weights
(the batch-norm folding of ``optimize`` is recomputed inside the new capture). A buffer the
forward itself writes (a KV cache, a counter) is put back after the warm-up calls of a
recording, so each call changes it once, and its writes are part of the graph: they re-record
nothing. A training capture reads the parameters where they are (nothing is folded in
training), so only new tensors or storage re-record it.
"""

from __future__ import annotations

import contextvars
import logging
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from dnntune.torch._capture import (
    NotCapturable,
    restore_rng_on_failure,
    static_copies,
    warm_up,
)
from dnntune.torch._capture import own_cublas_workspace as _own_cublas_workspace
from dnntune.torch._subclass import wrap_forward
from dnntune.torch._support import warn_once
from dnntune.torch._train_graphs import TrainCapture, record_training, replay_training

__all__ = [
    "GraphedForward",
    "attach",
    "detach",
    "forget",
    "graphs_of",
    "install",
    "running_uncaptured",
]

_log = logging.getLogger(__name__)

#: True while an installed module's forward runs uncaptured (CPU, train mode without
#: gradients, a signature that cannot be recorded): its layers pay their host cost, so
#: ``optimize`` puts in force the settings that rank on call latency (issue 22)
_uncaptured: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dnntune_uncaptured", default=False
)


def running_uncaptured() -> bool:
    """Whether the forward running now is an installed module's uncaptured one."""
    return _uncaptured.get()


def _run_uncaptured(forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    token = _uncaptured.set(True)
    try:
        return forward(*args, **kwargs)
    finally:
        _uncaptured.reset(token)


#: warmup calls on the capture stream before recording (plans, handles and Triton kernels are
#: built there, outside the capture)
WARMUP_CALLS = 2


@dataclass
class _Capture:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_output: Any
    weights: _Weights


class GraphedForward:
    """The captured graphs of one module, keyed by input signature."""

    def __init__(self, max_graphs: int = 16) -> None:
        self.max_graphs = max_graphs
        self.captures: OrderedDict[Hashable, _Capture | TrainCapture] = OrderedDict()
        self.pool: Any = None
        self.stream: torch.cuda.Stream | None = None
        self.replays = 0
        self.records = 0
        #: signatures whose recording failed: they run uncaptured, without trying again
        self.uncapturable: set[Hashable] = set()
        self.lock = threading.Lock()

    def recording_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The side stream recordings run on (and the memory pool they share), made once."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        if self.stream is None or self.stream.device != device:
            self.stream = torch.cuda.Stream(device)
        return self.stream

    def clear(self) -> None:
        with self.lock:
            self.captures.clear()
            self.uncapturable.clear()


_graphs: weakref.WeakKeyDictionary[nn.Module, GraphedForward] = weakref.WeakKeyDictionary()
_graphs_lock = threading.Lock()


def graphs_of(module: nn.Module) -> GraphedForward:
    """The capture state of ``module`` (created on first use; never copied with the module)."""
    with _graphs_lock:
        state = _graphs.get(module)
        if state is None:
            state = _graphs[module] = GraphedForward()
        return state


def forget(module: nn.Module) -> None:
    """Drop ``module``'s captured graphs and their memory (``optimize`` reverting a model)."""
    with _graphs_lock:
        state = _graphs.pop(module, None)
    if state is not None:
        state.clear()


def detach(module: nn.Module) -> GraphedForward | None:
    """Take ``module``'s capture state away, graphs kept (to :func:`attach` it again)."""
    with _graphs_lock:
        return _graphs.pop(module, None)


def attach(module: nn.Module, state: GraphedForward | None) -> None:
    """Give ``module`` back a state that :func:`detach` took (None: nothing to give)."""
    if state is not None:
        with _graphs_lock:
            _graphs[module] = state


class _Weights:
    """What a capture baked in: every parameter, buffer and child slot of the module, and the
    storage and version of each CUDA tensor, snapshotted once when the graph is recorded.

    ``unchanged`` runs on every call, so it walks flat lists with C-level maps instead of
    ``module.parameters()`` (a recursive generator: about 0.5 ms for a ResNet-50's 371
    tensors, against about 0.07 ms here, measured on the CPU).
    """

    __slots__ = ("_grads", "_keys", "_owners", "_ptrs", "_tensors", "_values", "_versions")

    def __init__(self, module: nn.Module) -> None:
        owners: list[dict[str, Any]] = []
        keys: list[str] = []
        values: list[Any] = []
        for m in module.modules():
            for slots in (m._parameters, m._buffers, m._modules):
                for key, value in slots.items():
                    owners.append(slots)
                    keys.append(key)
                    values.append(value)
        self._owners, self._keys, self._values = owners, keys, values
        self._tensors = [
            t for t in values if isinstance(t, torch.Tensor) and t.device.type == "cuda"
        ]
        self._ptrs = self._read(_DATA_PTR)
        self._versions = self._read(_VERSION)
        self._grads = self._read(_REQUIRES_GRAD)

    def _read(self, getter: Callable[[torch.Tensor], Any]) -> tuple[Any, ...]:
        return tuple(map(getter, self._tensors))

    def settle(self) -> None:
        """Take the tensors' versions as they are now (after a recording's own writes)."""
        self._versions = self._read(_VERSION)

    def unchanged(self, written_ok: bool = False) -> bool:
        """No slot holds another object, and no tensor has new storage or was written.

        ``written_ok``: in-place writes are fine (a training capture reads the parameters
        where they are, so an optimizer step needs no new recording; nothing is folded in
        training), but which parameters require grad must not have changed.
        """
        current = list(map(dict.get, self._owners, self._keys))
        if not all(map(operator.is_, current, self._values)):
            return False
        if self._read(_DATA_PTR) != self._ptrs:
            return False
        if written_ok:
            return self._read(_REQUIRES_GRAD) == self._grads
        return self._read(_VERSION) == self._versions


_VERSION: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
_DATA_PTR: Callable[[torch.Tensor], int] = torch.Tensor.data_ptr
_REQUIRES_GRAD: Callable[[torch.Tensor], bool] = operator.attrgetter("requires_grad")


def _signature(
    flat: list[Any],
) -> tuple[Hashable, list[torch.Tensor], torch.device] | None:
    key: list[Hashable] = []
    tensors: list[torch.Tensor] = []
    device: torch.device | None = None
    for item in flat:
        if isinstance(item, torch.Tensor):
            if item.device.type != "cuda" or (device is not None and item.device != device):
                return None
            device = item.device
            tensors.append(item)
            key.append((tuple(item.shape), item.stride(), item.dtype, item.requires_grad))
        else:
            try:
                hash(item)
            except TypeError:
                return None
            key.append(("value", type(item), item))
    if device is None:
        return None
    return tuple(key), tensors, device


class _Mode(StrEnum):
    """What a call records: an inference forward, or a training forward and its backward."""

    INFERENCE = "inference"
    TRAINING = "training"


def _graph_mode(module: nn.Module, tensors: list[torch.Tensor]) -> _Mode | None:
    """INFERENCE (eval mode, no gradient wanted), TRAINING (gradients wanted: the forward
    and its backward are captured) or None (train mode without gradients: run uncaptured)."""
    wants_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or any(p.requires_grad for p in module.parameters())
    )
    if wants_grad:
        return _Mode.TRAINING
    return None if module.training else _Mode.INFERENCE


def _autocast_state() -> tuple[Any, ...]:
    """Autocast changes what a forward records: part of every signature."""
    if not torch.is_autocast_enabled("cuda"):
        return ()
    return ("autocast", torch.get_autocast_dtype("cuda"))


#: a recording copies the module's CUDA buffers only up to this many bytes in all
SNAPSHOT_LIMIT_BYTES = 512 << 20


def _buffer_snapshot(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of what the warm-up calls may write besides the outputs (a counter or cache the
    forward keeps in a buffer), put back after the recording so that the call changes it once,
    in its replay. Buffers over :data:`SNAPSHOT_LIMIT_BYTES` in all (an LLM's preallocated KV
    cache) are not copied: a cache written at fixed positions is written the same way again by
    the replay."""
    buffers = [b for b in module.buffers() if b.is_cuda]
    total = sum(b.numel() * b.element_size() for b in buffers)
    if total > SNAPSHOT_LIMIT_BYTES:
        _log.info(
            "dnntune.torch: %s's buffers (%.1f GiB) are not copied around its CUDA-graph recording",
            type(module).__name__,
            total / 2**30,
        )
        return []
    return [(b, b.clone()) for b in buffers]


def _record(
    module: nn.Module,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    pool: Any,
    stream: torch.cuda.Stream,
    weights: _Weights,
) -> _Capture:
    device = stream.device
    static_inputs, args, kwargs = static_copies(flat, spec, tensors, keep_grad=False)
    saved = _buffer_snapshot(module)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream), torch.no_grad():
            # a forward that waits for the device here is recorded all the same: it may wait
            # only when not recorded (as a plain torch.cuda.graph capture finds); if it waits
            # in the recording too, the recording fails and the signature runs uncaptured
            sync = warm_up(WARMUP_CALLS, lambda: forward(*args, **kwargs), refuse_syncs=False)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with (
                torch.no_grad(),
                restore_rng_on_failure(device),
                _own_cublas_workspace(),
                torch.cuda.graph(
                    graph, pool=pool, stream=stream, capture_error_mode="thread_local"
                ),
            ):
                static_output = forward(*args, **kwargs)
        except Exception as exc:
            if sync is None:
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            raise NotCapturable(
                f"the forward waits for the device ({sync}), in its recording too "
                f"({type(exc).__name__}: {first})"
            ) from exc
        if sync is not None:
            _log.info(
                "dnntune.torch: %s's forward waits for the device when not recorded (%s); "
                "its recording does not, and replays",
                type(module).__name__,
                sync,
            )
    finally:
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return _Capture(graph, static_inputs, static_output, weights)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def call(module: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run ``forward`` through a captured graph where the rules allow, else directly."""
    flat, spec = tree_flatten((args, kwargs))
    found = _signature(flat)
    if found is None:
        return _run_uncaptured(forward, args, kwargs)
    sig, tensors, device = found
    mode = _graph_mode(module, tensors)
    if mode is None:
        return _run_uncaptured(forward, args, kwargs)
    key = (mode, module.training, _autocast_state(), sig)
    state = graphs_of(module)
    training = mode is _Mode.TRAINING
    with state.lock:
        if key in state.uncapturable:
            return _run_uncaptured(forward, args, kwargs)
        capture = state.captures.get(key)
        if isinstance(capture, TrainCapture) and capture.pending:
            # the last replay's backward is still due: its activations must stay (a moment's
            # detour, not how this signature runs: its layers keep the replay's settings)
            return forward(*args, **kwargs)
        if capture is None or not capture.weights.unchanged(written_ok=training):
            state.captures.pop(key, None)
            try:
                capture = _record_any(state, module, forward, spec, flat, tensors, device, mode)
            except Exception as exc:  # never a crash in the user's forward: run it uncaptured
                state.uncapturable.add(key)
                _warn_uncapturable(module, mode, exc)
                return _run_uncaptured(forward, args, kwargs)
            state.captures[key] = capture
            while len(state.captures) > state.max_graphs:
                state.captures.popitem(last=False)
        state.captures.move_to_end(key)
        state.replays += 1
        if isinstance(capture, TrainCapture):
            return replay_training(capture, tensors)
        for static, value in zip(capture.static_inputs, tensors, strict=True):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)
        capture.graph.replay()
        return tree_map(_clone, capture.static_output)


def _record_any(
    state: GraphedForward,
    module: nn.Module,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    device: torch.device,
    mode: _Mode,
) -> _Capture | TrainCapture:
    weights = _Weights(module)
    stream = state.recording_stream(device)
    capture: _Capture | TrainCapture
    if mode is _Mode.INFERENCE:
        capture = _record(module, forward, spec, flat, tensors, state.pool, stream, weights)
        # the forward's own in-place writes (a KV cache it keeps in a buffer; the warm-up's,
        # put back) are part of the graph: a change to re-record for is one made after this
        weights.settle()
    else:
        capture = record_training(
            module, forward, spec, flat, tensors, state.pool, stream, WARMUP_CALLS, weights
        )
    state.records += 1
    return capture


def _warn_uncapturable(module: nn.Module, mode: _Mode, exc: Exception) -> None:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    name = type(module).__name__
    if module.__dict__.get("_dnntune_graph_auto"):
        # cuda_graph="auto" chose replay where it records: running uncaptured is a result
        _log.info(
            "dnntune.torch: %s's %s forward cannot be recorded as a CUDA graph (%s: %s); "
            "it runs uncaptured",
            name,
            mode.value,
            type(exc).__name__,
            reason,
        )
        return
    warn_once(
        ("cuda_graph", f"{name}:{mode.value}:{reason}"),
        f"dnntune.torch (cuda_graph=True): {name}'s {mode.value} forward cannot be recorded as a "
        f"CUDA graph ({type(exc).__name__}: {reason}); calls with these input shapes run "
        "uncaptured",
        stacklevel=5,
    )


def install(module: nn.Module) -> None:
    """Give ``module`` a forward that replays CUDA graphs (its class is swapped for a subclass,
    so parameters, buffers and state_dict keys are unchanged; ``copy.deepcopy`` gives a copy
    that records its own graphs)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return call(self, lambda *a, **k: original(self, *a, **k), args, kwargs)

        return forward

    wrap_forward(module, "_dnntune_graphed", wrap)
