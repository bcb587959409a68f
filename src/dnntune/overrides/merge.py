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
from dnntune.graph.node import OpKind
from dnntune.graph.ops import spec_for
from dnntune.overrides.format import (
    CURRENT_VERSION,
    WILDCARD,
    OverrideEntry,
    OverrideFile,
    TensorPattern,
    canonical_tensor_id,
    dumps,
    load_file,
)
from dnntune.overrides.match import EntryKey, entry_key, place
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


#: per op, the input that defines the batch (its dim 0 is the batch, N) and the other inputs
#: that always carry it. Conv weights (K), norm scales, biases and statistics do not.
_BATCH_INPUTS: dict[OpKind, tuple[str, ...]] = {
    OpKind.CONV_FPROP: ("x_tensor_uid",),
    OpKind.CONV_DGRAD: ("dy_tensor_uid",),
    OpKind.CONV_WGRAD: ("dy_tensor_uid", "x_tensor_uid"),
    # A's rows are the batch (a linear layer's [batch, in]); B is the weight unless batched
    OpKind.MATMUL: ("a_tensor_uid",),
    OpKind.POINTWISE: ("in_0_tensor_uid",),
    OpKind.REDUCTION: ("x_tensor_uid",),
    OpKind.LAYERNORM: ("x_tensor_uid",),
    OpKind.RMSNORM: ("x_tensor_uid",),
    OpKind.BATCHNORM: ("x_tensor_uid",),
    OpKind.BATCHNORM_INFERENCE: ("x_tensor_uid",),
    OpKind.BATCHNORM_BACKWARD: ("dy_tensor_uid", "x_tensor_uid"),
    OpKind.SDPA: ("q_tensor_uid", "k_tensor_uid", "v_tensor_uid"),
    OpKind.RESAMPLE: ("x_tensor_uid",),
}
#: inputs that carry the batch only when their layout says so (else they broadcast over it)
_MAYBE_BATCHED: dict[OpKind, tuple[str, ...]] = {
    OpKind.MATMUL: ("b_tensor_uid",),
    OpKind.POINTWISE: ("in_1_tensor_uid", "in_2_tensor_uid"),
    OpKind.SDPA: ("attn_mask_tensor_uid",),
}


def _field_of(kind: OpKind, tensor_id: str | None) -> str:
    """The dnntune field an entry's tensor stands for (hipDNN's JSON spellings too)."""
    if tensor_id is None:  # v1 positional entries are refused before this
        return ""
    wanted = canonical_tensor_id(tensor_id)
    json_fields: dict[str, str] = getattr(spec_for(kind), "json_fields", None) or {}
    return {v: k for k, v in json_fields.items()}.get(wanted, wanted)


def _carries_batch(pattern: TensorPattern, batch: TensorPattern) -> bool:
    """Whether an operand that may broadcast (a batched B, a pointwise operand) carries the batch.

    It does when it has the batch tensor's rank and batch size. A batch of 1 is ambiguous
    (a [1, C, 1, 1] bias of a batch-1 graph looks batched), so then the operand must have the
    batch tensor's whole shape.
    """
    if not pattern.dim or len(pattern.dim) != len(batch.dim) or pattern.dim[0] != batch.dim[0]:
        return False
    return batch.dim[0] > 1 or pattern.dim[1:] == batch.dim[1:]


def generalize_batch(entry: OverrideEntry) -> OverrideEntry:
    """A copy of ``entry`` that matches any batch size: dim 0 is -1 where it is the batch.

    Only the tensors that carry the batch are generalized: a convolution's input X (not its
    weight W, whose dim 0 is the output channels K), a matmul's A (and B only when it is
    batched too), a norm's X (not its scale, bias or statistics), attention's Q, K and V. An
    entry for an op dnntune does not know is left as it is, since its batch cannot be told.
    """
    try:
        kind = OpKind(entry.op)
    except ValueError:
        _log.info("generalize: op %r is not known; its entry is left as it is", entry.op)
        return entry
    fields = [_field_of(kind, t.tensor_id) for t in entry.tensors]
    always = _BATCH_INPUTS.get(kind, ())
    maybe = _MAYBE_BATCHED.get(kind, ())
    batch = next(
        (t for t, f in zip(entry.tensors, fields, strict=True) if always and f == always[0]),
        None,
    )
    # a 2-D matmul has no batch axis in B: A's rows (its dim 0) are not B's dim 0 (K)
    batched_b_possible = kind is not OpKind.MATMUL or (batch is not None and len(batch.dim) >= 3)
    tensors = []
    for t, f in zip(entry.tensors, fields, strict=True):
        batched = f in always
        if not batched and f in maybe and batch is not None and batched_b_possible:
            batched = _carries_batch(t, batch)
        dim = (WILDCARD, *t.dim[1:]) if batched and t.dim else t.dim
        tensors.append(type(t)(t.tensor_id, dim, t.stride))
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

    ``output`` may be one of the inputs. With ``wildcard_batch`` the batch dimension (dim 0 of
    the tensors that carry the batch, see :func:`generalize_batch`) becomes -1 before keys are
    compared, so entries that differ only in batch size collapse into one.

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
    entries: list[Any] = []
    for e, _ in merged.values():  # each before any generalized entry that would shadow it
        entries = place(entries, e.raw or e.to_json())
    entries += [e.raw or e.to_json() for e in unkeyed]
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
