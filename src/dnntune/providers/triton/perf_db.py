"""The Triton perf db: the best solver config found for a problem, in JSON lines.

One file per kernel under ``$DNNTUNE_CACHE_DIR/triton-perf-db/``. Each line is a record::

    {"key": "<sha>", "problem_key": "<sha>", "kernel": "matmul", "problem": {...},
     "device": {...}, "versions": {"triton": "3.6.0", "dnntune": "0.1.0"},
     "pins": {...}, "config": {...}, "time_ms": 0.123, "candidates": 24, "written_at": ...}

``key`` hashes everything a record depends on (kernel, problem, device, versions, pinned
knobs); ``problem_key`` hashes kernel + problem + device, what DB_CLEAN deletes. Appends and
deletions hold a cross-process file lock; when a key appears more than once, the last line
wins, and a file grown past ``COMPACT_MIN_BYTES`` with half its lines superseded is rewritten
without them (:func:`~dnntune.overrides.store.compact_lines`). Like MIOpen's user perf db,
unreadable lines are skipped (logged), never fatal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune import settings
from dnntune.errors import DnnTuneError
from dnntune.overrides.store import (
    CACHE_HINT,
    append_line,
    atomic_write_text,
    compact_lines,
    json_line_key,
    read_lines_lenient,
    warn_once,
    warn_unreadable,
)

__all__ = ["PerfDb", "PerfKey", "PerfRecord", "default_db"]

_log = logging.getLogger(__name__)

DB_DIRNAME = "triton-perf-db"
FORMAT_VERSION = 1


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class PerfKey:
    """What a record is for: one kernel on one problem on one device, with library versions."""

    kernel: str
    problem: Mapping[str, Any]
    device: Mapping[str, Any]
    versions: Mapping[str, str]
    #: solver knobs the caller pinned (a search under pins is a different search)
    pins: Mapping[str, int] = field(default_factory=dict)

    @property
    def problem_key(self) -> str:
        """Kernel + problem + device: the records DB_CLEAN removes (any version, any pins)."""
        return _digest({"kernel": self.kernel, "problem": self.problem, "device": self.device})

    @property
    def key(self) -> str:
        return _digest(
            {
                "v": FORMAT_VERSION,
                "kernel": self.kernel,
                "problem": self.problem,
                "device": self.device,
                "versions": self.versions,
                "pins": self.pins,
            }
        )


@dataclass(frozen=True)
class PerfRecord:
    """A stored search result: the winning config and its median time."""

    config: dict[str, int]
    time_ms: float
    candidates: int = 0
    written_at: float = 0.0


class PerfDb:
    """JSON-lines records under ``root``, one file per kernel."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, kernel: str) -> Path:
        return self.root / f"{kernel}.jsonl"

    # ---- reading ------------------------------------------------------------------------
    def _lines(self, kernel: str) -> Iterator[dict[str, Any]]:
        path = self.path_for(kernel)
        try:
            lines = read_lines_lenient(path)
        except OSError as exc:
            warn_unreadable(
                _log, path, self.root, exc, "triton perf db %s cannot be read: %s", path, exc
            )
            return
        for number, line in enumerate(lines or (), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # (nested too deeply: not JSON here)
                warn_once(
                    _log,
                    f"{path}:json",
                    "triton perf db %s:%d is not JSON (a writer stopped mid-line?); skipped",
                    path,
                    number,
                )
                continue
            if isinstance(entry, dict):
                yield entry

    def lookup(self, key: PerfKey) -> PerfRecord | None:
        """The last record written for ``key``, or None."""
        wanted = key.key
        found: dict[str, Any] | None = None
        for entry in self._lines(key.kernel):
            if entry.get("key") == wanted:
                found = entry
        if found is None:
            return None
        config = found.get("config")
        if not isinstance(config, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in config.values()
        ):
            _log.warning("triton perf db record %s has a bad config %r; ignored", wanted, config)
            return None
        try:
            return PerfRecord(
                config=dict(config),
                time_ms=_finite(found.get("time_ms", 0.0), "time_ms"),
                candidates=_count(found.get("candidates", 0), "candidates"),
                written_at=_finite(found.get("written_at", 0.0), "written_at"),
            )
        except (TypeError, ValueError) as exc:  # a hand edit or a foreign writer
            _log.warning("triton perf db record %s is malformed (%s); ignored", wanted, exc)
            return None

    def records(self, kernel: str) -> list[dict[str, Any]]:
        """Every parseable line of ``kernel``'s file, in file order (for tools and tests)."""
        return list(self._lines(kernel))

    # ---- writing ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, kernel: str) -> Iterator[Path]:
        import filelock

        path = self.path_for(kernel)
        path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(path) + ".lock", timeout=60):
            yield path

    def store(self, key: PerfKey, record: PerfRecord) -> None:
        """Append a record for ``key`` (it overrides every earlier line with the same key).
        Never fatal: a cache that cannot be written (read-only, locked) is logged."""
        entry = {
            "key": key.key,
            "problem_key": key.problem_key,
            "kernel": key.kernel,
            "problem": dict(key.problem),
            "device": dict(key.device),
            "versions": dict(key.versions),
            "pins": dict(key.pins),
            "config": dict(record.config),
            "time_ms": record.time_ms,
            "candidates": record.candidates,
            "written_at": record.written_at or time.time(),
        }
        line = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)
        try:
            with self._locked(key.kernel) as path:
                append_line(path, line)
                compact_lines(path, json_line_key)
        except (OSError, TimeoutError) as exc:  # a read-only cache: the search result is lost
            warn_once(
                _log,
                str(self.root),
                "triton perf db for %s not written (%s)" + CACHE_HINT,
                key.kernel,
                exc,
            )
            return
        _log.info(
            "triton perf db: stored %s config %s (%.4f ms)",
            key.kernel,
            record.config,
            record.time_ms,
        )

    def delete(self, key: PerfKey) -> int:
        """Remove every record of ``key``'s problem (any version or pins); returns how many.

        The file is rewritten without those lines and replaced atomically under the lock,
        keeping its permission bits (a shared cache stays shared). Never fatal, as ``store``:
        a cache that cannot be rewritten is logged and 0 returned.
        """
        try:
            removed = self._delete(key)
        except (OSError, TimeoutError, DnnTuneError) as exc:
            warn_once(
                _log,
                str(self.root),
                "triton perf db for %s not cleaned (%s)" + CACHE_HINT,
                key.kernel,
                exc,
            )
            return 0
        if removed:
            _log.info("triton perf db: deleted %d %s record(s)", removed, key.kernel)
        return removed

    def _delete(self, key: PerfKey) -> int:
        wanted = key.problem_key
        with self._locked(key.kernel) as path:
            lines = read_lines_lenient(path)  # a line that is not UTF-8 is kept, not fatal
            if lines is None:
                return 0
            kept: list[str] = []
            removed = 0
            for line in lines:
                try:
                    entry = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    kept.append(line)
                    continue
                if isinstance(entry, dict) and entry.get("problem_key") == wanted:
                    removed += 1
                else:
                    kept.append(line)
            if removed:
                atomic_write_text(path, "".join(line + "\n" for line in kept))
        return removed


def _finite(value: object, name: str) -> float:
    """A finite JSON number (the writer stores no other; ``Infinity`` is Python's, not JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} {value!r}: not a finite number")
    return float(value)


def _count(value: object, name: str) -> int:
    """A JSON integer >= 0 (``int(Infinity)`` raised OverflowError out of the kernel's build)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {value!r}: not a count")
    return value


def default_db() -> PerfDb | None:
    """The perf db under ``settings.cache_dir()``; None when ``DNNTUNE_DISABLE_CACHE`` is set."""
    if settings.cache_disabled():
        return None
    return PerfDb(settings.cache_dir() / DB_DIRNAME)
