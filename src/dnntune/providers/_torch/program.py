"""Lowering: a graph becomes, once, a list of ATen-calling steps over a slot array.

Every tensor of the graph gets a slot: the caller's tensors first (inputs, then outputs, in
:meth:`OpGraph.io_tensors` order), intermediates after them. Each node becomes one closure
``step(slots)`` that reads its operands from slots and writes its result into a slot or into the
caller's output buffer. :meth:`Program.run` only builds the slot list and calls the steps, so an
``execute`` does no graph work and rebuilds no dict.

Data types follow a user of PyTorch eager: an op runs in the promoted type of its operands (fp16
convolutions run in fp16), an intermediate (virtual) tensor holds its declared type (the graph's
intermediate type), and a result lands in the caller's buffer through ``copy_`` or, where the op
has one and the types agree, its ``out=`` variant. One exception, cuDNN's compute type: an op
whose result is kept wider than its operands (fp16 data into a float32 output) reads them in
that wider type, decided once per node by :mod:`.compute_type` (:meth:`LowerContext.begin`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes, contiguous_strides
from dnntune.graph.types import DataType
from dnntune.providers._torch.compute_type import widened_operands

__all__ = [
    "LowerContext",
    "Lowerer",
    "LoweringOptions",
    "Program",
    "Reader",
    "Step",
    "Writer",
    "dummy_args",
    "is_low_precision",
]

_log = logging.getLogger(__name__)

Slots = list[Any]
Step = Callable[[Slots], None]
Reader = Callable[[Slots], torch.Tensor]
Writer = Callable[[Slots, torch.Tensor], None]
Lowerer = Callable[["LowerContext", Node], Step]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LoweringOptions:
    """How a graph is lowered; the engines' knobs map onto these."""

    #: convert convolution operands to channels_last (NHWC / NDHWC)
    channels_last: bool = False
    #: write final results with an op's ``out=`` variant where it has one (eager only)
    out_variants: bool = True
    #: return the outputs instead of writing the caller's buffers (CUDA-graph trees want this)
    return_outputs: bool = False
    #: grouped-query attention by repeating key/value heads instead of ``enable_gqa``
    sdpa_repeat_kv: bool = False
    #: only Python closures (torch.compile cannot trace ``operator.itemgetter``)
    traceable: bool = False
    #: hold floating-point intermediates in the graph's io type, as eager code written with
    #: fp16/bf16 tensors would, instead of its (wider) intermediate type: less memory traffic
    #: between ATen calls, at the precision a PyTorch user gets
    io_intermediates: bool = False
    #: peephole fusions of :mod:`.fused` (matmul + bias add as one addmm)
    fuse: bool = True
    #: a forward convolution over non-overlapping patches as one GEMM (:func:`.conv.patch_conv`)
    patch_gemm: bool = False


class Program:
    """A lowered graph: which uids its arguments are, and the steps that compute it.

    Attributes:
        arg_uids: uids of the positional arguments of :meth:`run`: the graph inputs, then (unless
            outputs are returned) the output buffers.
        result_uids: uids of the tensors :meth:`run` returns (only with ``return_outputs``).
        kinds: the op kind of each ATen-calling node, in order (a fused step lists the calls
            it makes: a matmul with its bias and activation fused, MATMUL then POINTWISE).
    """

    def __init__(
        self,
        arg_uids: Sequence[int],
        result_slots: Sequence[int],
        result_uids: Sequence[int],
        n_scratch: int,
        steps: Sequence[Step],
        kinds: Sequence[OpKind],
    ) -> None:
        self.arg_uids: tuple[int, ...] = tuple(arg_uids)
        self.result_uids: tuple[int, ...] = tuple(result_uids)
        self.steps: tuple[Step, ...] = tuple(steps)
        self.kinds: tuple[OpKind, ...] = tuple(kinds)
        #: ``run(args)``: run every step; returns the results when the program returns its
        #: outputs (else an empty tuple)
        self.run: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]] = _runner(
            self.steps, n_scratch, tuple(result_slots)
        )

    def __repr__(self) -> str:
        ops = ",".join(k.value for k in self.kinds)
        return f"<Program {len(self.arg_uids)} args, steps [{ops}]>"


class LowerContext:
    """What a lowerer needs: slots, data types, constants, the device and the options."""

    def __init__(self, graph: OpGraph, device: torch.device, options: LoweringOptions) -> None:
        self.graph = graph
        self.device = device
        self.options = options
        io_type = graph.io_data_type
        self._io_dtype: torch.dtype | None = None
        if options.io_intermediates and io_type is not None and io_type.is_floating:
            self._io_dtype = io_type.to_torch()
        self._slot: dict[int, int] = {}
        produced = graph.producers()
        io = graph.io_tensors()
        self.inputs = [t for t in io if id(t) not in produced]
        self.outputs = [t for t in io if id(t) in produced]
        args = self.inputs if options.return_outputs else io
        for t in args:
            self._slot[id(t)] = len(self._slot)
        self.n_args = len(self._slot)
        for t in graph.tensors:
            if id(t) not in self._slot and not t.is_scalar:
                self._slot[id(t)] = len(self._slot)
        self.arg_uids = [_uid(t) for t in args]
        #: per node, the operands it reads in a wider type than their slots hold
        self._widened = widened_operands(graph, self.slot_dtype)
        #: those of the node being lowered (see :meth:`begin`)
        self._reads_as: dict[int, torch.dtype] = {}

    def begin(self, node: Node) -> None:
        """Lower ``node`` next: :meth:`dtype`, :meth:`promote` and :meth:`read` give its
        operands in the type it computes in (:mod:`.compute_type`), which is their slots' type
        unless its result is kept wider than they are."""
        self._reads_as = self._widened.get(id(node), {})

    # ---- slots and types ------------------------------------------------------------------
    def slot(self, t: TensorAttributes) -> int:
        return self._slot[id(t)]

    @property
    def n_scratch(self) -> int:
        return len(self._slot) - self.n_args

    def dtype(self, t: TensorAttributes) -> torch.dtype:
        """The torch dtype the node being lowered reads ``t`` in: its slot's (:meth:`slot_dtype`)
        or, for an operand of a node whose result is kept wider (fp16 data into a float32
        output), the type that node computes in."""
        return self._reads_as.get(id(t)) or self.slot_dtype(t)

    def slot_dtype(self, t: TensorAttributes) -> torch.dtype:
        """The torch dtype a slot holds for ``t``: its declared data type, except that with
        ``io_intermediates`` a floating virtual tensor wider than the io type holds the io type.
        """
        if t.data_type is None:  # validate() fills every type; guards a graph built by hand
            raise NotSupportedError(f"{t.describe()} has no data type; call validate() first")
        declared = t.data_type.to_torch()
        io = self._io_dtype
        if (
            io is not None
            and t.is_virtual
            and declared.is_floating_point
            and declared.itemsize > io.itemsize
        ):
            return io
        return declared

    def promote(self, *tensors: TensorAttributes | None) -> torch.dtype:
        """The promoted dtype of the given tensors (None entries ignored)."""
        result: torch.dtype | None = None
        for t in tensors:
            if t is None:
                continue
            d = self.dtype(t)
            result = d if result is None else torch.promote_types(result, d)
        assert result is not None
        return result

    def memory_format(self, rank: int) -> torch.memory_format | None:
        """The memory format convolution operands are converted to, or None to keep them."""
        if not self.options.channels_last:
            return None
        return torch.channels_last if rank == 4 else torch.channels_last_3d

    # ---- operands -------------------------------------------------------------------------
    def read(
        self,
        t: TensorAttributes,
        dtype: torch.dtype | None = None,
        memory_format: torch.memory_format | None = None,
    ) -> Reader:
        """A reader of ``t``'s slot, converting to ``dtype`` (default :meth:`dtype`) and
        ``memory_format`` when they differ from the slot's."""
        if t.is_scalar:
            const = self.scalar_tensor(t, dtype)
            return lambda slots: const
        index = self.slot(t)
        dtype = dtype or self.dtype(t)
        cast = dtype != self.slot_dtype(t)
        if not cast and memory_format is None:
            if self.options.traceable:
                return lambda slots: slots[index]
            return operator.itemgetter(index)  # a C call: the cheapest reader
        if memory_format is None:

            def read_cast(slots: Slots) -> torch.Tensor:
                return slots[index].to(dtype)

            return read_cast

        def read_converted(slots: Slots) -> torch.Tensor:
            value = slots[index]
            if cast:
                value = value.to(dtype)
            return value.contiguous(memory_format=memory_format)

        return read_converted

    def scalar_value(self, t: TensorAttributes) -> float | int | bool:
        """A pass-by-value scalar's value as a Python number."""
        assert t.value is not None
        if t.data_type is not None and t.data_type.is_floating:
            return float(t.value)
        return t.value

    def scalar_tensor(self, t: TensorAttributes, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A pass-by-value scalar as a 0-dim tensor on the device (built once, here)."""
        return torch.tensor(self.scalar_value(t), dtype=dtype or self.dtype(t), device=self.device)

    def constant(self, t: TensorAttributes | None, what: str, node: Node) -> float:
        """The value of a scalar input that must be known at build time (epsilon, momentum)."""
        if t is None or not t.is_scalar:
            raise NotSupportedError(
                f"node {node.name!r}: {what} must be a pass-by-value scalar for this engine; "
                "give the tensor a value (g.scalar(...))"
            )
        return float(self.scalar_value(t))

    # ---- results --------------------------------------------------------------------------
    def out_buffer(
        self, t: TensorAttributes, dtype: torch.dtype, contiguous: bool = False
    ) -> int | None:
        """The slot of the caller's buffer for ``t`` when an op may write it with ``out=``.

        Only for graph outputs whose type equals the op's result type (``out=`` variants do
        not all cast) and, with ``contiguous``, whose layout is row-major.
        """
        if not self.options.out_variants or self.options.return_outputs or t.is_virtual:
            return None
        if self.slot_dtype(t) != dtype:
            return None
        if contiguous and t.strides != contiguous_strides(t.dims):
            return None
        return self.slot(t)

    def write(self, t: TensorAttributes) -> Writer:
        """A writer of a node's result for ``t``: into a slot (cast to ``t``'s type) or a buffer."""
        index = self.slot(t)
        dtype = self.slot_dtype(t)
        if t.is_virtual or self.options.return_outputs:

            def store(slots: Slots, value: torch.Tensor) -> None:
                slots[index] = value if value.dtype is dtype else value.to(dtype)

            return store

        def copy_out(slots: Slots, value: torch.Tensor) -> None:
            slots[index].copy_(value)

        return copy_out


def _runner(
    steps: tuple[Step, ...], n_scratch: int, result_slots: tuple[int, ...]
) -> Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]:
    """A program's run function, made for its shape so that a call does only what it needs."""
    if not n_scratch and not result_slots:
        # no intermediate and no returned output: no step stores into a slot (writers store
        # only virtual tensors and returned outputs), so the arguments serve as the slots
        as_slots = cast(tuple[Callable[[Sequence[torch.Tensor]], None], ...], steps)
        if len(as_slots) == 1:
            (only,) = as_slots

            def run_one(args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
                only(args)
                return ()

            return run_one

        def run_in_place(args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
            for step in as_slots:
                step(args)
            return ()

        return run_in_place
    scratch: tuple[None, ...] = (None,) * n_scratch

    def run(args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        slots: Slots = [*args, *scratch]
        for step in steps:
            step(slots)
        if not result_slots:
            return ()
        return tuple([slots[i] for i in result_slots])

    return run


def _uid(t: TensorAttributes) -> int:
    assert t.uid is not None, "validate() assigns every uid"
    return t.uid


def is_low_precision(dtype: torch.dtype) -> bool:
    return dtype in _LOW_PRECISION


def dummy_args(graph: OpGraph, uids: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Tensors with the dims, strides and types of ``uids`` (for trial runs and compiles).

    Floating tensors hold values in [0.5, 1.5) so that log, sqrt and division stay finite;
    boolean ones are all True (attention masks keep every key).
    """
    out = []
    for uid in uids:
        t = graph.tensor_by_uid(uid)
        dtype = (t.data_type or DataType.FLOAT).to_torch()
        # fill the storage, then view it: a broadcast tensor (stride 0 over more than one
        # element) cannot be filled in place through its view
        storage = torch.empty(t.storage_size(), dtype=dtype, device=device)
        if dtype.is_floating_point:
            storage.uniform_(0.5, 1.5)
        elif dtype == torch.bool:
            storage.fill_(True)
        else:
            storage.fill_(1)
        out.append(storage.as_strided(t.dims, t.strides))
    return out
