"""Launching a compiled kernel with little host overhead.

``kernel[grid](*args, **meta)`` re-binds and re-specializes every argument on each call (tens
of microseconds of Python for a matmul's twenty arguments), which is as long as a decode-sized
matmul runs. A plan's sizes, strides, dtypes and meta-parameters never change, so
:class:`Launch` binds once: after the first launch it calls the compiled kernel directly,
as long as every pointer keeps the 16-byte alignment Triton specialized on (otherwise, and
whenever a launch hook is installed, it takes Triton's normal path). It passes the pointers as
the integers the alignment check has read: Triton's launcher takes an int as the address
itself, where for a tensor it calls ``data_ptr()`` again and asks the driver about the address
(``cuPointerGetAttribute``), one call each per pointer and launch.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["WORKSPACE", "Launch", "OneKernel", "gatherer"]

#: in :meth:`Launch.bind_chain`'s pointer uids: the call's workspace, not a tensor of the pack
WORKSPACE = -1

#: Triton versions whose ``CompiledKernel.run`` calling convention this module follows
_DIRECT_VERSIONS = ((3, 6),)


@functools.cache
def _data_ptr() -> Callable[[Any], int]:
    import torch

    return torch.Tensor.data_ptr


def gatherer(uids: Sequence[int]) -> Callable[[Any], tuple[Any, ...]]:
    """A pack's tensors of ``uids``, in order, by one C call (launchers run it every launch);
    also a sequence's items at positions ``uids``."""
    keys = tuple(uids)
    if not keys:
        return lambda pack: ()
    if len(keys) == 1:
        (uid,) = keys
        return lambda pack: (pack[uid],)
    return operator.itemgetter(*keys)


def _direct_supported() -> bool:
    import triton

    try:
        major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) in _DIRECT_VERSIONS


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is installed. Triton 3.6's knobs hold a ``HookChain`` that
    is never None (an empty chain: no hook), older ones None or the hook itself."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return not isinstance(calls, list) or bool(calls)


class Launch:
    """One kernel with a fixed grid and meta-parameters; its first ``n_ptrs`` args are tensors."""

    def __init__(
        self, kernel: Any, grid: tuple[int, ...], meta: Mapping[str, Any], n_ptrs: int
    ) -> None:
        self.kernel = kernel
        self.grid = (*grid, *([1] * (3 - len(grid))))
        self.meta = dict(meta)
        self.n_ptrs = n_ptrs
        self._compiled: Any = None
        self._tail: list[Any] = []
        self._stream: Any = None
        self._device = 0

    def __call__(self, args: Sequence[Any], warmup: bool = False) -> None:
        """Launch (or, with ``warmup``, only compile) on the current stream."""
        if warmup:
            self.kernel.warmup(*args, grid=self.grid, **self.meta)
            return
        compiled = self._compiled
        if compiled is not None:
            n = self.n_ptrs
            # the addresses, read once: for the alignment check and as the launch's arguments
            ptrs = list(map(_data_ptr(), args[:n]))
            if not any(p & 15 for p in ptrs):
                g0, g1, g2 = self.grid
                compiled.run(
                    g0, g1, g2, self._stream(self._device), compiled.function,
                    compiled.packed_metadata, None, None, None, *ptrs, *args[n:], *self._tail,
                )  # fmt: skip
                return
        kernel = self.kernel[self.grid](*args, **self.meta)
        if compiled is None:
            self._enable_direct(kernel, args)

    def bind(
        self,
        ptr_uids: Sequence[int],
        scalars: Sequence[Any],
        uids: Sequence[int],
        fallback: Callable[[Sequence[Any], Any], None],
    ) -> Callable[[Sequence[Any], Any], None]:
        """A plan's bound call (``Plan.bind``) for a launcher whose launch takes the pack's
        tensors of ``ptr_uids`` then ``scalars``: the caller's tensors come in ``uids`` order,
        and once the kernel is compiled for direct launches a call picks them, reads their
        addresses and launches, in one frame (no pack, no launcher frames). Before that, or
        for a misaligned address, it is ``fallback`` (the pack's path, which enables it)."""
        order = tuple(uids)
        if not ptr_uids or any(uid not in order for uid in ptr_uids):
            return fallback
        pick = gatherer([order.index(uid) for uid in ptr_uids])  # positions: a sequence's keys
        tail = tuple(scalars)
        data_ptr, launch = _data_ptr(), self
        g0, g1, g2 = self.grid

        def call(tensors: Sequence[Any], workspace: Any) -> None:
            compiled = launch._compiled
            if compiled is not None:
                ptrs = tuple(map(data_ptr, pick(tensors)))
                if not functools.reduce(operator.or_, ptrs) & 15:
                    compiled.run(
                        g0, g1, g2, launch._stream(launch._device), compiled.function,
                        compiled.packed_metadata, None, None, None, *ptrs, *tail,
                        *launch._tail,
                    )  # fmt: skip
                    return
            fallback(tensors, workspace)

        return call

    @staticmethod
    def bind_chain(
        steps: Sequence[tuple[Launch, Sequence[int], Sequence[Any]]],
        uids: Sequence[int],
        workspace_bytes: int,
        fallback: Callable[[Sequence[Any], Any], None],
    ) -> Callable[[Sequence[Any], Any], None]:
        """:meth:`Launch.bind` for a plan of several launches in order (a split-K GEMM and its
        reduction), each ``(launch, pointer uids, scalars)``, where a pointer uid may be
        :data:`WORKSPACE` (the call's workspace, at least ``workspace_bytes``). Once every launch
        is compiled for direct launches, a call reads each address once and launches them all
        directly; before that, for a workspace that is missing or too small (the pack's path names
        it), or for a misaligned address, it is ``fallback``, which launches them all its way."""
        order = tuple(uids)
        wanted = {uid for _, ptr_uids, _ in steps for uid in ptr_uids if uid != WORKSPACE}
        if not steps or any(uid not in order for uid in wanted):
            return fallback
        sources = sorted(wanted)
        pick = gatherer([order.index(uid) for uid in sources])
        # per step, where each pointer comes from in (workspace, *sources)
        slots = [
            tuple(0 if uid == WORKSPACE else 1 + sources.index(uid) for uid in ptr_uids)
            for _, ptr_uids, _ in steps
        ]
        plan = [
            (launch, operator.itemgetter(*at) if len(at) > 1 else _single(at[0]), tuple(scalars))
            for (launch, _, scalars), at in zip(steps, slots, strict=True)
        ]
        data_ptr = _data_ptr()
        launches = tuple(launch for launch, _, _ in plan)
        # each launch's compiled kernel (None until its first launch enabled the direct path)
        # and the constexprs it appends, read per call as the launch holds them
        state_of = operator.attrgetter("_compiled", "_tail")
        stream_of = operator.attrgetter("_stream", "_device")

        def call(tensors: Sequence[Any], workspace: Any) -> None:
            states = tuple(map(state_of, launches))
            if all(compiled is not None for compiled, _ in states) and (
                workspace_bytes <= 0
                or (workspace is not None and workspace.nbytes >= workspace_bytes)
            ):
                ws = workspace.data_ptr() if workspace_bytes > 0 else 0
                ptrs = (ws, *map(data_ptr, pick(tensors)))
                if not functools.reduce(operator.or_, ptrs) & 15:
                    current_stream, device = stream_of(launches[0])
                    stream = current_stream(device)
                    for (compiled, constexprs), (launch, take, tail) in zip(
                        states, plan, strict=True
                    ):
                        g0, g1, g2 = launch.grid
                        compiled.run(
                            g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                            None, None, None, *take(ptrs), *tail, *constexprs,
                        )  # fmt: skip
                    return
            fallback(tensors, workspace)

        return call

    def _aligned(self, args: Sequence[Any]) -> bool:
        # one C-level pass over the addresses (a generator costs a microsecond per launch)
        return not any(p & 15 for p in map(_data_ptr(), args[: self.n_ptrs]))

    def _enable_direct(self, kernel: Any, args: Sequence[Any]) -> None:
        try:
            import triton
            from triton.runtime import driver

            hooks = triton.knobs.runtime
            if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
                return
            if not _direct_supported() or not self._aligned(args):
                return
            names = self.kernel.arg_names[len(args) :]
            if not all(name in self.meta for name in names):
                return
            if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
                return
            self._tail = [self.meta[name] for name in names]
            self._device = driver.active.get_current_device()
            self._stream = driver.active.get_current_stream
            self._compiled = kernel
        except Exception:  # any surprise: stay on Triton's normal launch path
            self._compiled = None


def _single(index: int) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    return lambda seq: (seq[index],)


class OneKernel:
    """A plan's launcher of one kernel with every argument but the buffers fixed: the pack's
    tensors of ``uids`` in the kernel's pointer order, then ``scalars``. The kernel modules'
    launchers (all but the matmul's, which may launch a split-K reduction after its kernel)
    compute these from their match and config and hand them here."""

    workspace_bytes = 0

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        meta: Mapping[str, Any],
        uids: Sequence[int],
        scalars: tuple[Any, ...],
    ) -> None:
        self.uids = list(uids)
        self.scalars = scalars
        self._gather = gatherer(self.uids)
        self.launch = Launch(kernel, grid, meta, len(self.uids))

    def __call__(self, pack: Mapping[int, Any], workspace: Any, warmup: bool = False) -> None:
        self.launch([*self._gather(pack), *self.scalars], warmup)

    def bind(
        self, uids: Sequence[int], fallback: Callable[[Sequence[Any], Any], None]
    ) -> Callable[[Sequence[Any], Any], None]:
        """The plan's bound call, launching directly (:meth:`Launch.bind`)."""
        return self.launch.bind(self.uids, self.scalars, uids, fallback)
