"""CUDNN_ENGINE's find database: the fastest cuDNN plan found per problem, remembered on disk.

Modelled on MIOpen's user find-db: a search (``global.benchmarking=1``) times cuDNN's plans and
appends the winner; a later build without benchmarking finds the record and uses that plan
without timing anything. One JSON object per line under
``$DNNTUNE_CACHE_DIR/cudnn-find-db/<dnntune version>/<device key>.jsonl``; appends take a
cross-process file lock; the last line for a key wins, and a file grown past
``COMPACT_MIN_BYTES`` with half its lines superseded is rewritten without them
(:func:`~dnntune.overrides.store.compact_lines`); malformed lines are skipped; every
failure is soft (a find db that cannot be read or written is a miss, never an error).
``DNNTUNE_DISABLE_CACHE`` turns it off.

The record names the plan by cuDNN's engine tag (``eng<id>_k<knob>=<value>...``), which is
stable across processes, not only by its position in the heuristic list.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dnntune import _cache_versions, settings
from dnntune._version import __version__
from dnntune.overrides.store import (
    CACHE_HINT,
    append_line,
    compact_lines,
    json_line_key,
    read_lines_lenient,
    warn_once,
    warn_unreadable,
)

__all__ = ["FindDb", "FindDbKey", "FindDbRecord", "parse_engine_tag"]

_log = logging.getLogger(__name__)

DIRNAME = "cudnn-find-db"
LOCK_TIMEOUT_S = 10.0

_ENGINE_RE = re.compile(r"eng(\d+)")
_KNOB_RE = re.compile(r"_k(\d+)=(-?\d+)")


def parse_engine_tag(tag: str) -> tuple[int | None, dict[str, int]]:
    """cuDNN engine id and knob values from an engine tag such as ``eng28_k2=3_k3=0``."""
    match = _ENGINE_RE.match(tag)
    engine = int(match.group(1)) if match else None
    knobs = {f"k{k}": int(v) for k, v in _KNOB_RE.findall(tag)}
    return engine, knobs


@dataclass(frozen=True)
class FindDbKey:
    """What a find-db record is valid for: the problem, the machine, the libraries, the knobs."""

    graph_key: str
    device_key: str
    cudnn_backend: int
    cudnn_frontend: str
    heur_mode: str
    workspace_limit: int
    #: numerical notes deselected for the search (``cudnn.allow_tf32=0`` on float32 dots): a
    #: TF32 winner must not be looked up for a build that excludes TF32, nor the reverse
    excluded_numeric_notes: tuple[str, ...] = ()

    def digest(self) -> str:
        fields = asdict(self)
        if not self.excluded_numeric_notes:
            del fields["excluded_numeric_notes"]  # keys of records without a deselection
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class FindDbRecord:
    """The search's winner: cuDNN plan name (engine tag), index, engine id, knobs, cost."""

    plan_name: str
    plan_index: int
    workspace_bytes: int
    median_time_ms: float
    cudnn_engine_id: int | None = None
    cudnn_knobs: dict[str, int] = field(default_factory=dict)
    plans_timed: int = 0
    timestamp: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FindDbRecord:
        """The record a line holds. Raises ValueError (or KeyError, TypeError) for one this
        module did not write: a field of another JSON type, a number that is not finite or
        overflows (``"plan_index": Infinity`` raised OverflowError out of the plan's build)."""
        engine_id = data.get("cudnn_engine_id")
        knobs = data.get("cudnn_knobs") or {}
        if not isinstance(knobs, dict):
            raise TypeError(f"cudnn_knobs {knobs!r}")
        return cls(
            plan_name=_text(data["plan_name"], "plan_name"),
            plan_index=_count(data["plan_index"], "plan_index"),
            workspace_bytes=_count(data.get("workspace_bytes", 0), "workspace_bytes"),
            median_time_ms=_finite(data.get("median_time_ms", 0.0), "median_time_ms"),
            cudnn_engine_id=None if engine_id is None else _count(engine_id, "cudnn_engine_id"),
            cudnn_knobs={str(k): _integer(v, f"cudnn_knobs.{k}") for k, v in knobs.items()},
            plans_timed=_count(data.get("plans_timed", 0), "plans_timed"),
            timestamp=_text(data.get("timestamp", ""), "timestamp", empty=True),
        )


def _integer(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} {value!r}: not an integer")
    return value


def _count(value: object, name: str) -> int:
    number = _integer(value, name)
    if number < 0:
        raise ValueError(f"{name} {number}: negative")
    return number


def _finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} {value!r}: not a number")
    if not math.isfinite(value):
        raise ValueError(f"{name} {value!r}: not a finite number")
    return float(value)


def _text(value: object, name: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or not (value or empty):
        raise TypeError(f"{name} {value!r}: not a name")
    return value


class FindDb:
    """Read and append find-db records under ``root`` (one file per device key)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def default(cls) -> FindDb | None:
        """The find db under ``settings.cache_dir()``, or None when caching is disabled."""
        if settings.cache_disabled():
            return None
        return cls(settings.cache_dir() / DIRNAME / __version__)

    def path_for(self, key: FindDbKey) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key.device_key) or "device"
        return self.root / f"{safe}.jsonl"

    def lookup(self, key: FindDbKey) -> FindDbRecord | None:
        """The last record written for ``key``, or None (missing file, no match, unreadable)."""
        path = self.path_for(key)
        digest = key.digest()
        try:
            lines = read_lines_lenient(path)
        except OSError as exc:
            message = "cudnn find db %s unreadable (%s); treating as a miss"
            warn_unreadable(_log, path, self.root, exc, message, path, exc)
            return None
        for line in reversed(lines or ()):
            try:
                entry = json.loads(line)
                if entry.get("key") != digest:
                    continue
                return FindDbRecord.from_dict(entry["value"])
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue  # a torn or foreign line (or one nested too deeply): skip it
        return None

    def record(self, key: FindDbKey, value: FindDbRecord) -> bool:
        """Append ``value`` for ``key`` under the file lock; False (logged) if it failed."""
        from filelock import FileLock, Timeout

        if not value.timestamp:
            value.timestamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        path = self.path_for(key)
        line = json.dumps(
            {"key": key.digest(), "problem": asdict(key), "value": asdict(value)},
            sort_keys=True,
            separators=(",", ":"),
        )
        _cache_versions.sweep_once()  # other versions' folders, unused for 30 days
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
                append_line(path, line)
                compact_lines(path, json_line_key)
        except (OSError, Timeout) as exc:
            warn_once(
                _log,
                str(path.parent),
                "cudnn find db %s not written (%s)" + CACHE_HINT,
                path,
                exc,
            )
            return False
        return True
