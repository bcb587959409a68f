"""Training records from what tuning leaves in force for the next run (``overrides/``):

* engine-override files (``dnntune tune -o``, RFC 0013 section 6.5): each entry's winner, an
  order-only record built from the entry's tensors (no data type, no epilogue); the device is
  the entry's ``autotune_metadata.device`` (else the ``--device-name`` given). Entries with -1
  wildcards are skipped, with a note;
* the exact-match ranking cache (``$DNNTUNE_CACHE_DIR/autotune-rankings``): each ranking is an
  order-only record; its key names the graph by hash only, so the graph must be among the
  graph files given, and the device must be one of this machine's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path

from dnntune.backend.engine import engine_id_hex
from dnntune.backend.handle import create_handle
from dnntune.backend.learned import TensorInfo, device_class, problem_from_tensors
from dnntune.backend.learned import problem_of as graph_problem
from dnntune.errors import DnnTuneError
from dnntune.learning.graph_index import GraphIndex
from dnntune.learning.records import order_record
from dnntune.learning.source_fields import Collected, json_error
from dnntune.overrides import exact_cache
from dnntune.overrides.format import WILDCARD, canonical_tensor_id, load_file
from dnntune.overrides.store import read_lines_each

__all__ = ["local_devices", "read_override_file", "read_ranking_cache"]


def read_override_file(path: Path, out: Collected, device_name: str | None = None) -> int:
    """The order-only records of an override file's entries; ``device_name``: the device of
    entries whose ``autotune_metadata`` names none (a hand-written entry)."""
    try:
        config = load_file(path)
    except DnnTuneError as exc:
        out.notes.append(f"{exc}; skipped")
        return 0
    n = generalized = 0
    for i, entry in enumerate(config.entries):
        meta = entry.metadata or {}
        device = meta.get("device") or device_name
        if not device:
            out.notes.append(
                f"{path}: engine_overrides[{i}]: no autotune_metadata.device (give the device "
                "with --device-name)"
            )
            continue
        if any(WILDCARD in t.dim or WILDCARD in t.stride for t in entry.tensors):
            generalized += 1  # a generalized entry is no single problem
            continue
        tensors = {
            canonical_tensor_id(t.tensor_id): TensorInfo(tuple(t.dim), tuple(t.stride) or None)
            for t in entry.tensors
            if t.tensor_id
        }
        try:
            problem = problem_from_tensors(entry.op, tensors, entry.criteria)
        except DnnTuneError as exc:
            out.notes.append(f"{path}: engine_overrides[{i}]: {exc}")
            continue
        out.records.append(
            order_record(
                problem,
                device_class(str(device)),
                [entry.engine_name],
                f"{path}#engine_overrides[{i}]",
            )
        )
        n += 1
    if generalized:
        # skipped without a word, after which train said "no training records ... pass
        # override files" of the very file given (new-user audit, session 56)
        out.notes.append(
            f"{path}: {generalized} generalized entr{'y' if generalized == 1 else 'ies'} (-1 "
            "wildcards, from `dnntune overrides generalize`) skipped: each stands for many "
            "shapes, no one problem; train on the file tune wrote before generalizing"
        )
    return n


@functools.cache
def local_devices() -> dict[str, str]:
    """This machine's device keys -> device names (what an exact-cache key can name)."""
    out = {}
    for dev in ("cpu", "cuda"):
        try:
            h = create_handle(dev)
            out[h.device_key()] = str(h.device_signature().get("name"))
        except DnnTuneError:
            continue
    return out


def read_ranking_cache(path: Path, index: GraphIndex, out: Collected) -> int:
    key = path.stem
    graph = index.by_key().get(key[:32])
    if graph is None:
        out.notes.append(f"{path}: no graph file given for this ranking (graph key {key[:32]})")
        return 0
    device = local_devices().get(key[32:])
    if device is None:
        out.notes.append(f"{path}: ranked on another machine (device key {key[32:]}); skipped")
        return 0
    try:  # each line decoded on its own: a byte that is not UTF-8 spoils only its line
        lines = read_lines_each(path) or []
        stamp = json.loads(lines[0]) if lines else None
    except (OSError, json.JSONDecodeError, RecursionError) as exc:
        out.notes.append(f"{path}: cannot read: {json_error(exc)}")
        return 0
    if not isinstance(stamp, Mapping) or stamp.get("format") != exact_cache.FORMAT:
        out.notes.append(f"{path}: not an exact-match cache file")
        return 0
    record = None
    for line in lines[1:]:  # the last valid record of this file's key (as the cache reads it)
        try:
            parsed = exact_cache.RankingRecord.from_json(json.loads(line))
        except (ValueError, TypeError, KeyError, RecursionError, DnnTuneError):
            continue
        if parsed.key == key:
            record = parsed
    if record is None or not record.order:
        return 0
    names = [record.engine_names.get(i, engine_id_hex(i)) for i in record.order]
    out.records.append(order_record(graph_problem(graph), device_class(device), names, str(path)))
    return 1
