"""cuDNN plans executed through cuDNN's backend API directly, one C call per execute (issue 22).

The frontend's ``_execute_plan_at_index`` (nvidia-cudnn-frontend 1.16 has no prepared entry)
converts a ``{uid: address}`` dict on every call and builds, finalizes and destroys a backend
variant pack before ``cudnnBackendExecute``. On the H200 that is 1.3-2.9 µs per call over the
execute itself (session 29's probe: layernorm 5.79 against 4.15 µs, a fused GEMM 10.19 against
7.32 µs, even through ctypes).

Here a bound cuDNN call (:meth:`CudnnPlan.bind`, what ``Graph.execute``'s bound path,
``dnntune.torch``'s kernels and the tuner's timing loops call) runs the plan through a compiled
helper (:mod:`.direct_source`): the plan is made once from its JSON (the frontend's
``serialize()``: ``cudnn_backend_data``), a variant pack is made once per set of addresses and
kept (up to :data:`PACK_LIMIT`, most recent first), and each call is one native call that reads
the addresses and executes. The outputs are the frontend's, bit for bit (the same plan, the same
kernel).

Used only where it is exactly the frontend's execute: a plan whose serialization names no
workspace the frontend fills (``workspace_modifications``), no pointer it offsets
(``variant_pack_replacements``) and no workspace of its own (``fe_workspace_size``), whose
variant pack holds only the graph's tensors and scalars and the values the frontend passes by
value (``pass_by_values``: attention's scale and mask value; the helper keeps each value and
passes its address, as the frontend does), on cuDNN 9 (whose backend ABI fixes the enum values
below) with the helper built.
Anything else, ``DNNTUNE_DISABLE_CUDNN_DIRECT`` or ``DNNTUNE_DISABLE_NATIVE`` keeps the
frontend's execute.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dnntune import settings
from dnntune.backend import native
from dnntune.providers.cudnn import ubjson
from dnntune.providers.cudnn.direct_source import HELPER

__all__ = [
    "PACK_LIMIT",
    "DirectCall",
    "Layout",
    "backend_library",
    "direct_call",
    "pack_count",
    "plan_layout",
]

_log = logging.getLogger(__name__)

#: variant packs kept per plan (one per set of addresses a bound call has seen)
PACK_LIMIT = 64

# cuDNN 9's backend enum values (cudnn_graph.h; fixed within a major version's ABI)
_EXECUTION_PLAN_DESCRIPTOR = 5
_VARIANT_PACK_DESCRIPTOR = 16
_TYPE_HANDLE = 0
_TYPE_INT64 = 3
_TYPE_VOID_PTR = 6
_TYPE_CHAR = 24
_ATTR_PLAN_HANDLE = 400
_ATTR_PLAN_WORKSPACE_SIZE = 402
_ATTR_PLAN_JSON = 405
_ATTR_PACK_UIDS = 1000
_ATTR_PACK_POINTERS = 1001
_ATTR_PACK_WORKSPACE = 1003

#: ``run(items, workspace_ptr, handle)``: one execute on the items' addresses
#: ``run(items, workspace, handle)``: None, or False where an address is misaligned (nothing run)
DirectCall = Callable[[Any, int, int], bool | None]


@functools.cache
def backend_library() -> ctypes.CDLL | None:
    """The libcudnn this process has loaded (the frontend's and PyTorch's), if it is cuDNN 9."""
    lib = None
    try:
        lib = ctypes.CDLL("libcudnn.so.9", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except (OSError, AttributeError):
        for path in _loaded_paths():
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
                break
            except OSError:
                continue
    if lib is None:
        return None
    try:
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        if int(lib.cudnnGetVersion()) // 10000 != 9:
            return None
        void_p = ctypes.c_void_p
        lib.cudnnBackendCreateDescriptor.argtypes = [ctypes.c_int, ctypes.POINTER(void_p)]
        lib.cudnnBackendSetAttribute.argtypes = [void_p, ctypes.c_int, ctypes.c_int]
        lib.cudnnBackendSetAttribute.argtypes += [ctypes.c_int64, void_p]
        lib.cudnnBackendGetAttribute.argtypes = [void_p, ctypes.c_int, ctypes.c_int]
        lib.cudnnBackendGetAttribute.argtypes += [ctypes.c_int64]
        lib.cudnnBackendGetAttribute.argtypes += [ctypes.POINTER(ctypes.c_int64), void_p]
        lib.cudnnBackendFinalize.argtypes = [void_p]
        lib.cudnnBackendDestroyDescriptor.argtypes = [void_p]
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
    except AttributeError:  # a library without the backend API
        return None
    return lib


def _loaded_paths() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            names = {line.split()[-1] for line in maps if "libcudnn.so" in line}
    except OSError:
        return []
    return sorted(n for n in names if os.path.basename(n).startswith("libcudnn.so"))


#: a plan's layout: its backend JSON, its variant pack's uids, and the values the frontend
#: passes by value ({uid: the value's bytes as a little-endian uint64})
Layout = tuple[str, list[int], dict[int, int]]


def plan_layout(blob: bytes) -> Layout | None:
    """The backend JSON, variant-pack uids and by-value values of a frontend serialization, or
    None where the frontend does more at execute time than pass pointers and by-value values
    (see the module's docstring)."""
    try:
        data = ubjson.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        _log.debug("cuDNN direct call: serialization not read: %s", exc)
        return None
    if not isinstance(data, dict):
        return None
    backend, uids = data.get("cudnn_backend_data"), data.get("variant_pack_uids")
    if not isinstance(backend, str) or not backend or not isinstance(uids, list) or not uids:
        return None
    if data.get("workspace_modifications") or data.get("variant_pack_replacements"):
        return None
    if data.get("fe_workspace_size", 0) != 0:
        return None
    if not all(type(u) is int for u in uids) or len(set(uids)) != len(uids):
        return None
    by_value = _by_value(data.get("pass_by_values"))
    if by_value is None:
        return None
    return backend, uids, by_value


def _by_value(entries: Any) -> dict[int, int] | None:
    """The frontend's ``pass_by_values`` (pairs ``[uid, {"index", "value"}]`` or an object keyed
    by uid; the index is the type's in ``variant<int64, int32, half, float, bfloat16>``, a float
    written as the hex of its bits) as {uid: the value's little-endian bytes as a uint64}, or
    None for anything else."""
    if not entries:
        return {}
    pairs = list(entries.items()) if isinstance(entries, dict) else entries
    if not isinstance(pairs, list):
        return None
    out: dict[int, int] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[1], dict):
            return None
        try:
            uid, index, value = int(pair[0]), pair[1].get("index"), pair[1].get("value")
            bits = _value_bits(index, value)
        except (TypeError, ValueError, OverflowError, struct.error):
            return None
        if bits is None:
            return None
        out[uid] = bits
    return out


def _value_bits(index: Any, value: Any) -> int | None:
    if index in (0, 1) and type(value) is int:  # int64, int32
        return value & (0xFFFFFFFFFFFFFFFF if index == 0 else 0xFFFFFFFF)
    if index not in (2, 3, 4) or not isinstance(value, str) or len(value) != 8:
        return None
    bits = int(value, 16)  # float: its bits, written as 8 hex digits
    if index == 3:
        return bits
    number = struct.unpack("<f", struct.pack("<I", bits))[0]
    if index == 2:  # half, written as the float it converts to exactly
        return int(struct.unpack("<H", struct.pack("<e", number))[0])
    return bits >> 16  # bfloat16: the float's upper half, exact for a bfloat16 value


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        text = lib.cudnnGetErrorString(status)
        raise OSError(f"cuDNN {what} failed: {text.decode() if text else status}")


def _plan_from_json(lib: ctypes.CDLL, handle: int, backend_json: str) -> int:
    """A finalized execution plan descriptor made from its JSON (the caller owns it)."""
    plan = ctypes.c_void_p()
    _check(lib, lib.cudnnBackendCreateDescriptor(_EXECUTION_PLAN_DESCRIPTOR, plan), "plan")
    try:
        h = ctypes.c_void_p(handle)
        status = lib.cudnnBackendSetAttribute(
            plan, _ATTR_PLAN_HANDLE, _TYPE_HANDLE, 1, ctypes.byref(h)
        )
        _check(lib, status, "plan handle")
        text = backend_json.encode()
        status = lib.cudnnBackendSetAttribute(plan, _ATTR_PLAN_JSON, _TYPE_CHAR, len(text), text)
        _check(lib, status, "plan JSON")
        _check(lib, lib.cudnnBackendFinalize(plan), "plan finalize")
    except BaseException:
        lib.cudnnBackendDestroyDescriptor(plan)
        raise
    return int(plan.value or 0)


def _workspace_size(lib: ctypes.CDLL, plan: int) -> int:
    size, count = ctypes.c_int64(), ctypes.c_int64()
    status = lib.cudnnBackendGetAttribute(
        ctypes.c_void_p(plan),
        _ATTR_PLAN_WORKSPACE_SIZE,
        _TYPE_INT64,
        1,
        ctypes.byref(count),
        ctypes.byref(size),
    )
    _check(lib, status, "plan workspace query")
    return int(size.value)


def _functions(lib: ctypes.CDLL) -> bytes:
    data_ptr = native.tensor_data_ptr_address()
    if data_ptr is None:
        raise OSError("this PyTorch exports no tensor data_ptr function")
    names = (
        "cudnnBackendCreateDescriptor",
        "cudnnBackendSetAttribute",
        "cudnnBackendFinalize",
        "cudnnBackendExecute",
        "cudnnBackendDestroyDescriptor",
        "cudnnGetErrorString",
    )
    addresses = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0 for n in names]
    return struct.pack("7Q", *addresses, data_ptr)


def direct_call(
    blob: bytes | None,
    handle: int,
    keys: Sequence[int | None],
    constants: Mapping[int, int],
    workspace_size: int,
) -> DirectCall | None:
    """``run(items, workspace_ptr, handle)`` executing the plan serialized in ``blob`` on
    ``items`` (one per entry of ``keys``: the uid whose address it gives, None for an item the
    plan does not take) and the ``constants`` (uid -> address), or None where the frontend's
    execute must be kept (never raises; why is logged at debug level)."""
    if blob is None or settings.native_disabled() or settings.cudnn_direct_disabled():
        return None
    layout = plan_layout(blob)
    lib = backend_library() if layout is not None else None
    if layout is None or lib is None:
        return None
    backend_json, uids, by_value = layout
    position = {uid: i for i, uid in enumerate(keys) if uid is not None}
    slots: list[int] = []
    consts: list[int] = []
    for uid in uids:
        if uid in position:  # the caller's tensor (the frontend, too, keeps a given pointer)
            slots.append(position[uid])
            consts.append(0)
        elif uid in by_value:  # the helper keeps the value and passes its address
            slots.append(-2)
            consts.append(by_value[uid])
        elif uid in constants:
            slots.append(-1)
            consts.append(int(constants[uid]))
        else:
            _log.debug("cuDNN direct call: the plan's variant pack takes uid %s, not given", uid)
            return None
    module = native.compiled(HELPER)
    if module is None:
        return None
    import torch

    try:
        functions = _functions(lib)
        plan = _plan_from_json(lib, handle, backend_json)
    except OSError as exc:
        _log.debug("cuDNN direct call: %s", exc)
        return None
    try:
        if _workspace_size(lib, plan) > max(workspace_size, 0):
            raise OSError("the plan made from JSON needs more workspace than the frontend's")
        capsule = module.make(
            functions,
            plan,
            (
                _VARIANT_PACK_DESCRIPTOR,
                _ATTR_PACK_UIDS,
                _ATTR_PACK_POINTERS,
                _ATTR_PACK_WORKSPACE,
                _TYPE_INT64,
                _TYPE_VOID_PTR,
            ),
            struct.pack(f"{len(uids)}q", *uids),
            struct.pack(f"{len(consts)}Q", *consts),
            struct.pack(f"{len(slots)}i", *slots),
            len(keys),
            torch.Tensor,
            PACK_LIMIT,
        )
    except (OSError, TypeError, ValueError) as exc:
        lib.cudnnBackendDestroyDescriptor(ctypes.c_void_p(plan))
        _log.debug("cuDNN direct call: %s", exc)
        return None
    return functools.partial(module.run, capsule)


def pack_count(call: DirectCall) -> int:
    """How many variant packs a direct call holds (tests)."""
    module = native.compiled(HELPER)
    assert module is not None and isinstance(call, functools.partial)
    return int(module.packs(call.args[0]))
