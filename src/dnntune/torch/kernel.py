"""What a functional op runs on every call after the first: a :class:`Kernel`, the plan
selected for one call signature with its inputs' uids and its outputs' layouts, and the calls
made from it (everything bound once, so a call allocates its outputs and calls the plan)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dnntune.backend.engine import Plan
from dnntune.graph.tensor import contiguous_strides
from dnntune.torch._workspace import workspace_getter

__all__ = ["Kernel"]


@dataclass
class Kernel:
    """A selected plan for one call signature, ready to run.

    Built once per signature: the plan's bound call (:meth:`Plan.bind`, its uids fixed in
    call order) and the output layouts, so a call allocates its outputs and calls the plan,
    nothing else.
    """

    plan: Plan
    in_uids: tuple[int, ...]
    out_layouts: tuple[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], ...]
    workspace_size: int
    source: str
    tuning_time_ms: float = 0.0
    #: where the signature's tensors live (None: the first input's device, read per call)
    device: torch.device | None = None

    def __post_init__(self) -> None:
        uids = (*self.in_uids, *(uid for uid, *_ in self.out_layouts))
        self._bound = self.plan.bind(uids)
        # a plan on addresses (cuDNN's) with a call that takes them: its prepared calls read
        # every address in one native call instead of one Python call per tensor
        self._pointer_call = self.plan.bind_pointers(uids) if self.plan.takes_pointers else None
        self._workspace = (
            workspace_getter(self.workspace_size, self.device)
            if self.workspace_size > 0 and self.device is not None
            else None
        )

    @property
    def engine_name(self) -> str:
        return self.plan.engine.name

    @property
    def native(self) -> bool:
        """The chosen plan is PyTorch's own op as eager code runs it (``Plan.runs_eager_ops``):
        in training, callers run PyTorch's op and autograd directly instead of this kernel."""
        return self.plan.runs_eager_ops

    @property
    def takes_pointers(self) -> bool:
        """The plan reads only its tensors' addresses (``Plan.takes_pointers``): a view that
        starts where its base does may be replaced by the base."""
        return self.plan.takes_pointers

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        device = self.device if self.device is not None else inputs[0].device
        outs = [
            torch.empty_strided(dims, strides, dtype=dtype, device=device)
            for _, dims, strides, dtype in self.out_layouts
        ]
        self.launch((*inputs, *outs), device)
        return outs

    def launch(self, tensors: Sequence[torch.Tensor], device: torch.device) -> None:
        """Run the plan on ``tensors``: the inputs in call order, then the output buffers."""
        workspace = None
        if self.workspace_size > 0:
            get = self._workspace
            if get is None or device != self.device:
                get = workspace_getter(self.workspace_size, device)
            workspace = get()
        # no stream argument: every engine runs on the caller's current stream, and naming it
        # would cost each call a stream lookup and a stream switch
        self._bound(tensors, workspace)

    def output_call(
        self,
        positions: tuple[int, ...],
        arity: int,
        views: Callable[..., Sequence[torch.Tensor | None]] | None = None,
        shape: Sequence[int] | None = None,
    ) -> Callable[..., torch.Tensor]:
        """``call(*args) -> output`` for a one-output kernel on ``self.device``, everything
        bound here so that a call allocates the output and calls the plan, in one frame.

        The plan's inputs are ``args`` (``views`` None) or ``views(*args)``, at ``positions``
        of the ``arity`` arguments.
        ``shape`` is the output's shape when it differs from the graph's dims (a linear of a
        3-D input): without ``views`` (a plan that takes pointers, row-major output) the
        output is allocated in ``shape`` directly, its memory being the same; with ``views``
        the graph's output is viewed (row-major) or reshaped to ``shape``.
        """
        assert self.device is not None and len(self.out_layouts) == 1
        _, dims, strides, dtype = self.out_layouts[0]
        device, bound, ws_size = self.device, self._bound, self.workspace_size
        reshape: tuple[int, ...] | None = None
        if shape is not None and tuple(shape) != tuple(dims):
            if views is None:
                dims, strides = tuple(shape), tuple(contiguous_strides(list(shape)))
            else:
                reshape = tuple(shape)
        # empty_strided: half the host time of torch.empty with a dtype and a device
        alloc = functools.partial(torch.empty_strided, dims, strides, dtype=dtype, device=device)
        pick = _picker(positions)
        read = self._pointer_reader() if views is None else None
        if ws_size > 0:
            # the stream's kept buffer (``_workspace``): not a second allocation per call
            workspace = self._workspace or workspace_getter(ws_size, device)
            if read is not None:  # every address read in one native call
                on_pointers_ws = self._pointer_call
                assert on_pointers_ws is not None
                if positions == tuple(range(arity)):

                    def call_ws_pointers(*args: torch.Tensor) -> torch.Tensor:
                        out = alloc()
                        on_pointers_ws(read((*args, out)), workspace())
                        return out

                    return call_ws_pointers

                def call_ws_picked(*args: torch.Tensor | None) -> torch.Tensor:
                    out = alloc()
                    on_pointers_ws(read((*pick(args), out)), workspace())
                    return out

                return call_ws_picked

            def call_ws(*args: torch.Tensor | None) -> torch.Tensor:
                out = alloc()
                bound((*pick(args if views is None else views(*args)), out), workspace())
                return out if reshape is None else out.reshape(reshape)

            return call_ws
        if views is not None:
            if reshape is None:

                def call_views(*args: torch.Tensor | None) -> torch.Tensor:
                    out = alloc()
                    bound((*pick(views(*args)), out), None)
                    return out

                return call_views
            row_major = list(strides) == contiguous_strides(list(dims))
            # a fresh row-major buffer is viewed in any shape of its size (no reshape logic)
            as_shape = torch.Tensor.view if row_major else torch.Tensor.reshape

            def call_views_shaped(*args: torch.Tensor | None) -> torch.Tensor:
                out = alloc()
                bound((*pick(views(*args)), out), None)
                return as_shape(out, reshape)

            return call_views_shaped

        if positions == tuple(range(arity)):  # every argument is a tensor the plan reads
            if read is not None:
                on_pointers = self._pointer_call
                assert on_pointers is not None

                def call_all_pointers(*args: torch.Tensor) -> torch.Tensor:
                    out = alloc()
                    on_pointers(read((*args, out)), None)
                    return out

                return call_all_pointers

            def call_all(*args: torch.Tensor) -> torch.Tensor:
                out = alloc()
                bound((*args, out), None)
                return out

            return call_all

        if read is not None:
            on_pointers_picked = self._pointer_call
            assert on_pointers_picked is not None

            def call_picked_pointers(*args: torch.Tensor | None) -> torch.Tensor:
                out = alloc()
                on_pointers_picked(read((*pick(args), out)), None)
                return out

            return call_picked_pointers

        def call(*args: torch.Tensor | None) -> torch.Tensor:
            out = alloc()
            bound((*pick(args), out), None)
            return out

        return call

    def _pointer_reader(self) -> Callable[[tuple[Any, ...]], bytes] | None:
        """The native pointer reader (:func:`dnntune.backend.native.pointer_reader`) where this
        kernel runs on CUDA with a plan that takes addresses, else None."""
        if self._pointer_call is None or self.device is None or self.device.type != "cuda":
            return None
        from dnntune.backend.native import pointer_reader

        return pointer_reader()


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at ``positions`` of a sequence, as a tuple, by one C call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda seq: (seq[i],)
    return operator.itemgetter(*positions)
