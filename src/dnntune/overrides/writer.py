"""Writing the autotune winner to an engine-override config file (RFC 0013 section 6.5).

One entry per match key (op, criteria, tensors by named id ignoring order, exact dims and
strides): an existing entry with the same key is replaced unconditionally, others are kept
(append mode) or dropped (``delete_all_existing_file_content``). Appending needs an existing
version-2 file that the reader accepts as a whole: a legacy or foreign file, a malformed entry
or a non-finite number is refused with InvalidValueError naming the JSON path, and the file is
left untouched (readers ignore such a file as a whole, so an entry added to it would never take
effect). :func:`check_appendable` makes the same check before any tuning is spent. Invalid JSON
is moved aside to ``<path>.corrupt-<epoch seconds>`` (or overwritten if that fails). Every
update holds the lock ``.<name>.lock`` and replaces the file atomically; a symbolic link is
written through to its target (:func:`dnntune.overrides.store.write_target`).

``autotune_metadata`` carries the RFC fields with their presence rules (``converged`` only for
run_until_stable, ``knobs`` only when the winner set knobs explicitly, ``ran_exhaustive``
always) plus dnntune's own informational fields ``median_time_ms``, ``verified``,
``cache_mode``, ``ranking_metric``, ``device`` and ``dnntune_version``, which readers ignore.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dnntune._json_keys import DuplicateKeyError, loads
from dnntune._version import __version__
from dnntune.backend.engine import engine_id_hex
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node
from dnntune.graph.ops import spec_for
from dnntune.graph.signature import graph_key
from dnntune.overrides.batch import BATCH_FREE_KEY_FIELD, batch_free_graph_key
from dnntune.overrides.format import (
    CURRENT_VERSION,
    TensorPattern,
    dumps,
    knob_to_json,
    parse_document,
)
from dnntune.overrides.match import (
    EntryKey,
    node_tensors,
    place,
    raw_entry_key,
    same_problem,
    tensor_id_of,
)
from dnntune.overrides.store import atomic_write_text, locked, move_aside, write_target
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneResult,
    AutotuneStorageConfig,
    AutotuneStrategy,
)

__all__ = [
    "API_REPLACE_HINT",
    "TIMESTAMP_FORMAT",
    "build_entry",
    "check_appendable",
    "build_metadata",
    "tensor_patterns",
    "winner_of",
    "write_autotune_winner",
    "write_entry",
]

_log = logging.getLogger(__name__)

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

#: how a refusal to append tells a library user to replace the file (the CLI says ``--overwrite``)
API_REPLACE_HINT = "set AutotuneStorageConfig.delete_all_existing_file_content=True to replace it"


def winner_of(results: Sequence[AutotuneResult]) -> AutotuneResult | None:
    """The rank-0 result: the lowest non-negative rank among successes, else the first success."""
    succeeded = [r for r in results if r.succeeded]
    if not succeeded:
        return None
    ranked = [r for r in succeeded if r.rank >= 0]
    return min(ranked, key=lambda r: r.rank) if ranked else succeeded[0]


def tensor_patterns(node: Node) -> list[TensorPattern]:
    """The node's input tensors as ``tensors[]`` items (field-name ids; scalars left out)."""
    return [
        TensorPattern(tensor_id_of(node, field_name), tuple(t.dims), tuple(t.strides))
        for field_name, t in node_tensors(node)
    ]


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _device_name(graph: OpGraph) -> str | None:
    """The name of the device the graph was built for, if it carries a handle (the facade)."""
    try:
        handle = getattr(graph, "handle", None)
    except Exception:  # the facade raises when not built; nothing to record then
        return None
    if handle is None or not hasattr(handle, "device_signature"):
        return None
    try:
        name = handle.device_signature().get("name")
    except Exception:
        return None
    return str(name) if name else None


def build_metadata(
    result: AutotuneResult,
    config: AutotuneConfig | None = None,
    device: str | None = None,
    now: _dt.datetime | None = None,
) -> dict[str, Any]:
    """``autotune_metadata`` for one result, field order as in the RFC's example."""
    when = (now or _dt.datetime.now(_dt.UTC)).astimezone(_dt.UTC)
    meta: dict[str, Any] = {
        "rank": result.rank if result.rank >= 0 else 0,
        "min_time_ms": _finite(result.min_time_ms),
        "avg_time_ms": _finite(result.avg_time_ms),
        "stddev_ms": _finite(result.stddev_ms),
        "workspace_size": int(result.workspace_size),
        "mode": result.mode_used.value,
        "supports_exhaustive": bool(result.supports_exhaustive),
        "ran_exhaustive": bool(result.ran_exhaustive),
        "exhaustive_not_run_reason": result.exhaustive_not_run_reason,
        "strategy": result.strategy_used.value,
        "iterations_run": int(result.iterations_run),
    }
    if result.strategy_used is AutotuneStrategy.RUN_UNTIL_STABLE:
        meta["converged"] = bool(result.converged)
    meta["timestamp"] = when.strftime(TIMESTAMP_FORMAT)
    if result.knob_settings:
        meta["knobs"] = [knob_to_json(s) for s in result.knob_settings]
    # dnntune's informational extras (readers ignore unknown metadata fields)
    if result.median_time_ms:
        meta["median_time_ms"] = _finite(result.median_time_ms)
    if result.verified is not None:
        meta["verified"] = bool(result.verified)
    meta["cache_mode"] = result.cache_mode
    if config is not None:
        meta["ranking_metric"] = config.ranking_metric
    if device:
        meta["device"] = device
    meta["dnntune_version"] = __version__
    return meta


def build_entry(
    graph: OpGraph,
    result: AutotuneResult,
    config: AutotuneConfig | None = None,
    now: _dt.datetime | None = None,
    *,
    device: str | None = None,
) -> dict[str, Any]:
    """The ``engine_overrides[]`` object for ``result`` on ``graph``'s core operation.
    ``device``: the name of the device that tuned it (default: the one ``graph`` was built
    for; a graph tuned elsewhere, by another rank, names its device here)."""
    node = graph.core_node()
    spec_criteria = spec_for(node.kind).criteria(node)
    engine_name = result.engine_name or engine_id_hex(result.engine_id)
    entry: dict[str, Any] = {"op": node.kind.value, "engine_name": engine_name}
    if spec_criteria:
        entry["criteria"] = dict(sorted(spec_criteria.items()))
    entry["tensors"] = [t.to_json() for t in tensor_patterns(node)]
    meta = build_metadata(result, config, device or _device_name(graph), now)
    # the graph the knobs were verified on: they apply to it alone (policy.entry_knobs)
    meta["graph_key"] = graph_key(graph)
    # the graph at any batch size: generalizing the batch keeps other graphs' entries apart
    any_batch = batch_free_graph_key(graph)
    if any_batch is not None:
        meta[BATCH_FREE_KEY_FIELD] = any_batch
    entry["autotune_metadata"] = meta
    return entry


def write_autotune_winner(
    graph: OpGraph,
    results: Sequence[AutotuneResult],
    storage_config: AutotuneStorageConfig,
    config: AutotuneConfig | None = None,
    *,
    device: str | None = None,
) -> None:
    """Write the rank-0 winner of ``results`` for ``graph``'s core operation (``device``:
    see :func:`build_entry`).

    Nothing happens when ``storage_config.file_path`` is empty. With no successful result a
    warning is logged and nothing is written.

    Raises:
        InvalidValueError: append mode on a file that is not an autotune v2 file (RFC's
            INVALID_VALUE); the file is left untouched.
        ConfigFileError: the file cannot be locked, read or written.
    """
    if not storage_config.file_path:
        return
    winner = winner_of(results)
    if winner is None:
        _log.warning("autotune: no successful results to write")
        return
    entry = build_entry(graph, winner, config, device=device)
    key = raw_entry_key(entry)
    if key is None or not entry["tensors"]:
        _log.warning(
            "autotune: core operation %s of graph %r has no named tensors; config file write "
            "skipped",
            entry["op"],
            graph.name,
        )
        return
    path = Path(storage_config.file_path).expanduser()
    write_entry(path, entry, storage_config.delete_all_existing_file_content, key)
    _log.info("autotune: wrote %s -> %s to %s", entry["op"], entry["engine_name"], path)


def _fresh_document() -> dict[str, Any]:
    return {"version": CURRENT_VERSION, "engine_overrides": []}


def _decode(data: bytes, path: Path, replace_hint: str) -> Any:
    """The JSON document in ``data``; raises ValueError when it is not JSON (UTF-8, a leading
    byte-order mark skipped as the reader skips it: such a file is no corrupt file), and
    InvalidValueError (which callers let through before they catch ValueError) for an object
    that names a key twice: JSON, so not moved aside, but readers refuse it, and a rewrite
    would keep only one of its values."""
    try:
        return loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    except DuplicateKeyError as exc:
        raise InvalidValueError(
            f"refusing to update {path}: {exc}. Readers ignore the whole file while it has this "
            f"problem, so a new entry would never take effect: fix it, write to a new file, or "
            f"{replace_hint}"
        ) from None


def _check_appendable_document(path: Path, doc: Any, replace_hint: str) -> dict[str, Any]:
    """``doc`` if entries can be added to it; InvalidValueError naming what is wrong if not.

    The rule is the reader's (:func:`dnntune.overrides.format.parse_document`), so the writer
    never extends a file that readers ignore, plus the writer's own: version 2 exactly.
    """
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or "engine_overrides" not in doc:
        # a graph, a model, bench results, a tune report or run results (JSON lists), another
        # JSON value: the reader's refusal says what it looks like (a tune report given as -o
        # read only "a JSON list")
        try:
            parse_document(doc, with_knobs=False)
        except ConfigFileError as exc:
            raise InvalidValueError(
                f"refusing to update {path}: {exc}. Write to a new file, or {replace_hint}"
            ) from None
    if isinstance(version, int) and not isinstance(version, bool) and version > CURRENT_VERSION:
        # not legacy: a newer dnntune wrote it, and this one would drop what it does not know
        raise InvalidValueError(
            f"refusing to update {path}: it is a version {version} file, written by a newer "
            f"dnntune (this one writes version {CURRENT_VERSION}); upgrade dnntune to add to "
            f"it, write to a new file, or {replace_hint} (losing its entries)"
        )
    if isinstance(version, bool) or version != CURRENT_VERSION:
        found = "no version key (legacy v1)" if version is None else f"version {version!r}"
        raise InvalidValueError(
            f"refusing to update legacy/non-current autotune config file {path}: {found}; "
            f"appending needs a version {CURRENT_VERSION} file. Write to a new file, or "
            f"{replace_hint}"
        )
    try:
        parse_document(doc, with_knobs=False)
    except ConfigFileError as exc:
        raise InvalidValueError(
            f"refusing to update {path}: {exc}. Readers ignore the whole file while it has "
            "this problem, so a new entry would never take effect: fix it, write to a new "
            f"file, or {replace_hint}"
        ) from None
    return doc


def check_appendable(
    path: str | Path, replace_hint: str = API_REPLACE_HINT, refuse_not_json: bool = False
) -> None:
    """Raise now if adding an entry to ``path`` would be refused: the writer's check, up front.

    A missing or empty file passes, and so does one that is not JSON at all (the writer moves
    it aside) unless ``refuse_not_json``: the CLI refuses it, as it refuses a malformed entry,
    so a hand-edited file with a typo is not set aside after the tuning.
    ``replace_hint`` completes the refusal's advice (the CLI names its ``--overwrite``).

    Raises:
        InvalidValueError: the file is not a version-2 file, or an entry or number in it is
            malformed (the message names its JSON path), or (``refuse_not_json``) it is not
            JSON.
        ConfigFileError: the file cannot be read.
    """
    p = write_target(Path(path).expanduser())
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not data.strip():
        return
    try:
        doc = _decode(data, p, replace_hint)
    except InvalidValueError:
        raise
    except ValueError as exc:
        if refuse_not_json:
            raise InvalidValueError(
                f"refusing to update {p}: it is not valid JSON ({exc}); fix it, write to a new "
                f"file, or {replace_hint}"
            ) from None
        return
    _check_appendable_document(p, doc, replace_hint)


def _load_for_update(path: Path, delete_all: bool) -> dict[str, Any]:
    """The document to update: fresh, or the existing v2 one; corrupt files are moved aside."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _fresh_document()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if delete_all or not data.strip():
        return _fresh_document()
    try:
        doc = _decode(data, path, API_REPLACE_HINT)
    except InvalidValueError:
        raise
    except ValueError as exc:
        moved = move_aside(path)
        if moved is not None:
            _log.error(
                "autotune: %s is not valid JSON (%s); moved it aside to %s and writing a fresh "
                "file",
                path,
                exc,
                moved,
            )
        else:
            _log.warning(
                "autotune: %s is not valid JSON (%s) and could not be moved aside; overwriting "
                "it with the new result",
                path,
                exc,
            )
        return _fresh_document()
    return _check_appendable_document(path, doc, API_REPLACE_HINT)


def write_entry(
    path: str | Path,
    entry: dict[str, Any],
    delete_all_existing_file_content: bool = False,
    key: EntryKey | None = None,
) -> None:
    """Insert ``entry`` into the file at ``path`` (replacing one with the same match key).

    The lower-level half of :func:`write_autotune_winner`, for tools that build entries
    themselves. Holds the file's lock for the whole read-modify-write; a symbolic link is
    written through to its target.

    Raises:
        InvalidValueError: the entry cannot be keyed, or (append mode) the existing file is not
            one entries can be added to (see :func:`check_appendable`); the file is untouched.
        ConfigFileError: the file cannot be locked, read or written.
    """
    p = write_target(Path(path))
    key = key if key is not None else raw_entry_key(entry)
    if key is None:
        raise InvalidValueError("entry cannot be keyed: every tensor needs a tensor_id")
    with locked(p):
        doc = _load_for_update(p, delete_all_existing_file_content)
        kept = [e for e in doc.get("engine_overrides", []) if not same_problem(e, entry, key)]
        replaced = len(doc.get("engine_overrides", [])) - len(kept)
        doc["version"] = CURRENT_VERSION
        # before any generalized entry that would otherwise shadow it (first match wins)
        doc["engine_overrides"] = place(kept, entry)
        atomic_write_text(p, dumps(doc))
    if replaced:
        _log.debug("%s: replaced %d entry with the same match key", p, replaced)
