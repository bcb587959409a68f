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
  uncaptured for that signature from then on: never an error in the user's forward;
* never recorded, because a replay would silently go wrong (:mod:`dnntune.torch._recorded`): a
  call with an argument that is neither a tensor nor a plain value (a cache object), a
  forward that gives its modules new tensors or changes their Python state on every call (a
  cache it grows by ``torch.cat``, a counter), and one whose output holds an object pytree
  cannot rebuild; the modules' Python state (plain attributes, flags, hooks) is checked before
  every replay with their tensors;
* pieces: when an inference forward cannot be recorded, or its input shapes keep changing
  (:data:`DYNAMIC_AFTER` new signatures in a row, none replayed), its blocks are installed to
  be recorded on their own (:func:`dnntune.torch._pieces.blocks`, the same rules, recursively)
  and the code between them runs uncaptured. Pieces share the module's memory pool;
* inside another recording (a user's own ``torch.cuda.graph`` around the module, or the
  recording of a module that holds this one) the forward runs as it is.

Inputs are copied into the graph's static buffers before each replay; outputs are cloned so a
later call never overwrites a result the caller holds. A replay reads the parameters and
buffers where they are, so an optimizer step, ``load_state_dict`` or any other in-place write is
read by the next replay as by an uncaptured forward; a tensor given new storage or another
tensor in its slot re-records the graph (:class:`~dnntune.torch._baked.Weights`), and so does
a write to a tensor that dnntune derived a value from on the host and the graph holds (a
batch-norm fold's sources, and any optimizer step while a fold is held): the fold is made again
inside the new recording. A buffer the forward itself writes (a KV cache, a counter) is put back
after the warm-up calls of a recording, so each call changes it once. A training capture reads
the parameters where they are (nothing is folded in training), so only new tensors or storage
re-record it.

What a replay pays on the host before its graph is launched (the signature, the checks of
:class:`~dnntune.torch._baked.Weights`, the input copies) is on the critical path whenever the
GPU waits for it (a call after a sync, such as an LLM decode step that samples on the host), so
it is kept to flat C-level walks: :func:`call`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from dnntune.torch._baked import Weights
from dnntune.torch._buffers import buffer_snapshot, put_back
from dnntune.torch._capture import (
    Mode,
    NotCapturable,
    autocast_state,
    capture_call,
    graph_mode,
    static_copies,
    warm_up,
)
from dnntune.torch._fresh_outputs import unfresh_output
from dnntune.torch._graph_state import (
    Capture,
    GraphedForward,
    Pool,
    attach,
    detach,
    forget,
    graphs_of,
    recorded_pieces,
)
from dnntune.torch._pieces import blocks
from dnntune.torch._recorded import (
    PLAIN_VALUES,
    ForwardState,
    opaque_argument,
    signature,
)
from dnntune.torch._static_caches import Snapshot as CacheSnapshot
from dnntune.torch._static_caches import hold, move_in, static_tensors, unallocated, without_memory
from dnntune.torch._subclass import wrap_forward
from dnntune.torch._support import own_recording, pytorch_route, tracing, warn_once
from dnntune.torch._train_graphs import TrainCapture, record_training, replay_training

__all__ = [
    "GraphedForward",
    "attach",
    "detach",
    "forget",
    "graphs_of",
    "install",
    "recorded_pieces",
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

#: after this many calls in a row that each recorded a new signature, a module's shapes are
#: taken to keep changing (a cache that grows): new signatures run uncaptured, on pieces, until
#: a call replays again
DYNAMIC_AFTER = 3
#: how many such signatures are remembered (shapes and types only: no tensor is held)
HELD_BACK = 64


def _record(
    module: nn.Module,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    shared: Pool,
    stream: torch.cuda.Stream,
) -> Capture:
    device = stream.device
    static_inputs, args, kwargs = static_copies(flat, spec, tensors, keep_grad=False)
    # static caches among the arguments are passed as they are (:mod:`._static_caches`)
    at = tuple(i for i, item in enumerate(flat) if static_tensors(item) is not None)
    caches = [flat[i] for i in at]
    saved, written_caches = buffer_snapshot(module), CacheSnapshot(caches)
    before = ForwardState(module, keep_copies=True)
    written = _versions(module)
    versions = [t._version for t in static_inputs]
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream), torch.no_grad():

            def warm_call() -> Any:
                # a static cache's fill count is put back after each call: every warm-up
                # call writes the positions the call itself writes, never past them
                try:
                    return forward(*args, **kwargs)
                finally:
                    written_caches.restore()

            first = warm_call()  # the first warm-up call may build a cache once
            # a cache object it returns (use_cache=True) is handed out as a copy of its own
            # on every replay; an object that cannot be copied so is not recorded
            opaque = unfresh_output(first, caches)
            del first
            if opaque is not None:
                before.restore()  # the call then runs uncaptured: what it changes, once
                raise NotCapturable(
                    f"the forward returns a {opaque}, which a replay would hand back as the "
                    "same object every call (its tensors overwritten by the next replay), and "
                    "which holds more than tensors and plain values to copy"
                )
            steady = ForwardState(module)
            # a forward that waits for the device here is recorded all the same: it may wait
            # only when not recorded (as a plain torch.cuda.graph capture finds); if it waits
            # in the recording too, the recording fails and the signature runs uncaptured
            sync = warm_up(WARMUP_CALLS - 1, warm_call, refuse_syncs=False)
        refusal = steady.refusal() or written_caches.refusal()
        if refusal is not None:
            before.restore()  # what the warm-up calls changed: the call runs uncaptured, once
            raise NotCapturable(refusal)
        if [t._version for t in static_inputs] != versions:
            # a replay would write the recording's copy of the input, not the caller's tensor
            raise NotCapturable("the forward writes one of its inputs in place")
        torch.cuda.current_stream(device).wait_stream(stream)
        try:
            graph, static_output = capture_call(forward, args, kwargs, shared, stream)
        except Exception as exc:
            if sync is None:
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            raise NotCapturable(
                f"the forward waits for the device ({sync}), in its recording too "
                f"({type(exc).__name__}: {first})"
            ) from exc
        # what the graph reads, as it is now: the warm-up may have built a cache once, and the
        # forward's own in-place writes (a KV cache it keeps in a buffer; the warm-up's, put
        # back) are part of the graph: a change to re-record for is one made after this
        weights = Weights(module)
        # (before put_back, whose copies would count as writes)
        # (a replay given a static cache writes the caller's cache: never launched before
        # the checks, whose failure would record and replay again on the advanced cache)
        pure = written is not None and _versions(module) == written and not at
        if sync is not None:
            _log.info(
                "dnntune.torch: %s's forward waits for the device when not recorded (%s); "
                "its recording does not, and replays",
                type(module).__name__,
                sync,
            )
    finally:
        torch.cuda.current_stream(device).wait_stream(stream)
        put_back(saved)  # (a static cache's count was put back after each warm-up call)
    try:
        return Capture(
            graph, static_inputs, static_output, weights, pure=pure, caches=at, given=caches
        )
    except ValueError as exc:  # the recorded call's output holds what the first one did not
        raise NotCapturable(f"its output cannot be handed out afresh ({exc})") from exc


def _versions(module: nn.Module) -> list[int] | None:
    """The version of each tensor the module's state holds (parameters, buffers, and tensors
    kept as plain attributes or in their lists, tuples and dicts: a KV cache a decoder keeps
    itself), None when one keeps none (an inference tensor): what tells a forward that writes
    its module's state, whose replay must never run on weights that may have changed."""
    tensors: list[torch.Tensor] = [*module.parameters(), *module.buffers()]
    seen: set[int] = set()  # containers walked (one that holds itself is walked once)
    for m in module.modules():
        stack = [v for k, v in m.__dict__.items() if k not in _SLOT_DICTS]
        while stack:
            value = stack.pop()
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, (list, tuple, dict)) and id(value) not in seen:
                seen.add(id(value))
                stack.extend(value.values() if isinstance(value, dict) else value)
    if any(t.is_inference() for t in tensors):
        return None
    return [t._version for t in tensors]


#: the dicts of an ``nn.Module`` that hold its parameters, buffers and children (walked apart)
_SLOT_DICTS = frozenset(("_parameters", "_buffers", "_modules"))


def _flatten(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    """``tree_flatten((args, kwargs))``, or (the arguments, None) for the common call of only
    positional tensors and plain values: no pytree walk and no TreeSpec to hash on a replay's
    critical path (``signature`` keys those by their count)."""
    if not kwargs:
        for arg in args:
            if not isinstance(arg, _LEAF_TYPES):
                break
        else:
            return list(args), None
    return tree_flatten((args, kwargs))


_LEAF_TYPES = (torch.Tensor, *PLAIN_VALUES)


def call(module: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run ``forward`` through a captured graph where the rules allow, else directly.

    A replay pays this on the host before its graph is launched, on the critical path when
    the GPU is idle (a call after a sync): the common call (positional tensors) skips pytree,
    and nothing is built that the last call built already.
    """
    # inside a module's recording (its warm-up calls and capture: ``_support.own_recording``)
    # the installed modules (pieces) run their plain forward, neither replaying nor recording
    if own_recording.get():
        return forward(*args, **kwargs)  # part of a recording of a module that holds this one
    flat, spec = _flatten(args, kwargs)
    found = signature(flat, spec)
    if found is None:
        return _run_uncaptured(forward, args, kwargs)
    if torch.cuda.is_current_stream_capturing():
        return forward(*args, **kwargs)  # part of the caller's own recording
    sig, tensors, device = found
    state = graphs_of(module)
    mode = graph_mode(module, tensors, state)
    if mode is None:
        return _run_uncaptured(forward, args, kwargs)
    key = (mode, module.training, autocast_state(), sig)
    training = mode is Mode.TRAINING
    with state.lock:
        if key in state.uncapturable:
            return _run_uncaptured(forward, args, kwargs)
        capture = state.captures.get(key)
        if capture is None and state.held_caches:
            # a new static cache moves into the memory a recording on an earlier one holds
            key = _moved_in(state, key, flat, spec, device)
            sig, capture = key[3], state.captures.get(key)
        if isinstance(capture, TrainCapture) and capture.pending:
            # the last replay's backward is still due: its activations must stay (a moment's
            # detour, not how this signature runs: its layers keep the replay's settings)
            return forward(*args, **kwargs)
        if type(capture) is Capture and capture.pure and capture.weights.storage_unchanged():
            # launched first, checked after: the rest of the check (the module's Python state
            # and the fold's sources: tens of µs for a few hundred modules) runs while the GPU
            # computes instead of before it starts, on a forward that writes only the graph's
            # memory and whose tensors are all where they were recorded. Something changed:
            # this replay read the weights as they were; its output is dropped, and the call
            # records again below once the replay is done
            _launch(capture, tensors, device, state.shared)
            if capture.weights.unchanged():
                state.new_in_a_row = 0
                state.captures.move_to_end(key)
                state.replays += 1
                return capture.output(flat)
            torch.cuda.current_stream(device).synchronize()
        if capture is None or not capture.weights.unchanged(written_ok=training):
            new = capture is None
            # shapes that keep changing: recording each would cost more than it saves, until
            # one comes again
            dynamic = new and state.new_in_a_row >= DYNAMIC_AFTER and not training
            if dynamic and state.held_back.pop(key, False) is False:
                state.held_back[key] = None
                while len(state.held_back) > HELD_BACK:
                    state.held_back.popitem(last=False)
                _expand(module, state, device)
                return _run_uncaptured(forward, args, kwargs)
            # a refusal holds for the shapes wherever a static cache is
            refused = _anywhere(key)
            if refused is not key and refused in state.uncapturable:
                return _run_uncaptured(forward, args, kwargs)
            state.captures.pop(key, None)
            if spec is None:  # the pytree spec a recording rebuilds the call with
                flat, spec = tree_flatten((args, kwargs))
            try:
                opaque = opaque_argument(flat, spec, static_caches=not training)
                if opaque is not None:
                    raise NotCapturable(
                        f"an argument of type {opaque} may hold state that a replay would not "
                        "update"
                    )
                capture = _record_any(state, module, forward, spec, flat, tensors, device, mode)
            except Exception as exc:  # never a crash in the user's forward: run it uncaptured
                state.uncapturable.add(refused)
                pieces = [] if training else _expand(module, state, device)
                # (a static cache's first forward, which allocates it, is expected to)
                expected = not training and any(map(unallocated, flat))
                _warn_uncapturable(module, mode, exc, len(pieces), expected)
                return _run_uncaptured(forward, args, kwargs)
            state.captures[key] = capture
            if type(capture) is Capture and capture.caches:
                hold(state.held_caches, refused, flat, state.max_graphs)
            state.new_in_a_row = state.new_in_a_row + 1 if new else 0
            while len(state.captures) > state.max_graphs:
                state.captures.popitem(last=False)
        else:
            state.new_in_a_row = 0
        state.captures.move_to_end(key)
        state.replays += 1
        if isinstance(capture, TrainCapture):
            return replay_training(capture, tensors)
        _launch(capture, tensors, device, state.shared)
        return capture.output(flat)


def _moved_in(
    state: GraphedForward, key: Any, flat: list[Any], spec: Any, device: torch.device
) -> Any:
    """The call's key once its static cache moved into held memory (``move_in``), else it."""
    where, wait = _anywhere(key), lambda: state.shared.wait(device)
    if where is key or not move_in(state.held_caches, where, flat, wait):
        return key
    found = signature(flat, spec)
    return key if found is None else (*key[:3], found[0])


def _anywhere(key: Any) -> Any:
    """A call's key with its static caches' memory left out (the key where it holds none)."""
    anywhere = without_memory(key[3])
    return key if anywhere is key[3] else (*key[:3], anywhere)


def _launch(
    capture: Capture, tensors: list[torch.Tensor], device: torch.device, pool: Pool
) -> None:
    """Copy the call's inputs into the graph's and replay it on the current stream."""
    pool.stream = pool.wait(device)
    for static, value in zip(capture.static_inputs, tensors, strict=True):
        if static.data_ptr() != value.data_ptr():
            static.copy_(value)
    capture.graph.replay()


def _record_any(
    state: GraphedForward,
    module: nn.Module,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    device: torch.device,
    mode: Mode,
) -> Capture | TrainCapture:
    stream = state.recording_stream(device)
    capture: Capture | TrainCapture
    # the layers inside build their plans for a replay (not for an uncaptured call), and the
    # installed modules inside run their plain forward
    uncaptured, recording = _uncaptured.set(False), own_recording.set(True)
    try:
        if mode is Mode.INFERENCE:
            capture = _record(module, forward, spec, flat, tensors, state.shared, stream)
            # the buffers the warm-up wrote were put back after the recording: read as written
            capture.weights.settle()
        else:
            weights = Weights(module, attributes=False)
            # a pool of its own: the backward reads the activations its forward saved, which
            # a recording or replay of another signature or piece in a shared pool could be
            # given (autograd frees them into the pool after the backward's recording)
            pool = torch.cuda.graph_pool_handle()
            capture = record_training(
                module, forward, spec, flat, tensors, pool, stream, WARMUP_CALLS, weights
            )
    finally:
        own_recording.reset(recording)
        _uncaptured.reset(uncaptured)
    state.records += 1
    return capture


def _expand(module: nn.Module, state: GraphedForward, device: torch.device) -> list[nn.Module]:
    """Install ``module``'s blocks to be recorded on their own (once; they share its pool)."""
    if not state.expanded:
        state.expanded = True
        stream = state.recording_stream(device)
        for piece in blocks(module):
            install(piece)
            piece_state = graphs_of(piece)
            piece_state.piece = True
            piece_state.shared, piece_state.stream = state.shared, stream
            state.pieces.append(piece)
        if state.pieces:
            _log.info(
                "dnntune.torch: %s runs uncaptured; %d of its blocks are recorded on their own",
                type(module).__name__,
                len(state.pieces),
            )
    return state.pieces


def _warn_uncapturable(
    module: nn.Module, mode: Mode, exc: Exception, pieces: int, expected: bool = False
) -> None:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    name = type(module).__name__
    if expected or module.__dict__.get("_dnntune_graph_auto") or graphs_of(module).piece:
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
        + (f"uncaptured, {pieces} of its blocks recorded on their own" if pieces else "uncaptured"),
        stacklevel=5,
    )


def install(module: nn.Module) -> None:
    """Give ``module`` a forward that replays CUDA graphs (its class is swapped for a subclass,
    so parameters, buffers and state_dict keys are unchanged; ``copy.deepcopy`` gives a copy
    that records its own graphs)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            # a program recorded from the model records PyTorch's forward, and the route a
            # race chose runs it (._route_race)
            if pytorch_route.on or tracing():
                return original(self, *args, **kwargs)
            return call(self, lambda *a, **k: original(self, *a, **k), args, kwargs)

        return forward

    wrap_forward(module, "_dnntune_graphed", wrap)
