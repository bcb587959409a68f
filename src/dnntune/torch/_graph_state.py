"""The capture state of modules whose forward ``cuda_graphs`` records: per module, its
recorded graphs (one per input signature), the memory pool its recordings share with its
pieces, its counters, and the registry that keeps that state beside the module (never copied
with it)."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import InitVar, dataclass
from typing import Any

import torch
from torch import nn

from dnntune.torch._baked import Parameters, Weights
from dnntune.torch._fresh_outputs import FreshOutput
from dnntune.torch._static_caches import Held
from dnntune.torch._train_graphs import TrainCapture

__all__ = [
    "Capture",
    "GraphedForward",
    "Pool",
    "attach",
    "detach",
    "forget",
    "graphs_of",
    "recorded_pieces",
]


@dataclass
class Capture:
    """One inference recording: the graph, its static inputs and outputs, what it read."""

    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_output: Any
    weights: Weights
    #: the forward wrote none of the module's tensors while it was recorded (no counter, no
    #: cache in a buffer): a replay launched before the check that the weights are unchanged
    #: writes only the graph's own memory, so the check may run while the GPU computes
    #: (``cuda_graphs.call``); a replay that finds them changed is dropped and recorded again
    pure: bool = False
    #: where the call's static caches are among its flattened arguments
    #: (:mod:`dnntune.torch._static_caches`): the output hands the caller's own back
    caches: tuple[int, ...] = ()
    #: the recorded call's static caches, in that order (not kept: no recording holds a
    #: cache; its memory is held apart, ``GraphedForward.held_caches``)
    given: InitVar[Sequence[Any]] = ()

    def __post_init__(self, given: Sequence[Any]) -> None:
        self._fresh = FreshOutput(self.static_output, given)
        self.static_output = None  # the FreshOutput holds what it needs (never a given cache)

    def output(self, flat: list[Any] | None = None) -> Any:
        """The outputs for the caller: rebuilt around clones of the graph's output tensors, so
        that the next replay never overwrites a result the caller holds (a cache object in
        them copied whole: :mod:`dnntune.torch._fresh_outputs`; ``flat``, the call's
        flattened arguments, where it was given static caches: those handed back)."""
        if self.caches:
            assert flat is not None
            return self._fresh.make([flat[i] for i in self.caches])
        return self._fresh.make()


class Pool:
    """The memory pool a module's recordings share, with its pieces (None: make one)."""

    __slots__ = ("handle", "stream")

    def __init__(self) -> None:
        self.handle: Any = None
        #: the stream of the last replay of any graph in the pool, as
        #: ``torch._C._cuda_getCurrentStream`` gives it (id, device index, device type): a
        #: replay on another stream waits for it first, since graphs of one pool share their
        #: intermediate memory, and a graph its input and output memory (two threads, each
        #: with its own stream and its own static cache, replay two graphs of one pool)
        self.stream: tuple[int, int, int] | None = None

    def wait(self, device: torch.device) -> tuple[int, int, int]:
        """Order the current stream after the pool's last replay, where that was on another
        stream (another thread's replay may still be queued: its inputs and outputs, and the
        pool's intermediates, are this replay's memory too); the current stream."""
        current = _current_stream(device.index)
        if self.stream is not None and self.stream != current:
            stream_id, index, device_type = self.stream
            other = torch.cuda.Stream(
                stream_id=stream_id, device_index=index, device_type=device_type
            )
            torch.cuda.current_stream(device).wait_stream(other)
        return current


#: the current stream of a device as (stream id, device index, device type), without making a
#: ``torch.cuda.Stream`` (what ``torch.cuda.current_stream`` returns, less its Python)
def _current_stream(index: int | None) -> tuple[int, int, int]:
    stream = torch.cuda.current_stream(index)
    return stream.stream_id, stream.device_index, stream.device_type


# (a CPU build of PyTorch has no such function: nothing replays there)
_current_stream = getattr(torch._C, "_cuda_getCurrentStream", _current_stream)  # noqa: SLF001


class GraphedForward:
    """The captured graphs of one module, keyed by input signature."""

    def __init__(self, max_graphs: int = 16) -> None:
        self.max_graphs = max_graphs
        self.captures: OrderedDict[Hashable, Capture | TrainCapture] = OrderedDict()
        #: which of the module's parameters require grad (read on calls with autograd on)
        self.parameters = Parameters()
        self.shared = Pool()
        self.stream: torch.cuda.Stream | None = None
        self.replays = 0
        self.records = 0
        #: signatures whose recording failed: they run uncaptured, without trying again
        self.uncapturable: set[Hashable] = set()
        #: calls in a row that recorded a new signature (0 after a replay)
        self.new_in_a_row = 0
        #: the blocks recorded on their own where this module's forward is not (installed once)
        self.pieces: list[nn.Module] = []
        self.expanded = False
        #: this module is a block recorded on its own inside a forward that is not (kept here,
        #: not in the module's ``__dict__``: a forward recorded whole reads that dict's size
        #: on every replay, and marking a piece would make it record again)
        self.piece = False
        #: new signatures not recorded while the shapes kept changing: recorded when they
        #: come again (a batch size served over and over after a few others)
        self.held_back: OrderedDict[Hashable, None] = OrderedDict()
        #: the static-cache memory of the last recording per call key without it, which a
        #: later cache of its layout moves into to replay that recording
        #: (:class:`~dnntune.torch._static_caches.Held`)
        self.held_caches: dict[Hashable, Held] = {}
        # reentrant: a forward that calls its own module again runs inside the lock
        self.lock = threading.RLock()

    @property
    def pool(self) -> Any:
        return self.shared.handle

    @pool.setter
    def pool(self, handle: Any) -> None:
        self.shared.handle = handle

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
            self.held_caches.clear()
            pieces, self.pieces = self.pieces, []
        for piece in pieces:
            forget(piece)


_graphs: weakref.WeakKeyDictionary[nn.Module, GraphedForward] = weakref.WeakKeyDictionary()
_graphs_lock = threading.Lock()


def graphs_of(module: nn.Module) -> GraphedForward:
    """The capture state of ``module`` (created on first use; never copied with the module)."""
    with _graphs_lock:
        state = _graphs.get(module)
        if state is None:
            state = _graphs[module] = GraphedForward()
        return state


def recorded_pieces(module: nn.Module) -> list[str]:
    """The names (in ``module``) of its blocks that recorded a graph as pieces."""
    found = []
    for name, sub in module.named_modules():
        state = _graphs.get(sub)
        if state is not None and state.piece and state.records > 0:
            found.append(name)
    return found


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
