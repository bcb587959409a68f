"""A small compiled helper for the checks before a CUDA-graph replay (issue 22 allows one).

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
interpreter ABI and source, written under a temporary name and renamed, so processes that build
it at once never load a half-written file. Where it cannot be built or loaded (no compiler, no
headers, an interpreter without the tag: CPython 3.14 dropped it), or ``DNNTUNE_DISABLE_NATIVE``
is set, :func:`reader` gives None and the checks take PyTorch's reader or compare values: the
same answers, more slowly. A build that fails is logged at debug level and tried once per
process.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from dnntune import settings

__all__ = ["SOURCE", "build", "can_build", "reader"]

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

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _name() -> str:
    """The module's name: one per source and interpreter ABI (it is also the file's stem)."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    tag = "".join(c if c.isalnum() else "_" for c in sys.implementation.cache_tag or "py")
    return f"_dnntune_native_{tag}_{digest}"  # a C identifier: PyInit_<name>


def _compiler() -> list[str] | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return cc if cc and shutil.which(cc[0]) else None


def can_build() -> bool:
    """This machine has what a build needs: a C compiler and the interpreter's headers."""
    include = sysconfig.get_paths().get("include")
    return _compiler() is not None and include is not None and Path(include, "Python.h").exists()


def build(folder: Path) -> Path:
    """Compile the helper into ``folder`` (once: an existing build is reused) and return its
    path. Raises OSError (with the compiler's message) when it cannot be built."""
    name = _name()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = folder / f"{name}{suffix}"
    if target.exists():
        return target
    cc, include = _compiler(), sysconfig.get_paths().get("include")
    if cc is None or include is None or not can_build():
        raise OSError("no C compiler or no Python headers")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        source = Path(tmp, f"{name}.c")
        source.write_text(SOURCE.replace("NAME", name))
        built = Path(tmp, f"{name}{suffix}")
        command = [*cc, "-shared", "-fPIC", "-O2", f"-I{include}", str(source), "-o", str(built)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        os.replace(built, target)  # atomic: a concurrent build leaves one complete file
    return target


def _load(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(_name(), str(path))
    spec = importlib.util.spec_from_file_location(_name(), path, loader=loader)
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


def _helper() -> Callable[[list[dict[str, Any]]], bytes] | None:
    with _lock:
        if "read" in _state:
            return _state["read"]
        read = None
        if not settings.native_disabled():
            try:
                folder = settings.cache_dir() / "native"
                unsafe = None if settings.cache_disabled() else settings.claim_code_dir(folder)
                if settings.cache_disabled() or unsafe is not None:
                    if unsafe is not None:
                        _log.info("dnntune.torch: not using %s for the helper: %s", folder, unsafe)
                    with tempfile.TemporaryDirectory() as tmp:
                        module = _load(build(Path(tmp)))
                else:
                    module = _load(build(folder))
                candidate = module.versions
                read = candidate if _moves(candidate) else None
            except Exception as exc:  # no compiler, no headers, no tag: the checks go slower
                _log.debug("dnntune.torch: no compiled replay-check helper (%s)", exc)
        _state["read"] = read
        return read


def reader() -> Callable[[list[dict[str, Any]]], bytes] | None:
    """``versions(list of dicts) -> bytes``: the dicts' version tags (equal bytes, the same
    contents), built on the first call; None where the helper is not available."""
    read = _state.get("read", False)
    return _helper() if read is False else read
