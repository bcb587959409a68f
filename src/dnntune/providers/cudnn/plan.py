"""One built cuDNN plan as dnntune's :class:`~dnntune.backend.engine.Plan`: its execute on a
variant pack, and its bound calls (one Python frame per call on prepared packs and handles, or
one native call through cuDNN's backend API where :mod:`.direct` can run it)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.backend.engine import BoundCall, Engine, Plan, PointerCall, VariantPack
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.variant_pack import MisalignedPointers, PointerPacks
from dnntune.errors import ExecutionError, InvalidValueError
from dnntune.providers.cudnn._runtime import cudnn_handle, current_stream_ptr, raw_stream_getter
from dnntune.providers.cudnn.alignment import ALIGNMENT, Staging
from dnntune.providers.cudnn.direct import DirectCall, direct_call
from dnntune.providers.cudnn.problem import CudnnProblem

if TYPE_CHECKING:
    import torch

__all__ = ["CudnnPlan"]

_log = logging.getLogger(__name__)


class CudnnPlan(Plan):
    """One cuDNN plan of a lowered graph. ``execute`` passes device pointers by uid.

    The ``{uid: pointer}`` variant pack is built once per set of buffer addresses and reused
    (:class:`PointerPacks`), and the cuDNN handle once per stream: a call with buffers seen
    before does no Python work beyond reading their addresses. Addresses that break the
    16-byte alignment the plan was built for (found where a pack is made) run on aligned
    copies (:mod:`.alignment`).
    """

    takes_pointers = True

    def __init__(
        self,
        engine: Engine,
        knob_settings: Sequence[KnobSetting],
        problem: CudnnProblem,
        index: int,
        workspace_size: int,
        metadata: dict[str, Any],
    ) -> None:
        super().__init__(engine, knob_settings, workspace_size, metadata)
        self._problem = problem
        self._plan_index = index
        #: the frontend call and the plan's index in its graph (:meth:`CudnnProblem.runner`)
        self._run, self._index = problem.runner(index)
        self._io_uids: tuple[int, ...] = tuple(problem.io_uids)
        self._scalars = problem.scalar_pointers
        self._device_index = problem.device_index
        #: raw stream pointer -> cuDNN handle bound to that stream
        self._handles: dict[int, int] = {}
        self._packs = PointerPacks(self._io_uids, self._scalars, ALIGNMENT)
        import torch

        lowered = problem.lowered
        self._staging = Staging(
            lowered.spans, lowered.outputs, torch.device("cuda", self._device_index)
        )
        #: the direct calls made for this plan, by the items' uid order (bind and
        #: bind_pointers of one order share one: one plan made from JSON, one set of packs)
        self._directs: dict[tuple[int | None, ...], DirectCall | None] = {}

    def _handle(self, stream_ptr: int) -> int:
        handle = self._handles.get(stream_ptr)
        if handle is None:
            handle = self._handles[stream_ptr] = cudnn_handle(self._device_index, stream_ptr)
        return handle

    def _workspace_ptr(self, workspace: torch.Tensor | None) -> int:
        if self.workspace_size <= 0:
            return 0
        have = 0 if workspace is None else workspace.numel() * workspace.element_size()
        if workspace is None or have < self.workspace_size:
            raise InvalidValueError(
                f"plan {self.name} needs a workspace of {self.workspace_size} bytes, got {have}"
            )
        return int(workspace.data_ptr())

    def execute(
        self,
        variant_pack: VariantPack,
        workspace: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        try:
            pointers = tuple([variant_pack[uid].data_ptr() for uid in self._io_uids])
        except KeyError as exc:
            raise InvalidValueError(
                f"plan {self.name}: variant pack is missing tensor uid {exc.args[0]}"
            ) from None
        workspace_ptr = self._workspace_ptr(workspace)
        stream_ptr = (
            stream.cuda_stream if stream is not None else current_stream_ptr(self._device_index)
        )
        handle, packs, run, index = self._handle(stream_ptr), self._packs, self._run, self._index
        try:
            try:
                run(packs.get(pointers), workspace_ptr, index, handle)
            except MisalignedPointers:
                self._run_staged(
                    self._io_uids,
                    pointers,
                    stream_ptr,
                    lambda staged: run(packs.get(staged), workspace_ptr, index, handle),
                )
        except Exception as exc:
            raise ExecutionError(f"plan {self.name}: cuDNN execute failed: {exc}") from None

    def _run_staged(
        self,
        keys: Sequence[int | None],
        pointers: Sequence[int],
        stream_ptr: int,
        execute: Callable[[tuple[int, ...]], object],
    ) -> None:
        """``execute`` on aligned copies of the misaligned tensors (:mod:`.alignment`), the
        copies made and copied back on the plan's stream."""
        import torch

        if self._staging.device.type != "cuda":  # a test's plan on the CPU
            self._staging.run(keys, pointers, execute)
            return
        stream = torch.cuda.ExternalStream(stream_ptr, device=self._staging.device)
        with torch.cuda.device(self._device_index), torch.cuda.stream(stream):
            self._staging.run(keys, pointers, execute)

    def bind(self, uids: Sequence[int]) -> BoundCall:
        """The plan's execute on the tensors' addresses: one native call through cuDNN's
        backend API where :mod:`.direct` can run the plan, else the frontend's execute (per
        call, one address read per tensor, one dict lookup for the pack, one for the stream's
        handle)."""
        return self._pointer_call(uids, read=True)

    def bind_pointers(self, uids: Sequence[int]) -> PointerCall:
        """:meth:`bind` on addresses the caller read (``Graph.execute``'s bound path reads
        them for its overlap check)."""
        return self._pointer_call(uids, read=False)

    def _pointer_call(
        self, uids: Sequence[int], read: bool
    ) -> Callable[[Sequence[Any], torch.Tensor | None], None]:
        """The call of :meth:`bind` (``read``: it takes tensors and reads their addresses) or
        of :meth:`bind_pointers` (it takes the addresses: a tuple, or the native pointer
        reader's bytes), in one frame either way. Its packs are keyed in the caller's order
        (:class:`PointerPacks`), so nothing is reordered per call."""
        keys = tuple(uids)
        missing = [u for u in self._io_uids if u not in keys]
        if missing:
            raise InvalidValueError(f"plan {self.name}: bind() needs uid(s) {missing}")
        wanted = set(self._io_uids)
        slot_keys = tuple(u if u in wanted else None for u in keys)
        raw_stream = raw_stream_getter()
        device, handles, make_handle, name = (
            self._device_index,
            self._handles,
            self._handle,
            self.name,
        )
        need, workspace_ptr = self.workspace_size, self._workspace_ptr
        staged = self._run_staged  # a call on misaligned addresses (never on the hot path)
        # both calls below resolve the stream's handle and the workspace inline, not through a
        # shared helper: one Python frame per execute is the point of this path (issue 22)
        direct = self._direct_call(slot_keys)
        if direct is not None:

            def direct_call(items: Sequence[Any], workspace: torch.Tensor | None) -> None:
                stream_ptr = raw_stream(device)
                handle = handles.get(stream_ptr)
                if handle is None:
                    handle = make_handle(stream_ptr)
                ws = (
                    0
                    if need <= 0
                    else workspace.data_ptr()
                    if workspace is not None and workspace.nbytes >= need
                    else workspace_ptr(workspace)
                )
                try:
                    if direct(items, ws, handle) is False:  # misaligned: nothing ran
                        staged(
                            slot_keys,
                            _addresses(items),
                            stream_ptr,
                            lambda aligned: direct(aligned, ws, handle),
                        )
                except RuntimeError as exc:
                    raise ExecutionError(f"plan {name}: cuDNN execute failed: {exc}") from None

            return direct_call

        packs = PointerPacks(slot_keys, self._scalars, ALIGNMENT)  # the frontend's execute only
        data_ptr = _data_ptr() if read else None
        index, run, get_pack, known = self._index, self._run, packs.get, packs.lookup

        def call(items: Sequence[Any], workspace: torch.Tensor | None) -> None:
            pointers: Any = tuple(map(data_ptr, items)) if data_ptr is not None else items
            stream_ptr = raw_stream(device)
            handle = handles.get(stream_ptr)
            if handle is None:
                handle = make_handle(stream_ptr)
            ws = (
                0
                if need <= 0
                # a large enough workspace inline; anything else is named by _workspace_ptr
                else workspace.data_ptr()
                if workspace is not None and workspace.nbytes >= need
                else workspace_ptr(workspace)
            )
            try:
                try:
                    pack = known(pointers) or get_pack(pointers)
                except MisalignedPointers as misaligned:
                    staged(
                        slot_keys,
                        misaligned.pointers,
                        stream_ptr,
                        lambda aligned: run(get_pack(aligned), ws, index, handle),
                    )
                    return
                run(pack, ws, index, handle)
            except Exception as exc:
                raise ExecutionError(f"plan {name}: cuDNN execute failed: {exc}") from None

        return call

    def _direct_call(self, keys: tuple[int | None, ...]) -> DirectCall | None:
        """This plan executed through cuDNN's backend API by the compiled helper
        (:mod:`.direct`), on items given in ``keys``' order, or None (the frontend's execute);
        made once per order."""
        if keys in self._directs:
            return self._directs[keys]
        made = self._make_direct_call(keys)
        self._directs[keys] = made
        return made

    def _make_direct_call(self, keys: tuple[int | None, ...]) -> DirectCall | None:
        try:
            blob = self._problem.serialized(self._plan_index)
            handle = self._handle(current_stream_ptr(self._device_index))
        except Exception as exc:  # no serialization, no handle: the frontend's execute
            _log.debug("cuDNN direct call for %s: %s", self.name, exc)
            return None
        import torch

        with torch.cuda.device(self._device_index):  # the plan's module loads on its device
            return direct_call(blob, handle, keys, self._scalars, self.workspace_size)


def _addresses(items: Any) -> tuple[int, ...]:
    """The addresses of a call's items: the native reader's bytes, ints, or tensors."""
    if type(items) is bytes:
        return struct.unpack(f"{len(items) // 8}Q", items)
    return tuple(i if isinstance(i, int) else 0 if i is None else i.data_ptr() for i in items)


def _data_ptr() -> Callable[[Any], int]:
    import torch

    return torch.Tensor.data_ptr
