"""The cuDNN frontend module, its versions, and cuDNN handles per device and stream.

Nothing here imports ``cudnn`` at module import time: :func:`load_cudnn` does, on first use,
so that ``import dnntune`` works on machines without ``nvidia-cudnn-frontend``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.types import DataType

__all__ = [
    "INSTALL_HINT",
    "cudnn_handle",
    "cudnn_data_type",
    "current_stream_ptr",
    "load_cudnn",
    "raw_stream_getter",
    "versions",
]

INSTALL_HINT = "install dnntune[cudnn] (nvidia-cudnn-frontend)"

_lock = threading.RLock()
_module: ModuleType | None = None
_import_error: str | None = None
#: (device index, raw stream pointer) -> cudnnHandle_t as an int
_handles: dict[tuple[int, int], int] = {}


def load_cudnn() -> ModuleType:
    """Import the cuDNN frontend once; raise NotSupportedError with the install hint if absent.

    The frontend imports even when no libcudnn is found (it dlopens lazily), so the backend
    version is queried here too: a frontend without a loadable cuDNN is just as unusable.
    """
    global _module, _import_error
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _import_error is not None:
            raise NotSupportedError(_import_error)
        try:
            import cudnn

            cudnn.backend_version()
        except ImportError as exc:
            _import_error = f"{INSTALL_HINT}: import cudnn failed ({exc})"
            raise NotSupportedError(_import_error) from None
        except Exception as exc:  # libcudnn missing or unloadable
            _import_error = f"cuDNN library not usable: {type(exc).__name__}: {exc}; {INSTALL_HINT}"
            raise NotSupportedError(_import_error) from None
        _module = cudnn
        return cudnn


def reset_for_tests() -> None:
    """Forget the import result (tests monkeypatch the import)."""
    global _module, _import_error
    with _lock:
        _module = None
        _import_error = None


def versions() -> dict[str, Any]:
    """cuDNN backend version (e.g. 91900) and frontend version (e.g. "1.16.0")."""
    cudnn = load_cudnn()
    return {
        "cudnn_backend": int(cudnn.backend_version()),
        "cudnn_frontend": str(getattr(cudnn, "__version__", "unknown")),
    }


#: handles made ahead, per device, for streams first seen while they record a CUDA graph
_SPARES = 2
_spares: dict[int, list[int]] = {}


def cudnn_handle(device_index: int, stream_ptr: int) -> int:
    """One cuDNN handle per device and stream, created on first use and kept for the process.

    Creating a handle allocates device memory, which invalidates a CUDA graph being recorded
    (PyTorch's ``torch.cuda.graph`` records on a stream of its own, so a model warmed up on
    another stream meets a new stream there): a stream first seen while it records gets a
    handle made ahead (:data:`_SPARES` per device, made beside any handle created outside a
    recording), only pointed at the stream."""
    key = (device_index, stream_ptr)
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _lock:
        handle = _handles.get(key)
        if handle is None:
            import torch

            cudnn = load_cudnn()
            with torch.cuda.device(device_index):
                spares = _spares.setdefault(device_index, [])
                if torch.cuda.is_current_stream_capturing():
                    handle = spares.pop() if spares else int(cudnn.create_handle())
                else:
                    handle = int(cudnn.create_handle())
                    while len(spares) < _SPARES:
                        spares.append(int(cudnn.create_handle()))
                cudnn.set_stream(handle=handle, stream=stream_ptr)
            _handles[key] = handle
    return handle


def current_stream_ptr(device_index: int) -> int:
    """The raw pointer of torch's current stream on ``device_index`` (0 = legacy default)."""
    return int(raw_stream_getter()(device_index))


def raw_stream_getter() -> Callable[[int], int]:
    """The cheapest ``device index -> raw pointer of torch's current stream`` function (looked
    up once by callers that run every call)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: int(torch.cuda.current_stream(index).cuda_stream)


def cudnn_data_type(cudnn: Any, data_type: DataType | None) -> Any:
    """The ``cudnn.data_type`` member of module ``cudnn`` for a DataType (NOT_SET for None)."""
    if data_type is None:
        return cudnn.data_type.NOT_SET
    name = {
        DataType.FLOAT: "FLOAT",
        DataType.HALF: "HALF",
        DataType.BFLOAT16: "BFLOAT16",
        DataType.DOUBLE: "DOUBLE",
        DataType.INT8: "INT8",
        DataType.UINT8: "UINT8",
        DataType.INT32: "INT32",
        DataType.INT64: "INT64",
        DataType.BOOLEAN: "BOOLEAN",
        DataType.FP8_E4M3: "FP8_E4M3",
        DataType.FP8_E5M2: "FP8_E5M2",
    }[data_type]
    return getattr(cudnn.data_type, name)
