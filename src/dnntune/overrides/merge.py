"""Library halves of ``dnntune overrides merge`` and ``dnntune overrides show``.

The RFC's advice for concurrent tuning is "separate output files per process, merge
afterward"; :func:`merge_files` is that merge. Entries are identified by the writer's match key
(op, criteria, tensors by id with exact dims and strides). A later file wins on equal keys and
takes the place of the earlier entry (so the file order, which decides first-match-wins on
read, stays that of first appearance). Every key seen with two different engines or knob sets
is reported as a conflict.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune.errors import ConfigFileError
from dnntune.overrides.format import (
    CURRENT_VERSION,
    WILDCARD,
    OverrideEntry,
    OverrideFile,
    dumps,
    load_file,
)
from dnntune.overrides.match import EntryKey, entry_key
from dnntune.overrides.store import atomic_write_text, locked

__all__ = [
    "EntryRow",
    "MergeConflict",
    "MergeReport",
    "describe_entry",
    "describe_file",
    "generalize_batch",
    "merge_files",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeConflict:
    """Two files disagree on one match key; the later one (``kept_from``) won."""

    key: str
    kept_from: str
    kept_engine: str
    dropped_from: str
    dropped_engine: str


@dataclass
class MergeReport:
    """What :func:`merge_files` did."""

    inputs: list[str]
    output: str
    entries_read: int = 0
    entries_written: int = 0
    #: entries replaced by a later file's entry with the same key (conflicting or not)
    replaced: int = 0
    conflicts: list[MergeConflict] = field(default_factory=list)


def describe_entry(entry: OverrideEntry) -> str:
    """A short human form of an entry's match key: ``conv_fprop{...} x[2,8,8,8]/[...] w[..]``."""
    crit = ",".join(f"{k}={v}" for k, v in sorted(entry.criteria.items()))
    head = f"{entry.op}{{{crit}}}" if crit else entry.op
    return f"{head} {_tensors_text(entry)}"


def _tensors_text(entry: OverrideEntry) -> str:
    parts = []
    for pos, t in enumerate(entry.tensors):
        name = (t.tensor_id or f"#{pos}").removesuffix("_tensor_uid")
        parts.append(name + _fmt_axis(t.dim) + (f"/{_fmt_axis(t.stride)}" if t.stride else ""))
    return " ".join(parts)


def _knob_signature(entry: OverrideEntry) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((s.knob_id, s.value) for s in entry.knobs or []))


def generalize_batch(entry: OverrideEntry) -> OverrideEntry:
    """A copy of ``entry`` whose tensors match any batch size (dim 0 set to -1)."""
    tensors = [
        type(t)(t.tensor_id, (WILDCARD, *t.dim[1:]) if t.dim else t.dim, t.stride)
        for t in entry.tensors
    ]
    raw = dict(entry.raw)
    raw["tensors"] = [t.to_json() for t in tensors]
    return OverrideEntry(
        entry.op, entry.engine_name, dict(entry.criteria), tensors, entry.metadata, entry.knobs, raw
    )


def _read_input(path: Path) -> OverrideFile:
    config = load_file(path)
    if not config.named_tensor_ids:
        raise ConfigFileError(
            f"{path}: legacy v1 file (no version key, positional tensors); merge reads and "
            f"writes version {CURRENT_VERSION} files only"
        )
    return config


def merge_files(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    wildcard_batch: bool = False,
) -> MergeReport:
    """Merge version-2 override files into ``output`` (later input wins on equal keys).

    ``output`` may be one of the inputs. With ``wildcard_batch`` every tensor's dim 0 becomes
    -1 before keys are compared, so entries that differ only in batch size collapse into one.

    Raises:
        ConfigFileError: an input cannot be read, is not valid JSON, is malformed or is v1;
            nothing is written then.
    """
    if not inputs:
        raise ConfigFileError("merge: no input files given")
    out_path = Path(output)
    report = MergeReport([str(p) for p in inputs], str(out_path))
    merged: dict[EntryKey, tuple[OverrideEntry, str]] = {}
    unkeyed: list[OverrideEntry] = []
    configs = [(str(p), _read_input(Path(p))) for p in inputs]
    for source, config in configs:
        for entry in config.entries:
            report.entries_read += 1
            if wildcard_batch:
                entry = generalize_batch(entry)
            key = entry_key(entry.op, entry.criteria, entry.tensors)
            if key is None:
                unkeyed.append(entry)  # no tensor ids: cannot be compared, kept as is
                continue
            previous = merged.get(key)
            if previous is not None:
                report.replaced += 1
                old, old_source = previous
                if (old.engine_name, _knob_signature(old)) != (
                    entry.engine_name,
                    _knob_signature(entry),
                ):
                    report.conflicts.append(
                        MergeConflict(
                            describe_entry(entry),
                            source,
                            entry.engine_name,
                            old_source,
                            old.engine_name,
                        )
                    )
            merged[key] = (entry, source)  # dict keeps the first position of the key
    entries = [e.raw or e.to_json() for e, _ in merged.values()] + [
        e.raw or e.to_json() for e in unkeyed
    ]
    report.entries_written = len(entries)
    with locked(out_path):
        atomic_write_text(
            out_path, dumps({"version": CURRENT_VERSION, "engine_overrides": entries})
        )
    for c in report.conflicts:
        _log.info(
            "merge: %s: %s (%s) replaces %s (%s)",
            c.key,
            c.kept_engine,
            c.kept_from,
            c.dropped_engine,
            c.dropped_from,
        )
    return report


# ---- show ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EntryRow:
    """One entry of an override file, flattened for a table."""

    index: int
    op: str
    engine_name: str
    criteria: str
    tensors: str
    min_time_ms: float | None
    mode: str
    strategy: str
    knobs: str
    timestamp: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _fmt_axis(values: Sequence[int]) -> str:
    return "[" + ",".join("*" if v == WILDCARD else str(v) for v in values) + "]"


def describe_file(path: str | Path) -> list[EntryRow]:
    """One row per entry of the override file at ``path`` (v1 or v2), in file order.

    Raises:
        ConfigFileError: the file cannot be read or parsed.
    """
    config = load_file(path)
    rows: list[EntryRow] = []
    for i, e in enumerate(config.entries):
        meta = e.metadata or {}
        min_time = meta.get("min_time_ms")
        rows.append(
            EntryRow(
                index=i,
                op=e.op,
                engine_name=e.engine_name,
                criteria=",".join(f"{k}={v}" for k, v in sorted(e.criteria.items())),
                tensors=_tensors_text(e),
                min_time_ms=float(min_time) if isinstance(min_time, int | float) else None,
                mode=str(meta.get("mode", "")),
                strategy=str(meta.get("strategy", "")),
                knobs=",".join(str(s) for s in e.knobs or []),
                timestamp=str(meta.get("timestamp", "")),
            )
        )
    return rows
