"""Built cuDNN plans kept on disk, so that a later process loads a plan instead of compiling it.

A cuDNN plan of a runtime-compiled engine (a layernorm's, an rmsnorm's, a fused pointwise
chain's) takes 0.3-1 s to build: cuDNN compiles its kernel. The frontend serializes a built plan
(``pygraph.serialize()``: the plan's JSON representation, compiled kernel included) and loads it
again in another process (``pygraph.deserialize(handle, data)``). On the H200 a norm plan built
in 0.3-1.0 s loads in about 16 ms in a fresh process, and runs the same kernel: outputs equal
bit for bit (session 28's probe, benchmarks/RESULTS.md). So :class:`CudnnProblem` keeps every
plan whose build took at least :data:`STORE_MIN_BUILD_S` here, and looks here before it builds:
``dnntune run`` with an override file, a production job's first call of a tuned shape, and a
second ``tune`` of the same graphs load their norm plans instead of compiling them.

One file per plan, ``$DNNTUNE_CACHE_DIR/cudnn-plans/<dnntune version>/<key>.plan``: a first
line naming the format, a JSON line with the key it was stored under, the blob's length and its
sha256, then the blob. The key holds everything the plan is valid for: the graph key and its
uid order (:func:`uid_signature`), the GPU (name and compute capability), the cuDNN, frontend
and CUDA versions, the heuristic mode, the deselected numerical notes, and cuDNN's engine tag.
A file whose stored key, length or digest does not match is not loaded (a miss, logged at debug
level) and is replaced by the next store. Writes go to a temporary file renamed into place, so
processes storing the same plan at once leave one complete file; the temporary file is named
after its writer (:mod:`dnntune._temp_files`), and one that a writer killed mid-write left is
removed by the next store of that plan. A load marks the file used (its modification time);
a plan file that no process has stored or loaded for :data:`UNUSED_PLAN_AGE_S` (30 days) is
removed by a later process's first store.

The blob holds compiled GPU code that this process will run, so the folder is used only under
the rule of the compiled helpers' (:func:`dnntune.settings.claim_code_dir`: a real directory of
this user's that no one else can write to); anywhere else, and with ``DNNTUNE_DISABLE_CACHE``,
nothing is stored or loaded. Every failure is soft: a plan that cannot be stored or loaded is
built as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnntune import _cache_versions, settings
from dnntune._temp_files import make_temp, remove_aged, remove_stale
from dnntune._version import __version__
from dnntune.graph.signature import graph_key
from dnntune.providers.cudnn.lowering import uid_signature

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph

__all__ = ["STORE_MIN_BUILD_S", "PlanStore", "PlanStoreKey", "StoredBuilds"]

_log = logging.getLogger(__name__)

DIRNAME = "cudnn-plans"
MAGIC = b"dnntune-cudnn-plan 1\n"
#: plans that built faster than this are not stored: a load costs about 16 ms on the H200
STORE_MIN_BUILD_S = 0.05
#: the largest blob read back (a norm plan's is 40-110 KB), and the longest header line
MAX_BYTES = 64 << 20
MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class PlanStoreKey:
    """What one stored plan is valid for."""

    graph_key: str
    uids: tuple[int | None, ...]
    device: str
    cudnn_backend: int
    cudnn_frontend: str
    cuda: str
    heur_mode: str
    excluded_numeric_notes: tuple[str, ...]
    #: cuDNN's engine tag of the plan (``eng6_k14=0_k24=0...``): stable across processes
    plan_name: str

    def fields(self) -> dict[str, object]:
        out = asdict(self)
        out["uids"] = list(self.uids)
        out["excluded_numeric_notes"] = list(self.excluded_numeric_notes)
        return out

    def digest(self) -> str:
        text = json.dumps(self.fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:40]


class PlanStore:
    """Serialized cuDNN plans in one folder (None: off, every load a miss, no store)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._swept_legacy = False

    @classmethod
    def default(cls) -> PlanStore:
        """The store of this process's cache folder, or an off one (``DNNTUNE_DISABLE_CACHE``,
        a folder others can write to)."""
        root = settings.cache_dir()
        disabled = settings.cache_disabled()
        key = (str(root), disabled)
        with _lock:
            store = _stores.get(key)
            if store is None:
                store = _stores[key] = cls(None if disabled else _claim(root))
            return store

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    def path(self, key: PlanStoreKey) -> Path:
        assert self.folder is not None
        return self.folder / f"{key.digest()}.plan"

    def has(self, key: PlanStoreKey) -> bool:
        """Whether a file is stored under ``key`` (unchecked: :meth:`load` checks it)."""
        return self.folder is not None and self.path(key).is_file()

    def load(self, key: PlanStoreKey) -> tuple[bytes, tuple[str, ...]] | None:
        """The stored blob of ``key`` and its plan's behavior notes, or None (none stored, or a
        file that does not check)."""
        if self.folder is None:
            return None
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                if f.readline() != MAGIC:
                    raise ValueError("not a dnntune cuDNN plan file")
                header = json.loads(f.readline(MAX_HEADER))
                if not isinstance(header, dict) or header.get("key") != key.fields():
                    raise ValueError("stored under another key")
                size = header.get("bytes")
                if type(size) is not int or not 0 < size <= MAX_BYTES:
                    raise ValueError(f"a blob of {size!r} bytes")
                blob = f.read(size + 1)
                notes = header.get("behavior_notes", [])
                if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
                    raise ValueError(f"behavior notes {notes!r}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            # RecursionError: a header nested too deeply for Python's parser
            _log.debug("cuDNN plan store: %s not loaded: %s", path, exc)
            return None
        if len(blob) != size or hashlib.sha256(blob).hexdigest() != header.get("sha256"):
            _log.debug("cuDNN plan store: %s not loaded: truncated or changed", path)
            return None
        with contextlib.suppress(OSError):  # its last use, which keeps it from the sweep
            os.utime(path)
        return blob, tuple(notes)

    def store(self, key: PlanStoreKey, blob: bytes, notes: Sequence[str] = ()) -> bool:
        """Write ``blob`` for ``key`` (atomically), with its plan's behavior notes (names);
        False where it could not be written."""
        if self.folder is None or not blob or len(blob) > MAX_BYTES:
            return False
        digest = hashlib.sha256(blob).hexdigest()
        header = {
            "key": key.fields(),
            "bytes": len(blob),
            "sha256": digest,
            "behavior_notes": list(notes),
        }
        path = self.path(key)
        tmp = None
        try:
            self._sweep()
            remove_stale(path)
            fd, tmp = make_temp(path)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC)
                f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
                f.write(blob)
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            _log.debug("cuDNN plan store: %s not written: %s", path, exc)
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return True

    def _sweep(self) -> None:
        """Once per store, before its first write: remove the ``.plan-<random>`` temporary
        files that earlier versions' writers killed mid-write left (their names say no writer,
        so only those a day old), and the plans no process has stored or loaded for
        :data:`UNUSED_PLAN_AGE_S` (a plan is stored per graph, shapes included, and per cuDNN
        version: without this the folder only grew), and other dnntune versions' folders
        unused as long (:mod:`dnntune._cache_versions`)."""
        if self._swept_legacy or self.folder is None:
            return
        self._swept_legacy = True
        remove_aged(self.folder, _LEGACY_TEMP)
        remove_aged(self.folder, _PLAN_FILE, age_s=UNUSED_PLAN_AGE_S)
        _cache_versions.sweep_once()  # other versions' folders, unused for 30 days


#: a stored plan's file: the key's digest
_PLAN_FILE = re.compile(r"[0-9a-f]{40}\.plan")
#: a plan file no process has stored or loaded for this long is removed
UNUSED_PLAN_AGE_S = 30 * 24 * 3600.0
#: the temporary files of stores before they were named after their writer (``mkstemp``'s)
_LEGACY_TEMP = re.compile(r"\.plan-[a-z0-9_]{8}")

_lock = threading.Lock()
_stores: dict[tuple[str, bool], PlanStore] = {}


def _claim(root: Path) -> Path | None:
    """The version's folder under ``root``, made private; None where code must not be loaded
    from it (logged once per process at info level)."""
    folder = root / DIRNAME / __version__
    for part in (root / DIRNAME, folder):
        unsafe = settings.claim_code_dir(part)
        if unsafe is not None:
            _log.info("dnntune: not keeping built cuDNN plans in %s: %s", part, unsafe)
            return None
    return folder


class StoredBuilds:
    """One :class:`CudnnProblem`'s side of the store: its key per plan, a load into a new
    frontend graph, and a store after a build."""

    def __init__(self, store: PlanStore, base: dict[str, Any], handle: int) -> None:
        self._store = store
        self._base = base
        self._handle = handle

    @classmethod
    def of(
        cls,
        graph: OpGraph,
        device_index: int,
        heur_mode: str,
        excluded_notes: tuple[str, ...],
        handle: int,
    ) -> StoredBuilds | None:
        """None where the store is off or the device cannot be named."""
        store = PlanStore.default()
        if not store.enabled:
            return None
        try:
            import torch

            from dnntune.providers.cudnn._runtime import versions

            major, minor = torch.cuda.get_device_capability(device_index)
            vers = versions()
            base: dict[str, Any] = {
                "graph_key": graph_key(graph),
                "uids": uid_signature(graph),
                "device": f"{torch.cuda.get_device_name(device_index)} sm_{major}{minor}",
                "cudnn_backend": int(vers["cudnn_backend"]),
                "cudnn_frontend": str(vers["cudnn_frontend"]),
                "cuda": str(torch.version.cuda),
                "heur_mode": heur_mode,
                "excluded_numeric_notes": tuple(excluded_notes),
            }
        except Exception as exc:  # no device to name: nothing stored for this problem
            _log.debug("cuDNN plan store: off for this graph: %s", exc)
            return None
        return cls(store, base, handle)

    def key(self, plan_name: str) -> PlanStoreKey:
        return PlanStoreKey(plan_name=plan_name, **self._base)

    def has(self, plan_name: str) -> bool:
        return self._store.has(self.key(plan_name))

    def load(self, cudnn: Any, plan_name: str) -> tuple[Any, tuple[str, ...], int, bytes] | None:
        """A new frontend graph holding the stored plan (its only plan, index 0), the plan's
        behavior notes, its workspace bytes and the serialization it was loaded from, or None
        (then the plan is built)."""
        stored = self._store.load(self.key(plan_name))
        if stored is None:
            return None
        blob, notes = stored
        try:
            # only deserialize, get_workspace_size and _execute_plan_at_index are asked of a
            # loaded graph: the frontend's per-index queries (a plan's name, its notes) read
            # lists a loaded graph leaves empty, and crashed the process on the H200
            loaded = cudnn.pygraph()
            loaded.deserialize(self._handle, list(blob))
            workspace = int(loaded.get_workspace_size())
        except Exception as exc:
            _log.debug("cuDNN plan store: plan %s not loaded: %s", plan_name, exc)
            return None
        return loaded, notes, workspace, bytes(blob)

    def keep(self, built: Any, plan_name: str, build_s: float, notes: Sequence[str] = ()) -> None:
        """Store the plan ``built`` (a frontend graph) has just built, if its build was slow
        enough to be worth a file (never raises)."""
        if build_s < STORE_MIN_BUILD_S:
            return
        try:
            blob = bytes(built.serialize())
        except Exception as exc:  # an engine whose plans cannot be serialized
            _log.debug("cuDNN plan store: plan %s not serialized: %s", plan_name, exc)
            return
        self._store.store(self.key(plan_name), blob, notes)
