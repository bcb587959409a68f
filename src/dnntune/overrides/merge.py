"""Library halves of ``dnntune overrides merge`` and ``dnntune overrides show``.

The RFC's advice for concurrent tuning is "separate output files per process, merge
afterward"; :func:`merge_files` is that merge. Entries are identified by the writer's match key
(op, criteria, tensors by id with exact dims and strides) and the graph they were tuned on
(``autotune_metadata.graph_key``; for a generalized entry the graph at any batch size,
``batch_free_graph_key``). A later entry wins on equal keys (a
later file's, or a later one of the same file) and takes the place of the earlier entry (so the
file order, which decides first-match-wins on read, stays that of first appearance). Every key
seen with two different engines or knob sets is reported as a conflict.

The output is treated as ``dnntune tune -o`` treats its file: an existing output that is not
one of the inputs is merged in first, as the lowest-priority input (``overwrite=True`` starts
afresh instead), and the output is read and written under its lock (``.<file>.lock``, the
writers' lock), so an entry a concurrent writer adds to it is never lost.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune.errors import ConfigFileError
from dnntune.graph.json_numbers import finite_float
from dnntune.graph.ops import ALL_SPECS
from dnntune.overrides.batch import generalize_batch, metadata_batch_free_key
from dnntune.overrides.format import (
    CURRENT_VERSION,
    LEGACY_VERSION,
    WILDCARD,
    OverrideEntry,
    OverrideFile,
    dumps,
    load_file,
    parse_text,
)
from dnntune.overrides.match import EntryKey, entry_key, metadata_graph_key, place
from dnntune.overrides.store import (
    atomic_write_text,
    check_writable,
    locked,
    read_text_if_exists,
    write_target,
)

__all__ = [
    "API_REPLACE_HINT",
    "EntryRow",
    "MergeConflict",
    "MergeReport",
    "describe_entry",
    "describe_file",
    "generalize_batch",
    "merge_files",
]

_log = logging.getLogger(__name__)


#: how a refusal to merge into an existing output tells a library user to replace it (the CLI
#: says ``--overwrite``)
API_REPLACE_HINT = "pass overwrite=True to replace it"


@dataclass(frozen=True)
class MergeConflict:
    """Two entries disagree on one match key; the later one (``kept_from``) won.

    Both may come from the same file (``kept_from == dropped_from``): then the kept entry is a
    later entry of that file. ``kept_index``/``dropped_index`` are the entries' positions in
    their files' ``engine_overrides`` (None when unknown).
    """

    key: str
    kept_from: str
    kept_engine: str
    dropped_from: str
    dropped_engine: str
    kept_index: int | None = None
    dropped_index: int | None = None


@dataclass
class MergeReport:
    """What :func:`merge_files` did."""

    inputs: list[str]
    output: str
    #: entries read from ``inputs`` (not counting ``existing_entries``)
    entries_read: int = 0
    entries_written: int = 0
    #: entries replaced by a later entry with the same key (conflicting or not): a later
    #: file's, or a later one of the same file (``replaced_within_file`` of them)
    replaced: int = 0
    replaced_within_file: int = 0
    conflicts: list[MergeConflict] = field(default_factory=list)
    #: entries of the output as it was, merged in first (None: the output did not exist, was
    #: one of the inputs, or was replaced with ``overwrite``)
    existing_entries: int | None = None


#: criterion -> the enum whose member's value the file holds (``pointwise_mode`` ->
#: PointwiseMode), from the op specs that write them
_CRITERION_ENUMS: dict[str, type[enum.Enum]] = {
    p.criterion: p.enum_type
    for spec in ALL_SPECS
    for p in spec.params
    if p.criterion and p.enum_type is not None
}


def _criteria_text(criteria: Mapping[str, int]) -> str:
    """``pointwise_mode=SWISH_FWD,...``: the criteria as users name them (the enum member, as
    in ``dt.PointwiseMode.SWISH_FWD``); the file keeps the integer. A value no member has, or
    a criterion dnntune does not know (a hand-edited file), is shown as written."""
    parts = []
    for key, value in sorted(criteria.items()):
        kind = _CRITERION_ENUMS.get(key)
        try:
            shown = str(value) if kind is None else kind(value).name
        except ValueError:
            shown = str(value)
        parts.append(f"{key}={shown}")
    return ",".join(parts)


def describe_entry(entry: OverrideEntry) -> str:
    """A short human form of an entry's match key: ``conv_fprop{...} x[2,8,8,8]/[...] w[..]``."""
    crit = _criteria_text(entry.criteria)
    head = f"{entry.op}{{{crit}}}" if crit else entry.op
    return f"{head} {_tensors_text(entry)}"


def _tensors_text(entry: OverrideEntry) -> str:
    parts = []
    for pos, t in enumerate(entry.tensors):
        name = (t.tensor_id or f"#{pos}").removesuffix("_tensor_uid")
        parts.append(name + _fmt_axis(t.dim) + (f"/{_fmt_axis(t.stride)}" if t.stride else ""))
    return " ".join(parts)


def _knob_signature(entry: OverrideEntry) -> tuple[tuple[str, Any], ...]:
    """The knobs an entry sets, as the readers apply them (a knob listed twice: the last
    value wins); sorted by id only, so values of different types are never compared (a knob
    given "preserve" and 1 raised TypeError: audit, session 18)."""
    last = {s.knob_id: s.value for s in entry.knobs or []}
    return tuple(sorted(last.items(), key=lambda item: item[0]))


def _require_v2(config: OverrideFile, path: Path | str) -> OverrideFile:
    if not config.named_tensor_ids:
        found = (
            f"version {config.version} file"
            if config.has_version
            else f"legacy v{LEGACY_VERSION} file (no version key)"
        )
        raise ConfigFileError(
            f"{path}: {found}: tensors are matched by position; overrides merge and "
            f"generalize read and write version {CURRENT_VERSION} files only (tensors named by "
            "id): re-tune its graphs with `dnntune tune -o FILE` to get one"
        )
    return config


def _read_input(path: Path) -> OverrideFile:
    return _require_v2(load_file(path), path)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (through links and hard links too)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one does not exist (yet), or cannot be looked at
        return os.path.realpath(a.expanduser()) == os.path.realpath(b.expanduser())


def _read_existing_output(path: Path, replace_hint: str) -> OverrideFile | None:
    """The output as it is, to merge into (None: it does not exist). Call under its lock."""
    target = write_target(path)
    text = read_text_if_exists(target)
    if text is None:
        return None
    if not text.strip():
        return OverrideFile(source=str(path))
    try:
        return _require_v2(parse_text(text, str(path)), path)
    except ConfigFileError as exc:
        raise ConfigFileError(
            f"{exc}; it is the existing output, whose entries the merge keeps: fix it, write "
            f"to another file, or {replace_hint} (dropping its entries)"
        ) from None


def merge_files(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    wildcard_batch: bool = False,
    overwrite: bool = False,
    replace_hint: str = API_REPLACE_HINT,
) -> MergeReport:
    """Merge version-2 override files into ``output`` (a later entry wins on equal keys).

    ``output`` may be one of the inputs (it is read in its place in the list). An existing
    ``output`` that is not one of the inputs is merged in first, as the lowest-priority input,
    as ``dnntune tune -o`` appends to its file; ``overwrite=True`` replaces it instead. The
    output is read (when it is an input or kept) and written under its lock, so an entry that
    a concurrent writer adds meanwhile is kept. With ``wildcard_batch`` the batch dimension (dim
    0 of the tensors that carry the batch, see :func:`generalize_batch`) of the inputs' entries
    becomes -1 before keys are compared, so entries of one graph that differ only in batch size
    collapse into one; entries of graphs that differ otherwise (another stride or epilogue
    around the same core node) stay apart (the entries already in a kept output are left as
    they are).

    Raises:
        ConfigFileError: an input (or the existing output being kept) cannot be read, is not
            valid JSON, is malformed or is v1 (the message ends with ``replace_hint`` for the
            output); the output cannot be written (:func:`~dnntune.overrides.store.
            check_writable`, checked first) or locked. Nothing is written then.
    """
    if not inputs:
        raise ConfigFileError("merge: no input files given")
    out_path = Path(output)
    check_writable(out_path)  # a directory, a link loop, no permission: before any work
    report = MergeReport([str(p) for p in inputs], str(out_path))
    is_output = [_same_file(Path(p), out_path) for p in inputs]
    # inputs other than the output are read first: a bad one stops the merge before anything
    # is locked or created
    early = {i: _read_input(Path(p)) for i, p in enumerate(inputs) if not is_output[i]}
    with locked(out_path):
        # the output is read under its lock: an entry a writer adds to it before this point is
        # in what is read, and none can be added between this read and the write below
        sources: list[tuple[str, OverrideFile]] = []
        if not overwrite and not any(is_output):
            existing = _read_existing_output(out_path, replace_hint)
            if existing is not None:
                report.existing_entries = len(existing.entries)
                sources.append((str(out_path), existing))
        for i, p in enumerate(inputs):
            sources.append((str(p), early[i] if i in early else _read_input(Path(p))))
        _check_one_device(sources, len(sources) - len(inputs), replace_hint)
        entries = _merge(sources, report, wildcard_batch, len(sources) - len(inputs))
        report.entries_written = len(entries)
        atomic_write_text(
            out_path, dumps({"version": CURRENT_VERSION, "engine_overrides": entries})
        )
    for c in report.conflicts:
        _log.info(
            "merge: %s: %s (%s) replaces %s (%s)",
            c.key,
            c.kept_engine,
            _where(c.kept_from, c.kept_index),
            c.dropped_engine,
            _where(c.dropped_from, c.dropped_index),
        )
    return report


def _where(source: str, index: int | None) -> str:
    return source if index is None else f"{source}: engine_overrides[{index}]"


def _check_one_device(
    sources: Sequence[tuple[str, OverrideFile]], kept_sources: int, replace_hint: str
) -> None:
    """The files being merged were tuned on one device, as ``dnntune tune -o`` refuses to add
    to a file of another device: a match key names no device, so a later file's entry replaced
    another device's entry for the same problem (an H200's tuned plan gone, silently), and a
    run on either device would read the other's choices. A file that already mixes devices on
    its own adds no mix and passes; entries that name no device do not count.

    Raises:
        ConfigFileError: two of ``sources`` name different devices (nothing is written).
    """
    per_source = [(source, config.devices()) for source, config in sources]
    union = {d for _, devices in per_source for d in devices}
    if len(union) < 2 or any(set(devices) == union for _, devices in per_source):
        return
    named = "; ".join(
        f"{source}{' (the existing output)' if n < kept_sources else ''}: "
        + ", ".join(
            f"{count} entr{'y' if count == 1 else 'ies'} on {device}"
            for device, count in devices.most_common()
        )
        for n, (source, devices) in enumerate(per_source)
        if devices
    )
    way_out = "merge each device's files into an output of its own"
    if kept_sources:
        way_out += f" (for the existing output: write to another file, or {replace_hint})"
    raise ConfigFileError(
        f"refusing to merge entries tuned on different devices ({named}): a match key names "
        "no device, so one device's entry would replace the other's for the same problem, and "
        f"each device would read the other's choices; {way_out}"
    )


def _tuned_on(entry: OverrideEntry) -> str | None:
    """The graph an entry was tuned on, as far as it tells two entries of one match key apart
    (None: it does not say, written by hand).

    A generalized entry (a ``-1`` dim) stands for its graph at any batch size: two of graphs
    that differ only in the batch are one problem, but two that differ otherwise (another
    stride, another epilogue: one match key, another graph) are two, as ``dnntune tune`` keeps
    them. Their batch-free graph key tells; one without it (written before it was recorded)
    is identified by its graph key, so it is never merged into another graph's entry.
    """
    graph_key = metadata_graph_key(entry.metadata)
    if graph_key is None or not any(WILDCARD in t.dim for t in entry.tensors):
        return graph_key
    return metadata_batch_free_key(entry.metadata) or graph_key


def _merge(
    sources: Sequence[tuple[str, OverrideFile]],
    report: MergeReport,
    wildcard_batch: bool,
    kept_sources: int,
) -> list[Any]:
    """The merged ``engine_overrides`` of ``sources`` (the first ``kept_sources`` of them are
    never generalized: the output's own entries); fills in ``report``'s counts."""
    # an entry is one problem: its match key and the graph it was tuned on (two layers that
    # share a core node but not their epilogue keep an entry each; generalized, the graph at
    # any batch size)
    # an entry without a graph key (hand-written) is one problem with every entry of its match
    # key, either side, as the writer replaces them (match.same_problem): the later wins, at
    # the first one's place (it was kept beside them, a dead duplicate: audit, session 18)
    merged: dict[int, tuple[OverrideEntry, int, int]] = {}  # slot -> entry, source, index
    slots: dict[EntryKey, list[tuple[int, str | None]]] = {}  # match key -> (slot, tuned on)
    new_slot = itertools.count()
    unkeyed: list[OverrideEntry] = []
    for n, (source, config) in enumerate(sources):
        existing = n < kept_sources
        for index, entry in enumerate(config.entries):
            if not existing:
                report.entries_read += 1
            if wildcard_batch and not existing:
                entry = generalize_batch(entry)
            match_key = entry_key(entry.op, entry.criteria, entry.tensors)
            if match_key is None:
                unkeyed.append(entry)  # no tensor ids: cannot be compared, kept as is
                continue
            tuned_on = _tuned_on(entry)
            same_key = slots.setdefault(match_key, [])
            same = [
                slot
                for slot, theirs in same_key
                if tuned_on is None or theirs is None or theirs == tuned_on
            ]
            for slot in same:
                report.replaced += 1
                old, old_n, old_index = merged[slot]
                if old_n == n:
                    report.replaced_within_file += 1
                if (old.engine_name, _knob_signature(old)) != (
                    entry.engine_name,
                    _knob_signature(entry),
                ):
                    report.conflicts.append(
                        MergeConflict(
                            describe_entry(entry),
                            source,
                            entry.engine_name,
                            sources[old_n][0],
                            old.engine_name,
                            index,
                            old_index,
                        )
                    )
            for slot in same[1:]:
                del merged[slot]
            slot = same[0] if same else next(new_slot)
            same_key[:] = [(s, t) for s, t in same_key if s not in same]
            same_key.append((slot, tuned_on))
            merged[slot] = (entry, n, index)  # dict keeps the first position of the slot
    entries: list[Any] = []
    for e, _, _ in merged.values():  # each before any generalized entry that would shadow it
        entries = place(entries, e.raw or e.to_json())
    entries += [e.raw or e.to_json() for e in unkeyed]
    return entries


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
                criteria=_criteria_text(e.criteria),
                tensors=_tensors_text(e),
                min_time_ms=finite_float(min_time),
                mode=str(meta.get("mode", "")),
                strategy=str(meta.get("strategy", "")),
                knobs=",".join(str(s) for s in e.knobs or []),
                timestamp=str(meta.get("timestamp", "")),
            )
        )
    return rows
