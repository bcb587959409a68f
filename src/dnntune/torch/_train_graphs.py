"""Training steps as CUDA graphs (``optimize(..., cuda_graph=True)`` with gradients wanted).

The module's forward and the backward of its outputs are recorded once per input signature as
two CUDA graphs, in a memory pool of their own (another signature's or piece's recording or
replay could otherwise be given the activations the backward reads), and replayed through one
autograd function:
its forward copies the inputs into the static buffers and replays the forward graph; its
backward copies the incoming gradients into the static gradient buffers and replays the
backward graph, which writes the gradients of the inputs that require them and of every
parameter that requires grad. Autograd accumulates those into ``.grad`` as usual.

Rules on top of the inference ones (``cuda_graphs``):

* the recorded autograd graph ends at the module's outputs: the loss and anything after the
  module run uncaptured, as the user wrote them;
* parameters may change in place between steps (an optimizer step): the graphs read them where
  they are, so only a new tensor object or new storage re-records;
* the activations a backward needs live in the static buffers, so while one replay's backward
  is still due (its outputs alive, backward not run), another call of the same signature runs
  uncaptured; a backward whose activations were overwritten anyway raises instead of returning
  wrong gradients;
* the warm-up calls before recording would update batch-norm running statistics; every CUDA
  buffer is restored after recording, so a recorded step updates them exactly once;
* as for inference, a forward that gives its modules new tensors, changes their Python state,
  writes an input in place or returns an object pytree cannot rebuild is not recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils._pytree import tree_flatten, tree_unflatten

from dnntune.backend.recording import capture, collection_paused
from dnntune.torch._capture import (
    NotCapturable,
    own_cublas_workspace,
    restore_rng_on_failure,
    static_copies,
    warm_up,
)
from dnntune.torch._recorded import ForwardState, opaque_output

__all__ = ["TrainCapture", "record_training", "replay_training"]


@dataclass
class TrainCapture:
    forward_graph: torch.cuda.CUDAGraph
    backward_graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    #: positions (in ``static_inputs``) of the inputs that require grad
    grad_inputs: list[int]
    #: the parameters that required grad when recorded, in ``module.parameters()`` order
    params: list[nn.Parameter]
    #: the forward's flat outputs (tensors in the pool, other values as they are) and its tree
    static_outputs: list[Any]
    out_spec: Any
    #: positions (in ``static_outputs``) of the tensors, and of those that carry gradients
    tensor_outputs: list[int]
    diff_outputs: list[int]
    static_grad_outputs: list[torch.Tensor]
    #: gradients of the grad inputs, then of ``params`` (None where unused)
    static_grads: list[torch.Tensor | None]
    weights: Any
    #: a replay whose backward has not run yet (its activations are in the static buffers)
    pending: bool = False
    generation: int = 0


def _grad_outputs(outs: list[Any]) -> list[int]:
    return [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]


def _step(forward: Callable[..., Any], args: Any, kwargs: Any, wrt: list[torch.Tensor]) -> None:
    """One uncaptured forward and backward (a warm-up call)."""
    outs = tree_flatten(forward(*args, **kwargs))[0]
    diff = _grad_outputs(outs)
    if not diff:
        raise NotCapturable("its outputs need no gradient")
    torch.autograd.grad(
        [outs[i] for i in diff],
        wrt,
        grad_outputs=[torch.ones_like(outs[i]) for i in diff],
        allow_unused=True,
    )


def record_training(
    module: nn.Module,
    forward: Callable[..., Any],
    spec: Any,
    flat: list[Any],
    tensors: list[torch.Tensor],
    pool: Any,
    stream: torch.cuda.Stream,
    warmup_calls: int,
    weights: Any,
) -> TrainCapture:
    """Warm up on ``stream``, then record the forward and its backward into ``pool``."""
    params = [p for p in module.parameters() if p.requires_grad]
    static_inputs, args, kwargs = static_copies(flat, spec, tensors, keep_grad=True)
    grad_inputs = [i for i, t in enumerate(static_inputs) if t.requires_grad]
    # what the warm-up calls change besides the outputs (batch-norm statistics, counters)
    saved = [(b, b.clone()) for b in module.buffers() if b.is_cuda]
    # and the tensors and Python state a forward could change (refused below, put back)
    before = ForwardState(module, keep_copies=True)
    device = tensors[0].device
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with aliased_parameters(module, params) as aliases:
            wrt = [static_inputs[i] for i in grad_inputs] + aliases
            forward_graph, backward_graph, static_outputs, out_spec, static_grad_outputs, grads = (
                _warm_up_and_record(
                    module, forward, args, kwargs, wrt, pool, stream, warmup_calls, static_inputs
                )
            )
    except NotCapturable:
        before.restore()
        raise
    finally:
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    diff = _grad_outputs(static_outputs)
    return TrainCapture(
        forward_graph=forward_graph,
        backward_graph=backward_graph,
        static_inputs=static_inputs,
        grad_inputs=grad_inputs,
        params=params,
        static_outputs=[o.detach() if isinstance(o, torch.Tensor) else o for o in static_outputs],
        out_spec=out_spec,
        tensor_outputs=[i for i, o in enumerate(static_outputs) if isinstance(o, torch.Tensor)],
        diff_outputs=diff,
        static_grad_outputs=static_grad_outputs,
        static_grads=[g.detach() if g is not None else None for g in grads],
        weights=weights,
    )


def _warm_up_and_record(
    module: nn.Module,
    forward: Callable[..., Any],
    args: Any,
    kwargs: Any,
    wrt: list[torch.Tensor],
    pool: Any,
    stream: torch.cuda.Stream,
    warmup_calls: int,
    static_inputs: list[torch.Tensor],
) -> tuple[Any, ...]:
    """The warm-up calls, then the two recordings, on ``stream``. A forward the replay could
    not follow is refused (:class:`NotCapturable`) as for inference (``cuda_graphs._record``):
    one that gives its modules new tensors or changes their Python state on every call, writes
    an input in place, or returns an object pytree cannot rebuild."""
    device = stream.device
    versions = [t._version for t in static_inputs]
    with torch.cuda.stream(stream), torch.enable_grad():
        _step(forward, args, kwargs, wrt)  # the first call may build a cache once
        steady = ForwardState(module)
        warm_up(warmup_calls - 1, lambda: _step(forward, args, kwargs, wrt))
    torch.cuda.current_stream(device).wait_stream(stream)
    refusal = steady.refusal()
    if refusal is not None:
        raise NotCapturable(refusal)
    if [t._version for t in static_inputs] != versions:
        raise NotCapturable("the forward writes one of its inputs in place")
    forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with (
        restore_rng_on_failure(device),
        own_cublas_workspace(),
        collection_paused(),
        torch.enable_grad(),
    ):
        with capture(forward_graph, stream=stream, pool=pool):
            out = forward(*args, **kwargs)
        opaque = opaque_output(out)
        if opaque is not None:
            raise NotCapturable(
                f"the forward returns a {opaque}, which a replay would hand back as the same "
                "object every call"
            )
        static_outputs, out_spec = tree_flatten(out)
        diff = _grad_outputs(static_outputs)
        static_grad_outputs = [torch.empty_like(static_outputs[i]) for i in diff]
        with capture(backward_graph, stream=stream, pool=pool):
            grads = torch.autograd.grad(
                [static_outputs[i] for i in diff],
                wrt,
                grad_outputs=static_grad_outputs,
                allow_unused=True,
            )
    return forward_graph, backward_graph, static_outputs, out_spec, static_grad_outputs, grads


@contextlib.contextmanager
def aliased_parameters(module: nn.Module, params: list[nn.Parameter]) -> Iterator[list[Any]]:
    """While recording, ``params`` are replaced in ``module`` by leaves sharing their storage.

    The recorded graphs read the same memory (so optimizer steps in place are seen), but the
    autograd graph built while warming up and recording on the side stream ends at the
    aliases, not at the parameters: a parameter's gradient accumulator made there would be
    bound to the side stream, and every later step's accumulation from the caller's stream
    would then sync across streams (PyTorch warns), and a recording would wait on a stream
    that is not being recorded (the capture fails).
    """
    aliases = {id(p): nn.Parameter(p.detach(), requires_grad=True) for p in params}
    swapped: list[tuple[dict[str, Any], str, nn.Parameter]] = []
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and id(p) in aliases:
                m._parameters[name] = aliases[id(p)]
                swapped.append((m._parameters, name, p))
    try:
        yield [aliases[id(p)] for p in params]
    finally:
        for slots, name, p in swapped:
            slots[name] = p


class _Due:
    """Held by one replay's autograd node: if the node is freed without its backward having
    run (outputs dropped, no backward), the capture is free for the next call."""

    __slots__ = ("capture", "generation")

    def __init__(self, capture: TrainCapture) -> None:
        self.capture, self.generation = capture, capture.generation

    def __del__(self) -> None:
        # no lock: a plain attribute write, and this may run inside a locked section
        if self.capture.generation == self.generation:
            self.capture.pending = False


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, capture: TrainCapture, *tensors: torch.Tensor) -> tuple[Any, ...]:
        for static, value in zip(capture.static_inputs, tensors, strict=False):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)
        capture.generation += 1
        capture.pending = True
        capture.forward_graph.replay()
        ctx.capture, ctx.due = capture, _Due(capture)
        outs = tuple(capture.static_outputs[i].clone() for i in capture.tensor_outputs)
        diff = set(capture.diff_outputs)
        ctx.mark_non_differentiable(
            *(o for i, o in zip(capture.tensor_outputs, outs, strict=True) if i not in diff)
        )
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        capture: TrainCapture = ctx.capture
        if ctx.due.generation != capture.generation:
            raise RuntimeError(
                "dnntune.torch (cuda_graph=True): this backward's activations were overwritten "
                "by a later call of the same CUDA-graph-captured module; run each step's "
                "backward before its next forward, or optimize with cuda_graph=False"
            )
        by_position = dict(zip(capture.tensor_outputs, grads, strict=True))
        for i, static in zip(capture.diff_outputs, capture.static_grad_outputs, strict=True):
            g = by_position[i]
            if g is None:
                static.zero_()
            elif static.data_ptr() != g.data_ptr():
                static.copy_(g)
        capture.backward_graph.replay()
        results = [g.clone() if g is not None else None for g in capture.static_grads]
        capture.pending = False  # only now: a next replay may overwrite the static gradients
        n_inputs = len(capture.static_inputs)
        input_grads: list[torch.Tensor | None] = [None] * n_inputs
        for position, g in zip(capture.grad_inputs, results, strict=False):
            input_grads[position] = g
        return (None, *input_grads, *results[len(capture.grad_inputs) :])


def replay_training(capture: TrainCapture, tensors: list[torch.Tensor]) -> Any:
    """One training call: the recorded forward, differentiable through the recorded backward."""
    outs = _Replay.apply(capture, *tensors, *capture.params)
    flat = list(capture.static_outputs)
    for i, o in zip(capture.tensor_outputs, outs, strict=True):
        flat[i] = o
    return tree_unflatten(flat, capture.out_spec)
