"""Whole-forward CUDA graphs for an optimized module (``optimize(..., cuda_graph=True)``).

With every layer's plan chosen, what is left of an inference forward on the GPU is host work:
Python, dispatch and one launch per kernel. For small batches (LLM decode) that host work, not
the kernels, sets the speed. This module records the forward once per input signature as a
CUDA graph and replays it, as ``torch.compile(mode="max-autotune")`` and
``torch.cuda.make_graphed_callables`` do.

Rules (when any fails, the module runs its ordinary forward, uncaptured):

* inference only: the module is in eval mode and autograd is off (``torch.no_grad()`` or
  ``torch.inference_mode()``), or no parameter and no input requires grad;
* every tensor argument is on the same CUDA device, and there is at least one;
* non-tensor arguments are hashable; they and each tensor's shape, strides and dtype form the
  signature, and each signature is captured once (at most ``max_graphs``, least recently used
  dropped).

Inputs are copied into the graph's static buffers before each replay; outputs are cloned so a
later call never overwrites a result the caller holds. The parameters' and buffers' storage and
version counters are part of the check: an optimizer step, ``load_state_dict`` or any in-place
change re-records the graph on the next call, so a replay never runs with stale weights (the
batch-norm folding of ``optimize`` is recomputed inside the new capture).
"""

from __future__ import annotations

import contextlib
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from dnntune.torch._subclass import wrap_forward

__all__ = ["GraphedForward", "forget", "graphs_of", "install"]

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
        self.captures: OrderedDict[Hashable, _Capture] = OrderedDict()
        self.pool: Any = None
        self.stream: torch.cuda.Stream | None = None
        self.replays = 0
        self.records = 0
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.captures.clear()


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


class _Weights:
    """What a capture baked in: every parameter, buffer and child slot of the module, and the
    storage and version of each CUDA tensor, snapshotted once when the graph is recorded.

    ``unchanged`` runs on every call, so it walks flat lists with C-level maps instead of
    ``module.parameters()`` (a recursive generator: about 0.5 ms for a ResNet-50's 371
    tensors, against about 0.07 ms here, measured on the CPU).
    """

    __slots__ = ("_keys", "_owners", "_ptrs", "_tensors", "_values", "_versions")

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

    def _read(self, getter: Callable[[torch.Tensor], int]) -> tuple[int, ...]:
        return tuple(map(getter, self._tensors))

    def unchanged(self) -> bool:
        """No slot holds another object, and no tensor has new storage or was written."""
        current = list(map(dict.get, self._owners, self._keys))
        return (
            all(map(operator.is_, current, self._values))
            and self._read(_VERSION) == self._versions
            and self._read(_DATA_PTR) == self._ptrs
        )


_VERSION: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
_DATA_PTR: Callable[[torch.Tensor], int] = torch.Tensor.data_ptr


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


def _wants_graph(module: nn.Module, tensors: list[torch.Tensor]) -> bool:
    if module.training:
        return False
    if not torch.is_grad_enabled():
        return True
    return not any(t.requires_grad for t in tensors) and not any(
        p.requires_grad for p in module.parameters()
    )


def _record(
    state: GraphedForward,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    device: torch.device,
    weights: _Weights,
) -> _Capture:
    if state.pool is None:
        state.pool = torch.cuda.graph_pool_handle()
    if state.stream is None or state.stream.device != device:
        state.stream = torch.cuda.Stream(device)
    # normal (not inference) tensors, so a later call under either mode may copy into them
    with torch.inference_mode(False):
        static_inputs = [t.detach().clone() for t in tensors]
    it = iter(static_inputs)
    static_flat = [next(it) if isinstance(x, torch.Tensor) else x for x in flat]
    args, kwargs = tree_unflatten(static_flat, spec)
    stream = state.stream
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(WARMUP_CALLS):
            forward(*args, **kwargs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with (
        torch.no_grad(),
        _own_cublas_workspace(),
        torch.cuda.graph(graph, pool=state.pool, stream=stream, capture_error_mode="thread_local"),
    ):
        static_output = forward(*args, **kwargs)
    state.records += 1
    return _Capture(graph, static_inputs, static_output, weights)


@contextlib.contextmanager
def _own_cublas_workspace() -> Iterator[None]:
    """Make the capture allocate cuBLAS's workspace in the graph's own memory pool.

    cuBLAS keeps one workspace per (handle, stream), allocated on first use and kept. Without
    this, the graph records the workspace the warm-up calls allocated outside the pool; when
    anything clears cuBLAS's workspaces (``torch.compile``'s CUDA graphs do, before and after
    each recording) and the allocator then releases that memory (``torch.cuda.graph`` empties
    the cache), the next replay reads unmapped memory: "CUDA error: unspecified launch
    failure" (session 5, a prefill block next to a max-autotune copy of it). Cleared before the
    capture, the workspace is allocated inside it (in the pool, alive as long as the graph);
    cleared after, no uncaptured call shares it.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def call(module: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run ``forward`` through a captured graph where the rules allow, else directly."""
    flat, spec = tree_flatten((args, kwargs))
    found = _signature(flat)
    if found is None:
        return forward(*args, **kwargs)
    key, tensors, device = found
    if not _wants_graph(module, tensors):
        return forward(*args, **kwargs)
    state = graphs_of(module)
    with state.lock:
        capture = state.captures.get(key)
        if capture is None or not capture.weights.unchanged():
            state.captures.pop(key, None)
            capture = _record(state, forward, spec, flat, tensors, device, _Weights(module))
            state.captures[key] = capture
            while len(state.captures) > state.max_graphs:
                state.captures.popitem(last=False)
        state.captures.move_to_end(key)
        for static, value in zip(capture.static_inputs, tensors, strict=True):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)
        capture.graph.replay()
        state.replays += 1
        return tree_map(_clone, capture.static_output)


def install(module: nn.Module) -> None:
    """Give ``module`` a forward that replays CUDA graphs (its class is swapped for a subclass,
    so parameters, buffers and state_dict keys are unchanged; ``copy.deepcopy`` gives a copy
    that records its own graphs)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return call(self, lambda *a, **k: original(self, *a, **k), args, kwargs)

        return forward

    wrap_forward(module, "_dnntune_graphed", wrap)
