"""Training records from the files tuning already leaves behind (JSON only, never pickle).

Each file is recognised by its content, not its name:

* ``dnntune bench`` results (``schema_version`` 1, docs/bench.md): per graph, each engine's
  out-of-the-box row (``kernel.median_ms``, rows that succeeded and did not fail validation),
  and with ``--oracle`` the tuned plan's knobs and median as that engine's best config. The
  graph is read from ``graph_path`` (absolute, relative to the results file, the working
  directory, or found by file name under ``--graphs``). Device: ``environment.device.name``.
* ``dnntune tune --report`` reports: the winner and runner-up of each graph (their medians and
  knobs), and the heuristic plan the winner was confirmed against, as tuning decided: the plan
  it chose first, the confirmation's paired times where there are some
  (:func:`~dnntune.learning.tune_reports.as_decided`).
  Graph from ``source``; the report names no GPU model, so ``device_name`` must be given.
* engine-override files (``dnntune tune -o``, RFC 0013 section 6.5): each entry's winner, an
  order-only record built from the entry's tensors (no data type, no epilogue); the device is
  the entry's ``autotune_metadata.device``. Entries with -1 wildcards are skipped.
* the exact-match ranking cache (``$DNNTUNE_CACHE_DIR/autotune-rankings``): each ranking is an
  order-only record; its key names the graph by hash only, so the graph must be among the
  graph files given, and the device must be one of this machine's.
* records files (``dnntune-heuristics-records``, :mod:`dnntune.learning.records`).

One module per kind of file: :mod:`~dnntune.learning.bench_results`,
:mod:`~dnntune.learning.tune_reports`, :mod:`~dnntune.learning.override_history` (override
files and the exact-match cache); this module finds the files and hands each to its reader.
Graphs are found through :mod:`~dnntune.learning.graph_index`: graph files met while walking
directories join the index. Anything else is skipped with a note saying why (a file nested too
deeply to parse is invalid JSON like any other); nothing here raises for a bad input file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dnntune import settings
from dnntune._json_keys import DuplicateKeyError, loads
from dnntune.backend.learned.model import FORMAT as MODEL_FORMAT
from dnntune.errors import DnnTuneError
from dnntune.learning.bench_results import read_bench
from dnntune.learning.graph_index import GraphIndex, is_graph_doc
from dnntune.learning.override_history import read_override_file, read_ranking_cache
from dnntune.learning.records import RECORDS_FORMAT, read_records_file
from dnntune.learning.source_fields import Collected, json_error
from dnntune.learning.tune_reports import read_tune_report

__all__ = ["Collected", "GraphIndex", "collect", "default_paths"]


def default_paths() -> list[Path]:
    """The tuning history a user has without naming it: the exact-match cache and the
    override file of ``DNNTUNE_HEUR_CONFIG_PATH``."""
    out = [settings.cache_dir() / "autotune-rankings"]
    config = settings.heur_config_path()
    if config is not None:
        out.append(config)
    return [p for p in out if p.exists()]


def _walk(paths: Iterable[Path]) -> Iterator[Path]:
    """The files under ``paths``, each once: a file given twice, or also in a folder given,
    under another name or through a link, is read once (by its resolved path)."""
    seen: set[Path] = set()
    for p in paths:
        if p.is_dir():
            found = sorted([*p.rglob("*.json"), *p.rglob("*.jsonl")])
            files = [f for f in found if not f.name.startswith(".")]
        else:
            files = [p]
        for f in files:
            try:
                real = f.resolve()
            except (OSError, RuntimeError):  # a loop of links: read (and reported) as given
                real = f
            if real not in seen:
                seen.add(real)
                yield f


def collect(
    paths: Sequence[Path], graph_dirs: Sequence[Path] = (), device_name: str | None = None
) -> Collected:
    """Records from ``paths`` (files or directories; see the module docstring).

    ``graph_dirs``: where graph files named by results live; ``device_name``: the GPU model of
    sources that do not name one (tune reports).
    """
    out = Collected()
    files = list(_walk(paths))
    index = GraphIndex(graph_dirs)
    docs: list[tuple[Path, Any]] = []
    for f in files:
        if f.suffix == ".jsonl":
            docs.append((f, _JSONL))
            continue
        try:
            doc = loads(f.read_text(encoding="utf-8"))
        except DuplicateKeyError as exc:  # json kept the last value (a hand edit), silently
            out.notes.append(f"{f}: {exc}; skipped")
            continue
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            out.notes.append(f"{f}: not readable JSON ({json_error(exc)}); skipped")
            continue
        if is_graph_doc(doc):
            index.add(f)  # graphs met on the way can be named by results and rankings
        else:
            docs.append((f, doc))
    for f, doc in docs:
        part = Collected()
        try:
            n = _read_one(f, doc, index, part, device_name)
        except (AttributeError, KeyError, TypeError, ValueError, DnnTuneError) as exc:
            # a shape no reader expected: the file is skipped whole, never half read
            out.notes.append(f"{f}: malformed ({type(exc).__name__}: {exc}); skipped")
            continue
        out.records.extend(part.records)
        out.notes.extend(part.notes)
        if n:
            out.files.append(str(f))
    return out


#: stands for a JSON-lines file (an exact-match cache) among the parsed documents: never a
#: document, unlike None (a file holding ``null``, which is no ranking)
_JSONL = object()


def _read_one(f: Path, doc: Any, index: GraphIndex, out: Collected, device_name: str | None) -> int:
    if doc is _JSONL:
        return read_ranking_cache(f, index, out)
    if isinstance(doc, Mapping):
        if doc.get("format") == RECORDS_FORMAT:
            try:
                records = read_records_file(f)
            except DnnTuneError as exc:
                out.notes.append(f"{exc}; skipped")
                return 0
            out.records.extend(records)
            return len(records)
        if doc.get("format") == MODEL_FORMAT:
            out.notes.append(f"{f}: a heuristics model, not training data; skipped")
            return 0
        if "schema_version" in doc and isinstance(doc.get("graphs"), list):
            return read_bench(doc, f, index, out)
        if "engine_overrides" in doc:
            return read_override_file(f, out, device_name)
    if (
        isinstance(doc, list)
        and doc
        and all(isinstance(r, Mapping) and "winner" in r and "graph_key" in r for r in doc)
    ):
        return read_tune_report(doc, f, index, out, device_name)
    out.notes.append(f"{f}: not a recognised tuning-history file; skipped")
    return 0
