"""``Graph.execute``'s bound path: a plan bound once to the keys of a caller's pack.

A pack that passed the full check (:func:`~dnntune.backend.variant_pack.normalize_variant_pack`)
binds the plan (:meth:`~dnntune.backend.engine.Plan.bind`) to its keys; a later pack with the
same keys and layouts goes to the bound call after one generated comparison per tensor
(PyTorch's C++ tensor guards where they are there), and anything else takes the full path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.backend import native
from dnntune.backend.pack_aliasing import Aliasing
from dnntune.backend.tensor_guards import tensor_guard
from dnntune.backend.variant_pack import gather_keys, handle_place
from dnntune.graph.tensor import TensorAttributes

if TYPE_CHECKING:
    import torch

    from dnntune.backend.engine import BoundCall, Plan, PointerCall
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["PackBinding", "bind_pack"]


class PackBinding:
    """``Graph.execute``'s fast path: a plan bound to the keys of the caller's pack.

    Made after a pack passed the full check (:func:`normalize_variant_pack`); a later pack with
    the same keys goes straight to the plan's bound call (:meth:`Plan.bind`) after one check
    per tensor of its type, dtype, device type, dims and strides against the layout the plan was
    built for (exact strides: a size-1 dim with another stride, which the full check accepts,
    takes the full path). "The same keys" is exactly the bound pack's keys (as many, each
    present), so a key the full check refuses (a tensor of another graph, a tensor given again
    by uid) never reaches the bound call. Anything else (other keys, a NumPy array, another
    layout) returns None from :attr:`tensors`, and the caller takes the full path, which names
    what is wrong.
    Buffers at other addresses than the last pack's are checked for overlap first
    (:class:`Aliasing`), which raises InvalidValueError as the full path does.
    """

    __slots__ = ("call", "handle", "plan", "plans", "read_pointers", "run", "tensors")

    def __init__(
        self,
        plan: Plan,
        handle: Handle,
        plans: object,
        keys: Sequence[Any],
        layout: Sequence[tuple[torch.dtype, torch.Size, tuple[int, ...], bool]],
        call: BoundCall,
        memory: Aliasing | None = None,
        extra_keys: Sequence[Any] = (),
        examples: Sequence[Any] | None = None,
        pointer_call: PointerCall | None = None,
        read_pointers: Callable[[tuple[Any, ...]], bytes] | None = None,
    ) -> None:
        """``layout``: per key, the dtype, dims and strides the plan was built for, and True
        (the tensor is on the handle's device type: ``is_cuda``, or ``is_cpu`` on the CPU).
        ``memory``: the overlap check of the keys' tensors (None: none). ``extra_keys``: the
        bound pack's other keys (ignored, as by the full check, but required: a pack with
        other keys than the bound one takes the full path). ``examples``: the bound pack's
        tensors, in key order (a later pack must match them as PyTorch's tensor guards see
        them: also their ``requires_grad``; None: the layout alone). ``pointer_call``: the
        plan's call on data pointers (:meth:`Plan.bind_pointers`), given the addresses the
        overlap check has read (None: ``call`` reads them again). ``read_pointers``: the
        compiled pointer reader, used with ``pointer_call`` (None: ``Tensor.data_ptr`` per
        tensor)."""
        self.plan = plan
        self.handle = handle
        #: the plan collection the plan was selected from (a new one makes a new binding)
        self.plans = plans
        self.call = call
        #: the compiled pointer reader the bound call reads the addresses with (None: none)
        self.read_pointers = read_pointers if memory is not None and pointer_call else None
        on_device = "is_cuda" if handle.is_cuda else "is_cpu"
        place = handle_place(handle)
        #: ``tensors(pack)``: the pack's tensors in bound order if each has the bound layout
        #: (per tensor: dtype, dims, strides, on the handle's device type), else None; raises
        #: InvalidValueError when an output overlaps another buffer
        self.tensors: Callable[[Mapping[Any, Any]], Sequence[torch.Tensor] | None]
        #: ``run(pack, workspace)``: execute ``pack`` through the bound call on the handle's
        #: stream if it is a ``dict`` with the bound layout (True), else do nothing (False:
        #: take the full path); the check of :attr:`tensors` and the call in one frame
        self.run: Callable[[Any, torch.Tensor | None], bool]
        self.tensors, self.run = _generated(
            keys,
            layout,
            on_device,
            memory,
            extra_keys,
            examples,
            device_index=None if place is None or place < 0 else place,
            call=call,
            pointer_call=pointer_call if memory is not None else None,
            handle=handle,
            read_pointers=self.read_pointers,
        )


def _generated(
    keys: Sequence[Any],
    layout: Sequence[tuple[torch.dtype, torch.Size, tuple[int, ...], bool]],
    on_device: str,
    memory: Aliasing | None,
    extra_keys: Sequence[Any],
    examples: Sequence[Any] | None,
    device_index: int | None,
    call: BoundCall | None = None,
    pointer_call: PointerCall | None = None,
    handle: Handle | None = None,
    read_pointers: Callable[[tuple[Any, ...]], bytes] | None = None,
) -> tuple[
    Callable[[Mapping[Any, Any]], Sequence[torch.Tensor] | None],
    Callable[[Any, torch.Tensor | None], bool],
]:
    """:attr:`PackBinding.tensors` and :attr:`PackBinding.run` for these keys and layouts,
    made once per binding from one template.

    The check is one comparison of one flat tuple (the tensors unpacked into locals, no tuple
    per tensor: a fifth less host time than a comprehension, measured with four tensors), or
    PyTorch's C++ tensor guard where there is one. The tuple starts with the pack's length:
    with every key (and extra key) present, an equal length means no other key. With
    ``memory``, a second tuple of the data pointers is compared with the last pack's that
    passed ``memory.check`` (run when they differ); ``run`` hands those pointers to
    ``pointer_call`` where there is one, so they are read once. With ``device_index`` (a CUDA
    handle's device), each tensor's ``get_device()`` must be it: a pointer into another GPU's
    memory is not this device's. With ``read_pointers`` (the compiled pointer reader,
    :func:`dnntune.backend.native.pointer_reader`), the pointers are read in one native call
    as bytes, which ``pointer_call`` takes as they are (a tensor without storage raises
    RuntimeError there: the full path). (``run`` needs ``call`` and ``handle``; ``tensors``
    alone does not.)"""
    import torch

    gather = gather_keys(keys)
    on_index = "" if device_index is None else ", {v}.get_device()"
    rows = [row if device_index is None else (*row, device_index) for row in layout]
    # each tensor also no lazy negative view (the full check names it): the guard's dispatch
    # keys hold that too
    rows = [(*row, False) for row in rows]
    expected = (len(keys) + len(extra_keys), *(item for row in rows for item in row))
    names = [f"v{i}" for i in range(len(keys))]
    fields = "len(pack), " + "".join(
        f"{v}.dtype, {v}.shape, {v}.stride(), {v}.{on_device}{on_index.format(v=v)}, {v}.is_neg(), "
        for v in names
    )
    condition = f"({fields}) == expected"
    guard = tensor_guard(layout, on_device, examples) if examples is not None else None
    if guard is not None:
        # PyTorch's C++ tensor check (dtype, device, dims, strides, and the dispatch keys:
        # also requires_grad and a conjugate or negative view) in one call, a fifth of the
        # Python comparison's time (four tensors: 0.27 against 1.3 µs on the CPU)
        condition = f"len(pack) == {expected[0]} and guard(*values)"
    pointers = "".join(f"{v}.data_ptr(), " for v in names)
    read_them = f"({pointers})"
    as_ints = "pointers"
    caught = "KeyError, AttributeError, TypeError"
    if read_pointers is not None:
        # one native call for every address; the overlap check (new addresses only) unpacks
        read_them, as_ints = "read_pointers(values)", "unpack(pointers)"
        caught += ", RuntimeError"
    check_extra = "extra(pack)  # KeyError: not the bound keys" if extra_keys else "pass"
    on_new_pointers = (
        f"pointers = {read_them}\n"
        "            if pointers != checked[0]:\n"
        f"                memory.check(values, {as_ints})  # raises InvalidValueError\n"
        "                checked[0] = pointers"
        if memory is not None
        else "pass"
    )
    invoke = "pointer_call(pointers, workspace)" if pointer_call else "call(values, workspace)"
    # the tensors by name, for the Python comparison or the addresses read in Python; with
    # the C++ guard and the native reader nothing reads them (one unpacking less per call)
    unpack_line = (
        "pass"
        if guard is not None and read_pointers is not None
        else f"{', '.join(names)}, = values"
    )
    source = f"""
def tensors(pack):
    try:
        values = gather(pack)
        {check_extra}
        {unpack_line}
        if {condition}:
            {on_new_pointers}
            return values
    except ({caught}):  # other keys; a value no tensor (or one without storage)
        pass
    return None

def run(pack, workspace):
    if type(pack) is not dict or (workspace is not None and type(workspace) is not Tensor):
        return False  # the full path checks (and names) anything else
    try:
        values = gather(pack)
        {check_extra}
        {unpack_line}
        if not ({condition}):
            return False
        {on_new_pointers.replace(chr(10) + "    ", chr(10))}
    except ({caught}):  # other keys; a value no tensor (or one without storage)
        return False
    if handle.stream is None:
        {invoke}
    else:
        with handle.stream_context():
            {invoke}
    return True
"""
    scope: dict[str, Any] = {
        "gather": gather,
        "extra": gather_keys(extra_keys) if extra_keys else None,
        "expected": expected,
        "memory": memory,
        # the data pointers of the last pack that passed memory.check (None: none yet)
        "checked": [None],
        "guard": guard,
        "call": call,
        "pointer_call": pointer_call,
        "handle": handle,
        "Tensor": torch.Tensor,
        "read_pointers": read_pointers,
        "unpack": struct.Struct(f"{len(keys)}Q").unpack,
    }
    exec(compile(source, "<dnntune pack binding>", "exec"), scope)
    return scope["tensors"], scope["run"]


def bind_pack(
    graph: OpGraph, pack: Mapping[Any, Any], plan: Plan, handle: Handle, plans: object
) -> PackBinding | None:
    """A :class:`PackBinding` of ``plan`` to ``pack``'s keys (a pack that passed the full
    check), or None when the pack cannot be bound (a uid given twice, a tensor without a type).
    """
    import torch

    io = {t.uid: t for t in graph.io_tensors()}
    keys: list[Any] = []
    uids: list[int] = []
    extra_keys: list[Any] = []
    seen: set[int] = set()
    for key in pack:
        if key is None:
            extra_keys.append(key)  # skipped by the full check (cuDNN frontend's rule)
            continue
        if type(key) is not int and not isinstance(key, TensorAttributes):
            return None  # an int subclass or a value equal to a uid: the full path decides
        uid = key.uid if isinstance(key, TensorAttributes) else key
        if uid is not None:
            if uid in seen:
                return None  # given twice (the same buffer): a later pack might not be
            seen.add(uid)
        if uid is None or uid not in io:
            extra_keys.append(key)  # ignored, as by the full check
            continue
        keys.append(key)
        uids.append(uid)
    if len(uids) != len(io) or not uids:
        return None
    layout = []
    for uid in uids:
        t = io[uid]
        if t.data_type is None:
            return None
        dims, strides = torch.Size(t.dims), tuple(t.strides)
        layout.append((t.data_type.to_torch(), dims, strides, True))
    try:
        call = plan.bind(uids)
    except ValueError:  # a plan that reads tensors the graph does not list: no fast path
        return None
    memory = Aliasing(graph, [io[uid] for uid in uids])
    examples = [pack[k] for k in keys]
    pointer_call = plan.bind_pointers(uids) if plan.takes_pointers else None
    read_pointers = None
    if pointer_call is not None and handle.is_cuda and all(map(_plain, examples)):
        # every address in one native call where the helper is built (or being built: a
        # later binding, the next process, gets it; none waits for a build here)
        read_pointers = native.ready_pointer_reader()
    return PackBinding(
        plan,
        handle,
        plans,
        keys,
        layout,
        call,
        memory,
        extra_keys,
        examples,
        pointer_call,
        read_pointers,
    )


def _plain(value: Any) -> bool:
    """A plain tensor or parameter (a subclass may keep no storage for the reader to read)."""
    import torch

    return type(value) is torch.Tensor or type(value) is torch.nn.Parameter
