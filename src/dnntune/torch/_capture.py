"""What every CUDA-graph recording of ``cuda_graphs`` and ``_train_graphs`` does around it so
that a recording can neither fault a later replay nor leave the process broken, and what a
call records (:class:`Mode`, with the autocast state part of its signature)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_unflatten

from dnntune.backend.recording import capture, collection_paused
from dnntune.torch._lone_cat import LoneCatCopies, compiled_frames

if TYPE_CHECKING:
    from dnntune.torch._graph_state import GraphedForward, Pool

__all__ = [
    "Mode",
    "NotCapturable",
    "autocast_state",
    "capture_call",
    "graph_mode",
    "own_cublas_workspace",
    "restore_rng_on_failure",
    "static_copies",
    "warm_up",
]


class Mode(StrEnum):
    """What a call records: an inference forward, or a training forward and its backward."""

    INFERENCE = "inference"
    TRAINING = "training"


def graph_mode(
    module: nn.Module, tensors: list[torch.Tensor], state: GraphedForward
) -> Mode | None:
    """INFERENCE (eval mode, no gradient wanted), TRAINING (gradients wanted: the forward
    and its backward are captured) or None (train mode without gradients: run uncaptured)."""
    wants_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or state.parameters.any_requires_grad(module)
    )
    if wants_grad:
        return Mode.TRAINING
    return None if module.training else Mode.INFERENCE


def autocast_state() -> tuple[Any, ...]:
    """Autocast changes what a forward records: part of every signature."""
    if not torch.is_autocast_enabled("cuda"):
        return ()
    return ("autocast", torch.get_autocast_dtype("cuda"))


class NotCapturable(Exception):
    """This forward cannot be recorded as a CUDA graph (found before any recording began)."""


@contextlib.contextmanager
def own_cublas_workspace() -> Iterator[None]:
    """Make the recording allocate cuBLAS's workspace in the graph's own memory pool.

    cuBLAS keeps one workspace per (handle, stream), allocated on first use and kept. Without
    this, the graph records the workspace the warm-up calls allocated outside the pool; when
    anything clears cuBLAS's workspaces (``torch.compile``'s CUDA graphs do, before and after
    each recording) and the allocator then releases that memory (``torch.cuda.graph`` empties
    the cache), the next replay reads unmapped memory: "CUDA error: unspecified launch
    failure" (session 5, a prefill block next to a max-autotune copy of it). Cleared before the
    recording, the workspace is allocated inside it (in the pool, alive as long as the graph);
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


_SYNC_WARNING = "synchronizing CUDA operation"
#: what PyTorch says once when the sync debug mode is first set: ours, not the forward's
_PROTOTYPE_NOTE = "Synchronization debug mode is a prototype feature"


def warm_up(calls: int, run: Callable[[], Any], refuse_syncs: bool = True) -> str | None:
    """Run ``run`` ``calls`` times (plans are built and tuned there, outside any recording);
    the last call under PyTorch's sync debug mode, to find a forward that waits for the device
    (a value read on the host, a blocking copy). With ``refuse_syncs`` such a forward is refused
    here (:class:`NotCapturable`), before a recording fails on it; without, what the debug mode
    said is returned (None: nothing), and the caller records anyway.

    Why not always refuse: a library may wait for the device only when it is not being
    recorded. Hugging Face's mask building reads ``(mask == 0).all()`` on the host unless
    ``is_tracing()``, which is true under CUDA-graph capture, so such a forward synchronizes in
    this warm-up and not in its recording. By transformers' source that is why a LLaMA prefill
    was refused here while a plain ``torch.cuda.graph`` capture recorded it (1.47x eager on the
    H200, session 9).
    """
    for _ in range(calls - 1):
        run()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    sync = next((str(w.message).strip() for w in caught if _SYNC_WARNING in str(w.message)), None)
    if sync is not None and refuse_syncs:
        raise NotCapturable(f"the forward waits for the device ({sync})")
    for w in caught:  # the forward's own warnings, as it gave them
        if _PROTOTYPE_NOTE not in str(w.message) and _SYNC_WARNING not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return sync


@contextlib.contextmanager
def restore_rng_on_failure(device: torch.device) -> Iterator[None]:
    """If the recording fails, put the device's default random generator back as it was.

    A recording that the driver invalidates ends without PyTorch's epilogue for the generator,
    which then believes it is still being captured; its state from before the recording
    (a clone) replaces it, so random ops work again.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    snapshot = generator.clone_state() if hasattr(generator, "clone_state") else None
    try:
        yield
    except BaseException:
        if snapshot is not None:
            generator.graphsafe_set_state(snapshot)
        raise


def static_copies(
    flat: list[Any], spec: Any, tensors: list[torch.Tensor], keep_grad: bool
) -> tuple[list[torch.Tensor], Any, Any]:
    """The recording's own input buffers (copies of ``tensors``, which requires grad as they
    do when ``keep_grad``), and the call's ``args`` and ``kwargs`` rebuilt around them."""
    # normal (not inference) tensors, so a later call under either mode may copy into them
    with torch.inference_mode(False):
        static = [t.detach().clone().requires_grad_(keep_grad and t.requires_grad) for t in tensors]
    it = iter(static)
    static_flat = [next(it) if isinstance(x, torch.Tensor) else x for x in flat]
    args, kwargs = tree_unflatten(static_flat, spec)
    return static, args, kwargs


def capture_call(
    forward: Callable[..., Any],
    args: Any,
    kwargs: Any,
    shared: Pool,
    stream: torch.cuda.Stream,
    lone_cats: bool = True,
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """One call of ``forward`` recorded into a new graph in ``shared``'s pool: the graph and
    the call's output. A cat of one tensor and empty ones is recorded as a copy
    (:mod:`._lone_cat`); where the capture fails after ``torch.compile`` compiled again under
    that mode, it is made again without it."""
    graph = torch.cuda.CUDAGraph()
    compiled = compiled_frames()
    try:
        with (
            torch.no_grad(),
            restore_rng_on_failure(stream.device),
            own_cublas_workspace(),
            collection_paused(),
            capture(graph, stream=stream, pool=shared.handle),
            LoneCatCopies() if lone_cats else contextlib.nullcontext(),
        ):
            return graph, forward(*args, **kwargs)
    except Exception:
        # a capture that failed leaves its pool marked as being recorded to ("already
        # recording to mempool_id" for the next one, seen on the H200): later recordings,
        # this module's and its pieces', take a new pool (the graphs before hold the old)
        shared.handle = None
        if not lone_cats or compiled_frames() == compiled:
            raise
    shared.handle = torch.cuda.graph_pool_handle()
    return capture_call(forward, args, kwargs, shared, stream, lone_cats=False)
