"""Small compiled helpers for host-bound hot paths (issue 22 allows them): the checks before a
CUDA-graph replay (:mod:`dnntune.torch`) and the addresses of a bound cuDNN call
(``Graph.execute``'s :mod:`dnntune.backend.pack_binding`, dnntune.torch's kernels).

The checks of :mod:`dnntune.torch._recorded` read one version tag per module dict (CPython's
``ma_version_tag``, PEP 509: it moves on every change of the dict). Through PyTorch's
``torch._C._dynamo.guards.dict_version`` that is one Python-level call per dict, about 0.1 µs
on the H200's host, so a ViT's 276 modules cost tens of microseconds before every replay, on
the critical path whenever the GPU waits for the host. Here one C loop reads the tags of a list
of dicts into bytes (:func:`reader`), a few nanoseconds a dict.

The helper is C against the running interpreter's own headers, built on first use with the C
compiler that built Python (``sysconfig``'s ``CC``, else ``cc``) into dnntune's cache folder
(``DNNTUNE_CACHE_DIR``, when it is a folder of this user's that no one else can write to; a
temporary folder otherwise and with ``DNNTUNE_DISABLE_CACHE``), one file per
interpreter ABI and source, built in a folder beside it named after its writer and renamed from
there, so processes that build it at once never load a half-written file (a build killed
meanwhile leaves that folder, and the next build removes it: :func:`_build_folder`). Where it
cannot be built or loaded (no compiler, no headers, an interpreter without the tag: CPython 3.14
dropped it), or ``DNNTUNE_DISABLE_NATIVE`` is set, :func:`reader` gives None and the checks
take PyTorch's reader or compare values: the same answers, more slowly. A build that fails is
logged at debug level and tried once per process.

A second helper, in C++ (:func:`pointer_reader`), reads the data pointers of a tuple of tensors
in one loop through the function PyTorch exports for compiled code
(``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``, the address of a C++
function that Inductor's generated C++ calls for every tensor argument): about 0.1 µs a tensor
through ``Tensor.data_ptr`` in Python, a few nanoseconds here. The function throws a C++
exception for a tensor without storage; the helper catches it and raises RuntimeError, and its
build is checked in a separate process (a wrong answer or a crash there leaves no file, and the
checks read the pointers in Python). A first build takes seconds; :func:`prefetch` starts it in
a background thread (``dnntune.torch.optimize`` on a CUDA model does), and
:func:`ready_pointer_reader` gives a hot path the reader only when it is at hand.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from dnntune import settings
from dnntune._temp_files import make_temp_dir, private_dir, remove_aged, remove_stale

__all__ = [
    "POINTERS_SOURCE",
    "SOURCE",
    "Helper",
    "build",
    "built_pointer_reader",
    "can_build",
    "compiled",
    "pointer_reader",
    "pointer_reader_pending",
    "prefetch",
    "reader",
    "ready_pointer_reader",
    "tensor_data_ptr_address",
]

_log = logging.getLogger(__name__)

#: the helper's C source: ``versions(list of dicts) -> bytes`` (each dict's tag, 8 bytes)
SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030E0000
#error "this CPython keeps no dict version tag"
#endif

static PyObject *versions(PyObject *self, PyObject *dicts) {
    if (!PyList_CheckExact(dicts)) {
        PyErr_SetString(PyExc_TypeError, "versions() takes a list of dicts");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(dicts);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) {
        return NULL;
    }
    uint64_t *tags = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(dicts, i);
        if (!PyDict_Check(d)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "versions() takes a list of dicts");
            return NULL;
        }
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
        tags[i] = ((PyDictObject *)d)->ma_version_tag;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    }
    return out;
}

static PyMethodDef methods[] = {
    {"versions", versions, METH_O, "The version tags of a list of dicts, as bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};

PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""

#: the C++ helper: ``pointers(address, tuple of tensors) -> bytes`` (each data pointer, 8
#: bytes), through the function at ``address`` (``void *f(PyObject *)``)
POINTERS_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstdint>
#include <exception>
#include <string>

typedef void *(*data_ptr_fn)(PyObject *);

static PyObject *pointers(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pointers() takes an address and a tuple of tensors");
        return NULL;
    }
    unsigned long long address = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    data_ptr_fn data_ptr = reinterpret_cast<data_ptr_fn>(static_cast<uintptr_t>(address));
    PyObject *tensors = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(tensors);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) {
        return NULL;
    }
    uint64_t *ptrs = reinterpret_cast<uint64_t *>(PyBytes_AS_STRING(out));
    try {
        for (Py_ssize_t i = 0; i < n; i++) {
            ptrs[i] = static_cast<uint64_t>(
                reinterpret_cast<uintptr_t>(data_ptr(PyTuple_GET_ITEM(tensors, i))));
        }
    } catch (const std::exception &e) {
        Py_DECREF(out);
        std::string what(e.what());  // its first line: PyTorch appends a C++ stack trace
        PyErr_SetString(PyExc_RuntimeError, what.substr(0, what.find('\n')).c_str());
        return NULL;
    } catch (...) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "data pointer not readable");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"pointers", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(pointers)),
     METH_FASTCALL, "The data pointers of a tuple of tensors, as bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};

PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""

#: checks a built pointer helper in a fresh process: right pointers, and an exception from
#: PyTorch (a tensor without storage) raised as RuntimeError, not a crash
_POINTERS_CHECK = r"""
import struct
import torch
address = torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr
ts = (torch.zeros(4), torch.ones(8)[3:], torch.nn.Parameter(torch.zeros(2)))
assert module.pointers(address, ts) == struct.pack(f"{len(ts)}Q", *(t.data_ptr() for t in ts))
try:
    module.pointers(address, (torch.zeros(2).to_sparse(),))
except RuntimeError:
    print("ok")
"""

#: what every build check starts with: the built module loaded from argv (its name, its
#: path) as ``module``
_LOAD_BUILT = r"""
import importlib.machinery, importlib.util, sys
name, path = sys.argv[1], sys.argv[2]
loader = importlib.machinery.ExtensionFileLoader(name, path)
spec = importlib.util.spec_from_file_location(name, path, loader=loader)
module = importlib.util.module_from_spec(spec)
loader.exec_module(module)
"""

_lock = threading.Lock()
_state: dict[str, Any] = {}
#: one lock per helper (and "prefetch": set once the background build has started)
_key_locks: dict[str, threading.Lock] = {}


@dataclass(frozen=True)
class Helper:
    """A compiled helper: its file stem prefix, its source (``NAME`` stands for the module
    name), the code that checks a build in a fresh process (the build is loaded before it
    runs, as ``module``; it must print ``ok``; None: no check) and whether it is C++ (else C).
    Other modules define their own (dnntune's cuDNN caller); this module's two are below."""

    kind: str
    source: str
    check: str | None
    cxx: bool = True


def _helper(cxx: bool, helper: Helper | None) -> Helper:
    """The helper a call names: ``helper``, else this module's C++ pointer reader (``cxx``)
    or C tag reader, from the sources as they are now."""
    if helper is not None:
        return helper
    if cxx:
        return Helper("pointers", POINTERS_SOURCE, _POINTERS_CHECK)
    return Helper("native", SOURCE, None, cxx=False)


def _name(cxx: bool = False, helper: Helper | None = None) -> str:
    """A helper's module name: one per source and interpreter ABI (also the file's stem)."""
    h = _helper(cxx, helper)
    digest = hashlib.sha256(h.source.encode()).hexdigest()[:12]
    tag = "".join(c if c.isalnum() else "_" for c in sys.implementation.cache_tag or "py")
    return f"_dnntune_{h.kind}_{tag}_{digest}"  # a C identifier: PyInit_<name>


def _compiler(cxx: bool = False) -> list[str] | None:
    """The compiler that built Python (``CC``, or ``CXX`` for the C++ helper), else ``cc``
    or ``c++``."""
    variable, fallback = ("CXX", "c++") if cxx else ("CC", "cc")
    cc = (sysconfig.get_config_var(variable) or fallback).split()
    return cc if cc and shutil.which(cc[0]) else None


def can_build(cxx: bool = False) -> bool:
    """This machine has what a build needs: a C (or C++) compiler and the interpreter's
    headers."""
    include = sysconfig.get_paths().get("include")
    return _compiler(cxx) is not None and include is not None and Path(include, "Python.h").exists()


def build(folder: Path, cxx: bool = False, helper: Helper | None = None) -> Path:
    """Compile the helper (``cxx``: the C++ pointer helper; ``helper``: another C++ one) into
    ``folder`` (once: an existing build is reused) and return its path. Raises OSError (with
    the compiler's message, or what the check in a fresh process said) when it cannot be
    built."""
    h = _helper(cxx, helper)
    cxx, name = h.cxx, _name(cxx, helper)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = folder / f"{name}{suffix}"
    if target.exists():
        return target
    cc, include = _compiler(cxx), sysconfig.get_paths().get("include")
    if cc is None or include is None or not can_build(cxx):
        raise OSError(f"no C{'++' if cxx else ''} compiler or no Python headers")
    folder.mkdir(parents=True, exist_ok=True)
    with _build_folder(target) as tmp:
        source = Path(tmp, f"{name}.{'cpp' if cxx else 'c'}")
        source.write_text(h.source.replace("NAME", name))
        built = Path(tmp, f"{name}{suffix}")
        command = [*cc, "-shared", "-fPIC", "-O2", f"-I{include}", str(source), "-o", str(built)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        if h.check is not None:
            _check_in_a_fresh_process(name, built, h.check)
        _fsync(built)  # on the disk before its name is: a crash leaves no empty helper
        os.replace(built, target)  # atomic: a concurrent build leaves one complete file
    return target


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        os.fsync(f.fileno())


#: the build folders of earlier versions (``tempfile.TemporaryDirectory``'s), named by no writer
_LEGACY_BUILD = re.compile(r"tmp[a-z0-9_]{8}")


@contextlib.contextmanager
def _build_folder(target: Path) -> Iterator[str]:
    """A folder beside ``target`` to build it in, removed afterwards. A build killed meanwhile
    (kill -9; the compile and its check take seconds) leaves it: it is named after its writer
    (:func:`dnntune._temp_files.make_temp_dir`) and the next build of ``target`` removes it
    once its writer is gone (earlier versions' ``tmp<random>`` folders once a day old)."""
    remove_aged(target.parent, _LEGACY_BUILD, folders=True)
    remove_stale(target)
    tmp = make_temp_dir(target)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_in_a_fresh_process(name: str, built: Path, check: str) -> None:
    command = [sys.executable, "-c", _LOAD_BUILT + check, name, str(built)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or done.stdout.strip() != "ok":
        said = (done.stderr.strip() or done.stdout.strip())[-500:]
        raise OSError(f"the compiled helper failed its check (exit {done.returncode}): {said}")


def _load(path: Path, cxx: bool = False, helper: Helper | None = None) -> ModuleType:
    name = _name(cxx, helper)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _moves(read: Callable[[list[dict[str, Any]]], bytes]) -> bool:
    """The tags move on every change of a dict here (an insert, a new value, a delete)."""
    d: dict[str, Any] = {}
    seen = [read([d])]
    d["a"] = 1
    seen.append(read([d]))
    d["a"] = 2
    seen.append(read([d]))
    del d["a"]
    seen.append(read([d]))
    return len(set(seen)) == len(seen)


def _built(cxx: bool, helper: Helper | None = None) -> ModuleType:
    """The helper, built (or found) in the cache folder, or in a temporary one where the
    cache folder is off or not safe to load code from."""
    folder = settings.cache_dir() / "native"
    unsafe = None if settings.cache_disabled() else settings.claim_code_dir(folder)
    if settings.cache_disabled() or unsafe is not None:
        if unsafe is not None:
            _log.info("dnntune: not using %s for the compiled helpers: %s", folder, unsafe)
        # named after this process: one killed mid-build is removed by the next such build
        with private_dir("native") as tmp:
            return _load(build(tmp, cxx, helper), cxx, helper)
    path = build(folder, cxx, helper)
    try:
        return _load(path, cxx, helper)
    except ImportError as exc:
        # a file found there that does not load: cut short (a crash after the rename, before
        # the data reached the disk) or damaged. Without this every later process went
        # without the helper, logged at debug level only. Built again, once.
        _log.info("dnntune: %s does not load (%s); building it again", path, exc)
        path.unlink(missing_ok=True)
        return _load(build(folder, cxx, helper), cxx, helper)


def _once(key: str, make: Callable[[], Any], what: str) -> Any:
    """``make()``'s helper, made once per process under the key's own lock (None where it
    cannot be made: ``DNNTUNE_DISABLE_NATIVE``, no compiler, a failed check; logged at debug
    level). One lock per helper: a caller of the C reader never waits for the C++ helper's
    check that :func:`prefetch` may be running."""
    read = _state.get(key, False)
    if read is not False:
        return read
    with _lock:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        if key in _state:
            return _state[key]
        read = None
        if not settings.native_disabled():
            try:
                read = make()
            except Exception as exc:  # the checks then run in Python, more slowly
                _log.debug("dnntune: no compiled %s (%s)", what, exc)
        _state[key] = read
        return read


def compiled(helper: Helper) -> ModuleType | None:
    """``helper``'s module, built on the first call (seconds: the compile and its check in a
    fresh process) or loaded from the cache folder; None where it cannot be had (no compiler,
    a failed check, ``DNNTUNE_DISABLE_NATIVE``)."""
    module: ModuleType | None = _once(helper.kind, lambda: _built(True, helper), helper.kind)
    return module


def prefetch() -> None:
    """Start building (or loading) both helpers in a background thread, once per process.

    A first build costs seconds: the C++ helper's compile and its check in a fresh process
    (about 6 s on the H200's host, most of it that process importing PyTorch), paid by the
    first CUDA-graph recording of a process with an empty cache folder, in the middle of
    ``optimize``. Both run as child processes, so a build started when ``optimize`` begins
    overlaps with its tracing and tuning instead; a caller that needs a helper before the
    build ends waits for it under that helper's lock, as it would have built it."""
    if settings.native_disabled():
        return
    with _lock:
        if _key_locks.get("prefetch") is not None:
            return
        _key_locks["prefetch"] = threading.Lock()
    if "read" in _state and "pointers" in _state:
        return

    def both() -> None:
        reader()
        pointer_reader()

    # a daemon: an interpreter that exits meanwhile does not wait for a build it never needed
    threading.Thread(target=both, name="dnntune-native-build", daemon=True).start()


def _make_reader() -> Callable[[list[dict[str, Any]]], bytes] | None:
    candidate = _built(cxx=False).versions
    return candidate if _moves(candidate) else None  # an interpreter whose tags stand still


def reader() -> Callable[[list[dict[str, Any]]], bytes] | None:
    """``versions(list of dicts) -> bytes``: the dicts' version tags (equal bytes, the same
    contents), built on the first call; None where the helper is not available."""
    read: Callable[[list[dict[str, Any]]], bytes] | None = _once(
        "read", _make_reader, "replay-check helper"
    )
    return read


#: reads the data pointers of a tuple of tensors (8 bytes each)
PointerReader = Callable[[tuple[Any, ...]], bytes]


def tensor_data_ptr_address() -> int | None:
    """The address of the C++ function PyTorch exports for compiled code to read a tensor's
    data pointer (``void *f(PyObject *)``), or None for a PyTorch that exports none."""
    import torch

    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)  # noqa: SLF001
    address = getattr(guards, "_torchinductor_pyobject_tensor_data_ptr", None)
    return address if isinstance(address, int) and address > 0 else None


def _make_pointer_reader() -> PointerReader | None:
    address = tensor_data_ptr_address()
    if address is None:
        return None  # a PyTorch that exports no such function
    return functools.partial(_built(cxx=True).pointers, address)


def built_pointer_reader() -> PointerReader | None:
    """:func:`pointer_reader` if this process has it already, else None (no build, no file
    look-up: a dict read, for checks that can wait for it)."""
    read = _state.get("pointers")
    return cast("PointerReader | None", read)


def pointer_reader_pending() -> bool:
    """The pointer reader may still come in this process: not disabled, and neither made nor
    found impossible yet."""
    return not settings.native_disabled() and "pointers" not in _state


def ready_pointer_reader() -> PointerReader | None:
    """:func:`pointer_reader` if it is at hand without a build: made in this process, or its
    file already in the cache folder (loaded, milliseconds); else None, having started the
    background build (:func:`prefetch`) for later callers. For hot paths that must not wait
    seconds for a first build (``Graph.execute``'s bound call)."""
    read = _state.get("pointers", False)
    if read is not False:
        return cast("PointerReader | None", read)
    if settings.native_disabled():
        return None
    folder = settings.cache_dir() / "native"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if (
        not settings.cache_disabled()
        and (folder / f"{_name(cxx=True)}{suffix}").exists()
        and settings.claim_code_dir(folder) is None
    ):
        return pointer_reader()
    prefetch()
    return None


def pointer_reader() -> PointerReader | None:
    """``read(tuple of tensors) -> bytes``: their data pointers (equal bytes, the same
    storage), built on the first call; None where the C++ helper is not available. Give it
    plain tensors and parameters only (a subclass may keep no storage: RuntimeError)."""
    read: PointerReader | None = _once("pointers", _make_pointer_reader, "pointer helper")
    return read
