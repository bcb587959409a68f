"""The exact-match engine ranking cache (hipDNN's ``AutotuneRankingStore``, PR #11099).

``autotune_exhaustive_sweep`` stores the full ranking of one graph on one device; the Config
policy reads it before the override file and, on a hit, orders the engines exactly as measured.

On disk: ``$DNNTUNE_CACHE_DIR/autotune-rankings/<dnntune version>/<key>.jsonl`` where ``key`` is
the graph key followed by the handle's device key. The first line is a version stamp; each
further line is one record::

    {"key": "...", "sampled_engine_ids": [...], "order": [...], "engine_names": {...},
     "libraries": {"torch": "2.13.0+cpu", ...}, ...}

``sampled_engine_ids`` are the engines the sweep tried; ``order`` the engines that succeeded,
fastest first; ``libraries`` the versions of the libraries the engines ran on
(:func:`library_versions`). A ranking is measured data: under another torch, Triton or cuDNN
it says nothing, so a record applies only where those versions are the same (a record without
them, written before they were recorded, applies nowhere). The last record for the key and
these versions wins, so processes of two environments that share the cache dir each find their
own. Appends hold ``.<file>.lock``. Reads never create files and every failure is soft (the
policy falls through to the next rule).

Read rules (C = live candidate ids, S = sampled ids):

* a candidate that was never sampled (C \\ S not empty) rejects the record: the ranking says
  nothing about that engine;
* a duplicate id in ``order`` marks the record malformed: declined;
* otherwise the stored order filtered to C comes first (``hit (exact)`` when S = C, ``hit
  (partial)`` when sampled engines are gone), then the candidates that were sampled but did
  not succeed, in their incoming order, so the result is always a permutation of C;
* fewer than two engines to order, or no ranked engine among the candidates: declined.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnntune import _cache_versions, settings
from dnntune._version import __version__
from dnntune.backend.heuristics import CONFIG_POLICY, PolicyDecision
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import ENTRY_POINT_GROUP
from dnntune.errors import ConfigFileError
from dnntune.graph.signature import graph_key
from dnntune.overrides.format import knob_from_json, knob_to_json
from dnntune.overrides.store import (
    CACHE_HINT,
    append_line,
    atomic_write_text,
    locked,
    read_lines_each,
    warn_once,
)
from dnntune.rfc import AutotuneResult, CacheWriteOutcome

if TYPE_CHECKING:
    from dnntune.backend.engine import Engine
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "RankingRecord",
    "cache_key",
    "cache_path",
    "library_versions",
    "lookup",
    "rankings_dir",
    "read_record",
    "write_ranking",
]

_log = logging.getLogger(__name__)

FORMAT = "dnntune-autotune-ranking"
FORMAT_VERSION = 1
_PREFIX = "[Config] exact-match cache:"


class _Unavailable(Exception):
    """The cache file exists but cannot be used (unreadable, foreign stamp)."""


class _NoFolder(_Unavailable):
    """A file stands where the cache's folder must be (``DNNTUNE_CACHE_DIR`` names a file, or
    one of its parents is one): every ranking file under it fails alike."""


class _Foreign(_Unavailable):
    """The cache file was read and is not a ranking file of this format: a write replaces it
    (one that could not be read is never replaced: its records may be fine)."""


def _unavailable_outcome() -> CacheWriteOutcome:
    # CacheWriteOutcome has no UNAVAILABLE member (hipDNN's put() has one); the cache then
    # behaves as switched off for this write.
    return getattr(CacheWriteOutcome, "UNAVAILABLE", CacheWriteOutcome.DECLINED_DISABLED)


def _disabled() -> bool:
    return settings.exact_engine_cache_disabled() or settings.cache_disabled()


def rankings_dir() -> Path:
    """``$DNNTUNE_CACHE_DIR/autotune-rankings/<dnntune version>``."""
    return settings.cache_dir() / "autotune-rankings" / __version__


def cache_key(graph: OpGraph, handle: Handle) -> str:
    """Graph key followed by device key (hex). Raises if either cannot be computed."""
    return f"{graph_key(graph)}{handle.device_key()}"


def cache_path(key: str) -> Path:
    return rankings_dir() / f"{key}.jsonl"


#: distributions whose version changes what an engine runs and so how fast it is
_ENGINE_DISTRIBUTIONS = (
    "torch",
    "triton",
    "nvidia-cudnn-frontend",
    "nvidia-cudnn-cu11",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13",
)


@functools.cache
def library_versions() -> dict[str, str]:
    """The installed versions of the libraries the engines run on (torch, Triton, cuDNN and
    the distributions of third-party providers): a ranking measured under other versions is
    not applied. Read from package metadata, so nothing is imported."""
    out: dict[str, str] = {}
    for name in _ENGINE_DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        if dist is not None:
            out.setdefault(dist.name, dist.version)
    return dict(sorted(out.items()))


def _stamp() -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "dnntune_version": __version__}


@dataclass
class RankingRecord:
    """One line of a ranking file."""

    key: str
    sampled_engine_ids: list[int]
    order: list[int]
    engine_names: dict[int, str] = field(default_factory=dict)
    #: explicit knobs of an ordered engine's best result, when it had any
    knobs: dict[int, list[KnobSetting]] = field(default_factory=dict)
    timestamp: str = ""
    #: :func:`library_versions` of the sweep; empty in records written before they were kept
    libraries: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "sampled_engine_ids": self.sampled_engine_ids,
            "order": self.order,
        }
        if self.engine_names:
            out["engine_names"] = {str(k): v for k, v in self.engine_names.items()}
        if self.knobs:
            out["knobs"] = {str(k): [knob_to_json(s) for s in v] for k, v in self.knobs.items()}
        if self.timestamp:
            out["timestamp"] = self.timestamp
        if self.libraries:
            out["libraries"] = dict(self.libraries)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> RankingRecord:
        """Parse a record (raises ValueError/TypeError/KeyError/ConfigFileError when malformed)."""
        if not isinstance(obj, dict):
            raise ValueError("record is not an object")
        key = obj["key"]
        sampled = obj["sampled_engine_ids"]
        order = obj["order"]
        for name, ids in (("sampled_engine_ids", sampled), ("order", order)):
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ValueError(f"{name} is not a list of integers")
        if not isinstance(key, str):
            raise ValueError("key is not a string")
        raw_names = obj.get("engine_names") or {}
        raw_knobs = obj.get("knobs") or {}
        if not isinstance(raw_names, dict) or not isinstance(raw_knobs, dict):
            raise ValueError("engine_names and knobs must be objects")
        if not all(isinstance(v, list) for v in raw_knobs.values()):
            raise ValueError("each knobs entry must be a list")
        libraries = obj.get("libraries") or {}
        if not isinstance(libraries, dict) or not all(
            isinstance(v, str) for v in libraries.values()
        ):
            raise ValueError("libraries must be an object of version strings")
        names = {int(k): str(v) for k, v in raw_names.items()}
        knobs = {
            int(k): [knob_from_json(s, f"knobs[{k}]") for s in v] for k, v in raw_knobs.items()
        }
        timestamp = str(obj.get("timestamp", ""))
        return cls(key, list(sampled), list(order), names, knobs, timestamp, dict(libraries))


def _read_lines(path: Path) -> list[str] | None:
    """The file's lines after its stamp; None if it does not exist. A line that is not UTF-8
    is blank (skipped: only that line is lost). Raises _Foreign on a foreign stamp,
    _Unavailable when the file cannot be read."""
    try:
        lines = read_lines_each(path)
    except NotADirectoryError as exc:
        raise _NoFolder(f"{path}: cannot read: {exc.strerror or exc}") from None
    except OSError as exc:
        raise _Unavailable(f"{path}: cannot read: {exc.strerror or exc}") from None
    if lines is None:
        return None
    try:
        stamp = json.loads(lines[0]) if lines else None
    except (json.JSONDecodeError, RecursionError):  # (nested past the recursion limit)
        stamp = None
    if (
        not isinstance(stamp, dict)
        or stamp.get("format") != FORMAT
        or stamp.get("format_version") != FORMAT_VERSION
    ):
        raise _Foreign(f"{path}: not a version {FORMAT_VERSION} {FORMAT} file")
    return lines[1:]


def _last_record(
    lines: Sequence[str], key: str, libraries: dict[str, str] | None = None
) -> RankingRecord | None:
    """Last valid record for ``key`` measured under ``libraries`` (default: this process's
    :func:`library_versions`); torn or malformed lines are skipped."""
    wanted = library_versions() if libraries is None else libraries
    for line in reversed(lines):
        if not line.strip():
            continue
        try:
            record = RankingRecord.from_json(json.loads(line))
        except (ValueError, TypeError, KeyError, RecursionError, ConfigFileError):
            continue
        if record.key == key and record.libraries == wanted:
            return record
    return None


def _last_record_any_libraries(lines: Sequence[str], key: str) -> bool:
    """Whether some valid record for ``key`` exists, under whatever library versions."""
    for line in lines:
        try:
            if RankingRecord.from_json(json.loads(line)).key == key:
                return True
        except (ValueError, TypeError, KeyError, RecursionError, ConfigFileError):
            continue
    return False


def read_record(graph: OpGraph, handle: Handle) -> RankingRecord | None:
    """The stored ranking for this graph on this device, or None (miss, disabled, unusable)."""
    if _disabled():
        return None
    try:
        key = cache_key(graph, handle)
        lines = _read_lines(cache_path(key))
    except Exception:  # unkeyable graph/device or unusable file: reads fail soft
        return None
    return None if lines is None else _last_record(lines, key)


# ---- write -----------------------------------------------------------------------------------
def _ranked_ids(results: Sequence[AutotuneResult]) -> tuple[list[int], list[AutotuneResult]]:
    """Engine ids of the successes, best rank first; several results of one engine collapse."""
    indexed = [(i, r) for i, r in enumerate(results) if r.succeeded]
    indexed.sort(key=lambda item: (item[1].rank if item[1].rank >= 0 else 1 << 30, item[0]))
    ids: list[int] = []
    best: list[AutotuneResult] = []
    for _, r in indexed:
        if r.engine_id not in ids:
            ids.append(r.engine_id)
            best.append(r)
    return ids, best


def write_ranking(
    graph: OpGraph,
    handle: Handle,
    results: Sequence[AutotuneResult],
    sampled_engine_ids: Sequence[int],
    complete: bool,
) -> CacheWriteOutcome:
    """Store the ranking of a full exhaustive sweep; say what was done.

    Outcomes, checked in this order: DECLINED_DISABLED (``DNNTUNE_DISABLE_EXACT_ENGINE_CACHE``
    or ``DNNTUNE_DISABLE_CACHE``), DECLINED_UNKEYABLE (no graph or device key),
    NOT_ATTEMPTED_PARTIAL_SWEEP (``complete`` is False), NOT_ATTEMPTED_NO_SUCCESSFUL_ENGINE,
    UNCHANGED (the stored ranking is the same, or the new sampled set is a strict subset of the
    stored one), WRITTEN. An I/O failure is logged and reported as DECLINED_DISABLED.
    """
    if _disabled():
        return CacheWriteOutcome.DECLINED_DISABLED
    try:
        key = cache_key(graph, handle)
    except Exception as exc:
        _log.info("%s unkeyable (%s: %s)", _PREFIX, type(exc).__name__, exc)
        return CacheWriteOutcome.DECLINED_UNKEYABLE
    if not complete:
        return CacheWriteOutcome.NOT_ATTEMPTED_PARTIAL_SWEEP
    order, best = _ranked_ids(results)
    if not order:
        return CacheWriteOutcome.NOT_ATTEMPTED_NO_SUCCESSFUL_ENGINE
    sampled = list(dict.fromkeys([*(int(i) for i in sampled_engine_ids), *order]))
    record = RankingRecord(
        key,
        sampled,
        order,
        engine_names={r.engine_id: r.engine_name for r in best if r.engine_name},
        knobs={r.engine_id: list(r.knob_settings) for r in best if r.knob_settings},
        timestamp=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        libraries=library_versions(),
    )
    path = cache_path(key)
    _cache_versions.sweep_once()  # other versions' folders, unused for 30 days
    try:
        with locked(path):
            return _put(path, record)
    except (ConfigFileError, OSError) as exc:
        _warn_unwritable(path.parent, exc)
        return _unavailable_outcome()


def _warn_unwritable(folder: Path, exc: Exception) -> None:
    """One warning per folder and process (a read-only or full cache fails every sweep's write
    alike), DEBUG after that."""
    warn_once(
        _log, str(folder), "%s unavailable: %s; rankings are not kept" + CACHE_HINT, _PREFIX, exc
    )


def _put(path: Path, record: RankingRecord) -> CacheWriteOutcome:
    line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
    try:
        lines = _read_lines(path)
    except _Foreign as exc:
        _log.warning("%s %s; starting a new file", _PREFIX, exc)
        lines = None
    except _Unavailable as exc:  # unreadable (EIO, permissions): its records are kept
        raise ConfigFileError(str(exc)) from None
    if lines is None:
        atomic_write_text(path, json.dumps(_stamp()) + "\n" + line)
        return CacheWriteOutcome.WRITTEN
    stored = _last_record(lines, record.key, record.libraries)
    if stored is not None:
        same = stored.order == record.order and set(stored.sampled_engine_ids) == set(
            record.sampled_engine_ids
        )
        if same or set(record.sampled_engine_ids) < set(stored.sampled_engine_ids):
            return CacheWriteOutcome.UNCHANGED
    append_line(path, line.rstrip("\n"), sync=True)
    return CacheWriteOutcome.WRITTEN


# ---- read (the Config policy's first step) ---------------------------------------------------
def lookup(graph: OpGraph, handle: Handle, candidates: Sequence[Engine]) -> PolicyDecision | None:
    """Order ``candidates`` by the stored ranking, or None to fall through to the next rule."""
    if _disabled():
        _log.info("%s disabled", _PREFIX)
        return None
    try:
        key = cache_key(graph, handle)
    except Exception as exc:
        _log.info("%s unkeyable (%s: %s)", _PREFIX, type(exc).__name__, exc)
        return None
    path = cache_path(key)
    try:
        lines = _read_lines(path)
    except _NoFolder as exc:  # every graph's lookup meets it: one warning per folder
        _warn_unwritable(path.parent, exc)
        return None
    except _Unavailable as exc:  # every lookup of the graph meets it: one warning per file
        warn_once(_log, str(path), "%s unavailable: %s", _PREFIX, exc)
        return None
    record = None if lines is None else _last_record(lines, key)
    if record is None:
        other = lines is not None and _last_record_any_libraries(lines, key)
        _log.info("%s miss%s", _PREFIX, " (ranked under other library versions)" if other else "")
        return None
    by_id = {e.id: e for e in candidates}
    sampled = set(record.sampled_engine_ids)
    unsampled = [e.name for e in candidates if e.id not in sampled]
    if unsampled:
        _log.info("%s rejected -- unsampled candidate(s) %s", _PREFIX, ", ".join(unsampled))
        return None
    if len(set(record.order)) != len(record.order):
        _log.info("%s declined -- malformed record (duplicate engine id in order)", _PREFIX)
        return None
    ranked = [by_id[i] for i in record.order if i in by_id]
    rest = [e for e in candidates if e not in ranked]
    engines = [*ranked, *rest]
    if not ranked or len(engines) < 2:
        _log.info("%s declined -- fewer than two engines to order", _PREFIX)
        return None
    hit = "exact" if sampled == set(by_id) else "partial"
    first = engines[0]
    knob_settings = list(record.knobs.get(first.id, []))
    _log.info("%s hit (%s): %s first", _PREFIX, hit, first.name)
    return PolicyDecision(
        engines,
        CONFIG_POLICY,
        f"exact-match cache hit ({hit}): {first.name} first",
        matched={
            "source": "exact_cache",
            "hit": hit,
            "key": key,
            "path": str(path),
            "engine_id": first.id,
            "engine_name": first.name,
            "knob_settings": knob_settings,
            "knobs": {s.knob_id: s.value for s in knob_settings},
            "order": [e.id for e in engines],
        },
    )
