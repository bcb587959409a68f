"""CPython's dict version tags and PyTorch's hook-handle counter: the short paths of the
checks before a CUDA-graph replay (:mod:`dnntune.torch._recorded`, :mod:`dnntune.torch._baked`).

A dict's version tag (PEP 509, CPython 3.11 to 3.13) moves on every change of the dict, so equal
tags of a module's dicts mean the same attributes, slots and hooks, read in one C loop by
dnntune's compiled helper (:mod:`dnntune.backend.native`) or one call per dict through PyTorch's
guards. Every forward hook registered through PyTorch's API takes the next id of
``RemovableHandle``: while that counter has not moved, no hook was added anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from dnntune.backend import native as _native

__all__ = ["TagReader", "hook_id", "tag_reader"]


def _working_dict_version() -> Callable[[dict[Any, Any]], int] | None:
    """CPython's dict version tag (PEP 509) as PyTorch's guards read it, or None where this
    interpreter or PyTorch lacks it or it does not move on every change (checked here)."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    read = getattr(guards, "dict_version", None)
    if read is None:
        return None
    try:
        d: dict[str, Any] = {}
        seen = [read(d)]
        d["a"] = 1
        seen.append(read(d))
        d["a"] = 2
        seen.append(read(d))
        del d["a"]
        seen.append(read(d))
    except Exception:
        return None
    return read if len(set(seen)) == len(seen) else None


_DICT_VERSION = _working_dict_version()

#: reads the version tags of a list of dicts (equal results: the same contents)
TagReader = Callable[[list[dict[str, Any]]], Hashable]


def _pytorch_tags(dicts: list[dict[str, Any]]) -> Hashable:
    assert _DICT_VERSION is not None
    return tuple(map(_DICT_VERSION, dicts))


def tag_reader() -> TagReader | None:
    """The fastest reader of dict version tags here: dnntune's compiled helper (one C loop,
    :mod:`dnntune.backend.native`), else PyTorch's (one call per dict), else None (the checks
    compare values)."""
    native = _native.reader()
    if native is not None:
        return native
    return _pytorch_tags if _DICT_VERSION is not None else None


def hook_id() -> int:
    """PyTorch's hook-handle counter: every forward hook registered anywhere (on a module or
    globally, through ``register_*hook``) takes the next id."""
    return RemovableHandle.next_id
