"""Training records from the files tuning already leaves behind (JSON only, never pickle).

Each file is recognised by its content, not its name:

* ``dnntune bench`` results (``schema_version`` 1, docs/bench.md): per graph, each engine's
  out-of-the-box row (``kernel.median_ms``, rows that succeeded and did not fail validation),
  and with ``--oracle`` the tuned plan's knobs and median as that engine's best config. The
  graph is read from ``graph_path`` (absolute, relative to the results file, the working
  directory, or found by file name under ``--graphs``). Device: ``environment.device.name``.
* ``dnntune tune --report`` reports: the winner and runner-up of each graph (their medians and
  knobs), and the heuristic plan the winner was confirmed against, as tuning decided: the plan
  it chose first, the confirmation's paired times where there are some (:func:`_as_decided`).
  Graph from ``source``; the report names no GPU model, so ``device_name`` must be given.
* engine-override files (``dnntune tune -o``, RFC 0013 section 6.5): each entry's winner, an
  order-only record built from the entry's tensors (no data type, no epilogue); the device is
  the entry's ``autotune_metadata.device``. Entries with -1 wildcards are skipped.
* the exact-match ranking cache (``$DNNTUNE_CACHE_DIR/autotune-rankings``): each ranking is an
  order-only record; its key names the graph by hash only, so the graph must be among the
  graph files given, and the device must be one of this machine's.
* records files (``dnntune-heuristics-records``, :mod:`dnntune.learning.records`).

Graph files met while walking directories join the graph index. Anything else is skipped with
a note saying why (a file nested too deeply to parse is invalid JSON like any other); nothing
here raises for a bad input file.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune import settings
from dnntune.backend.handle import create_handle
from dnntune.backend.learned import Problem, TensorInfo, device_class, problem_from_tensors
from dnntune.backend.learned import problem_of as graph_problem
from dnntune.backend.learned.model import FORMAT as MODEL_FORMAT
from dnntune.errors import DnnTuneError
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict
from dnntune.graph.signature import graph_key
from dnntune.learning.records import (
    RECORDS_FORMAT,
    TIE_STEP,
    Record,
    order_record,
    read_records_file,
)
from dnntune.measure.contention import BUSY_WAIT_SHARE
from dnntune.overrides import exact_cache
from dnntune.overrides.format import WILDCARD, canonical_tensor_id, load_file
from dnntune.overrides.store import read_lines_each

__all__ = ["Collected", "GraphIndex", "collect", "default_paths"]


@dataclass
class Collected:
    """What :func:`collect` found: records, the files they came from, and what was skipped."""

    records: list[Record] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _is_graph_doc(doc: Any) -> bool:
    return isinstance(doc, Mapping) and "tensors" in doc and "nodes" in doc


class GraphIndex:
    """Graph files by path, file name and graph key, loaded on first use."""

    def __init__(self, dirs: Iterable[Path] = ()) -> None:
        self._files: dict[str, list[Path]] = {}
        self._loaded: dict[Path, OpGraph | None] = {}
        for d in dirs:
            for p in sorted(d.rglob("*.json")) if d.is_dir() else [d]:
                self.add(p)

    def add(self, path: Path) -> None:
        self._files.setdefault(path.name, [])
        if path not in self._files[path.name]:
            self._files[path.name].append(path)

    def load(self, path: Path) -> OpGraph | None:
        if path not in self._loaded:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                self._loaded[path] = graph_from_dict(doc, OpGraph) if _is_graph_doc(doc) else None
            except (OSError, UnicodeDecodeError, ValueError, RecursionError, DnnTuneError):
                self._loaded[path] = None
        return self._loaded[path]

    def resolve(self, ref: str, base: Path) -> OpGraph | None:
        """The graph ``ref`` names: a path (absolute, from ``base``, from the working
        directory) or, failing that, a graph file of that name in the index."""
        if not ref:
            return None
        p = Path(ref)
        for candidate in (p, base / p, Path.cwd() / p):
            if candidate.is_file():
                return self.load(candidate)
        for candidate in self._files.get(p.name, []):
            graph = self.load(candidate)
            if graph is not None:
                return graph
        return None

    def by_key(self) -> dict[str, OpGraph]:
        """Every indexed graph by its graph key (loads them all)."""
        out: dict[str, OpGraph] = {}
        for paths in self._files.values():
            for path in paths:
                graph = self.load(path)
                if graph is not None:
                    out.setdefault(graph_key(graph), graph)
        return out


def default_paths() -> list[Path]:
    """The tuning history a user has without naming it: the exact-match cache and the
    override file of ``DNNTUNE_HEUR_CONFIG_PATH``."""
    out = [settings.cache_dir() / "autotune-rankings"]
    config = settings.heur_config_path()
    if config is not None:
        out.append(config)
    return [p for p in out if p.exists()]


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _knobs(items: Any) -> dict[str, Any]:
    """Knob settings as a mapping; items without a string ``knob_id`` are left out."""
    if isinstance(items, Mapping):
        return {k: v for k, v in items.items() if isinstance(k, str)}
    if isinstance(items, list):
        return {
            k["knob_id"]: k.get("value")
            for k in items
            if isinstance(k, Mapping) and isinstance(k.get("knob_id"), str)
        }
    return {}


def _field(doc: Any, key: str) -> Any:
    """``doc[key]`` where ``doc`` is a JSON object, else None (a malformed record)."""
    return doc.get(key) if isinstance(doc, Mapping) else None


def _name(value: Any) -> str | None:
    """A non-empty string (an engine or device name), else None."""
    return value if isinstance(value, str) and value else None


def _problem(graph: OpGraph) -> Problem:
    return graph_problem(graph)


# ---- the readers -------------------------------------------------------------------------------
def _bench(doc: Mapping[str, Any], path: Path, index: GraphIndex, out: Collected) -> int:
    name = _name(_field(_field(doc.get("environment"), "device"), "name"))
    if name is None:
        out.notes.append(f"{path}: no environment.device.name; skipped")
        return 0
    n = 0
    for i, g in enumerate(doc.get("graphs") or []):
        if not isinstance(g, Mapping) or g.get("status") != "ok":
            continue
        graph = index.resolve(str(g.get("graph_path") or ""), path.parent)
        if graph is None:
            out.notes.append(f"{path}: graphs[{i}]: graph {g.get('graph_path')!r} not found")
            continue
        times: dict[str, float] = {}
        configs: dict[str, dict[str, Any]] = {}
        for row in g.get("results") or []:
            if not isinstance(row, Mapping) or row.get("provider", "dnntune") != "dnntune":
                continue
            if row.get("status") not in ("success", "ok"):
                continue
            if row.get("verdict") not in ("passed", "unchecked"):
                continue
            engine, kernel = _name(_field(row.get("engine"), "name")), row.get("kernel")
            if engine is None or not isinstance(kernel, Mapping | None):
                out.notes.append(
                    f"{path}: graphs[{i}]: a result row whose engine or kernel is malformed; "
                    "row skipped"
                )
                continue
            t = _ms(_field(kernel, "median_ms"))
            if t is None:
                continue
            times[engine] = min(t, times.get(engine, math.inf))
            tuned = _ms(_field(row.get("oracle_delta"), "tuned_median_ms"))
            oracle = row.get("oracle")
            if tuned is not None and isinstance(oracle, Mapping):
                configs[engine] = {"knobs": _knobs(oracle.get("knob_settings")), "time_ms": tuned}
        if times:
            out.records.append(
                Record(
                    _problem(graph),
                    device_class(str(name)),
                    times,
                    configs,
                    False,
                    f"{path}#graphs[{i}]",
                )
            )
            n += 1
    return n


def _tune_report(
    doc: Sequence[Any], path: Path, index: GraphIndex, out: Collected, device_name: str | None
) -> int:
    if not device_name:
        out.notes.append(f"{path}: a tune report names no GPU model; pass --device-name")
        return 0
    n = 0
    for i, r in enumerate(doc):
        if not isinstance(r, Mapping) or not r.get("ok"):
            continue
        clash = _device_clash(r.get("device"), device_name)
        if clash:
            out.notes.append(f"{path}: [{i}]: {clash}; skipped")
            continue
        graph = index.resolve(str(r.get("source") or ""), path.parent)
        if graph is None:
            out.notes.append(f"{path}: [{i}]: graph {r.get('source')!r} not found")
            continue
        plans: dict[str, _Plan] = {}
        for part in ("winner", "runner_up"):
            res = r.get(part)
            if not isinstance(res, Mapping):
                continue
            engine, t = _name(res.get("engine_name")), _ms(res.get("median_time_ms"))
            if engine is None:
                out.notes.append(f"{path}: [{i}]: {part}'s engine_name is malformed; skipped")
                continue
            if t is not None:
                name = _name(res.get("plan")) or engine
                plans.setdefault(part, _Plan(name, engine, _knobs(res.get("knobs")), t))
        if not plans:
            continue
        why = _as_decided(r, plans)
        if why:
            out.notes.append(f"{path}: [{i}]: {why}; skipped")
            continue
        times: dict[str, float] = {}
        configs: dict[str, dict[str, Any]] = {}
        for plan in sorted(plans.values(), key=lambda p: p.time_ms):
            if plan.engine in times:
                continue  # an engine's time is its fastest plan's
            times[plan.engine] = plan.time_ms
            if plan.knobs:
                configs[plan.engine] = {"knobs": plan.knobs, "time_ms": plan.time_ms}
        device = device_class(device_name)
        out.records.append(Record(_problem(graph), device, times, configs, False, f"{path}[{i}]"))
        n += 1
    return n


@dataclass
class _Plan:
    """One plan of a tune report entry and the time the record gives it."""

    name: str
    engine: str
    knobs: dict[str, Any]
    time_ms: float


def _as_decided(entry: Mapping[str, Any], plans: dict[str, _Plan]) -> str:
    """Make ``plans`` (the report's ``winner`` and ``runner_up``, keyed so; the heuristic plan
    is added under ``default``) say what the tuner decided; returns why the entry cannot
    ("" when it can).

    The sweep's medians alone are not the decision. After the sweep, ``dnntune tune``
    confirms its winner against the heuristic plan in interleaved rounds (``confirmation``)
    and keeps the heuristic plan unless the winner is faster beyond noise
    (``kept_heuristic``): the plan written to the override file is then the heuristic one,
    which a lucky sweep median may show as the slower. So:

    * the confirmation's paired speedup gives the heuristic plan's time against the
      challenger it timed, scaling the sweep's other times to the same clock (the heuristic
      plan is added when the report's two plans do not include it);
    * the plan the tuner chose (the kept heuristic plan, else the winner) is the fastest: a
      plan timed at least as fast as it is a tie, recorded :data:`TIE_STEP` slower;
    * timings taken while the timing threads waited for a CPU core
      :data:`~dnntune.measure.contention.BUSY_WAIT_SHARE` of the time or more are not trusted
      by the tuner, nor here: the entry is skipped (:func:`_busy`).
    """
    conf = entry.get("confirmation")
    conf = conf if isinstance(conf, Mapping) else {}
    busy = _busy(entry, conf)
    if busy:
        return f"timed while the CPU was busy ({busy}), so tuning did not trust the timings"
    kept = entry.get("kept_heuristic") is True or conf.get("kept_default") is True
    challenger, default = _name(conf.get("winner")), _name(conf.get("default"))
    speedup, timed = _ms(conf.get("speedup")), _ms(conf.get("winner_ms"))
    if kept and default is None:
        return "tuning kept the heuristic plan, but the report does not name it"
    by_name = {p.name: p for p in plans.values()}
    if challenger in by_name and default and speedup is not None and timed is not None:
        # the paired rounds decided: their clock for the plans they timed, the sweep's
        # ratios for the rest
        scale = timed / by_name[challenger].time_ms
        for plan in plans.values():
            plan.time_ms *= scale
        if default in by_name:
            by_name[default].time_ms = timed * speedup
        else:
            plans["default"] = _Plan(default, default.split("[", 1)[0], {}, timed * speedup)
            by_name[default] = plans["default"]
    chosen = by_name.get(default or "") if kept else plans.get("winner")
    if chosen is None:
        if kept:
            return (
                f"tuning kept the heuristic plan {default}, which the report gives no time "
                "against the others"
            )
        return ""  # no winner: nothing was chosen among what is left
    for plan in plans.values():
        if plan is not chosen and plan.time_ms <= chosen.time_ms:
            plan.time_ms = chosen.time_ms * (1.0 + TIE_STEP)
    return ""


def _busy(entry: Mapping[str, Any], conf: Mapping[str, Any]) -> str:
    """How the entry's timings were taken on an oversubscribed CPU ("" if they were not): the
    confirmation's rounds (``confirmation.cpu_wait_share``), the sweep's
    (``cost.timing_cpu_wait_share``), or the report's own verdict on them
    (``timed_while_busy``)."""
    where = (
        ("the confirmation", _field(conf, "cpu_wait_share")),
        ("the sweep", _field(entry.get("cost"), "timing_cpu_wait_share")),
    )
    for what, share in where:
        if _ms(share) is not None and share >= BUSY_WAIT_SHARE:
            return f"its timing threads waited for a core {100.0 * share:.0f}% of {what}"
    if entry.get("timed_while_busy") is True:
        return "the report says its timings were taken on a busy CPU"
    return ""


#: words of a device class (:func:`device_class`) that name a GPU, and a CPU
_GPU_WORDS = ("nvidia", "geforce", "tesla", "quadro", "radeon", "instinct", "gpu")
_CPU_WORDS = ("cpu", "epyc", "xeon", "ryzen", "threadripper")


def _device_clash(device: Any, device_name: str) -> str:
    """Why a tune report's entry, tuned on ``device`` ("cpu", "cuda:0"), cannot be the
    ``--device-name`` given ("" when nothing contradicts it): CPU timings labelled as a GPU
    (or the reverse) would teach the model the wrong device's ranking."""
    if not isinstance(device, str) or not device:
        return ""
    kind = device.split(":")[0].lower()
    named = device_class(device_name)
    gpu = any(w in named for w in _GPU_WORDS)
    cpu = any(w in named for w in _CPU_WORDS)
    if (kind == "cpu" and gpu) or (kind == "cuda" and cpu):
        return (
            f"tuned on {device!r}, which cannot be --device-name {device_name!r}; pass the "
            "name of the device it was tuned on (one --device-name per train: give reports "
            "of other devices to another train)"
        )
    return ""


def _override_file(path: Path, out: Collected) -> int:
    try:
        config = load_file(path)
    except DnnTuneError as exc:
        out.notes.append(f"{exc}; skipped")
        return 0
    n = 0
    for i, entry in enumerate(config.entries):
        meta = entry.metadata or {}
        device = meta.get("device")
        if not device:
            out.notes.append(f"{path}: engine_overrides[{i}]: no autotune_metadata.device")
            continue
        if any(WILDCARD in t.dim or WILDCARD in t.stride for t in entry.tensors):
            continue  # a generalized entry is no single problem
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
    return n


@functools.cache
def _local_devices() -> dict[str, str]:
    """This machine's device keys -> device names (what an exact-cache key can name)."""
    out = {}
    for dev in ("cpu", "cuda"):
        try:
            h = create_handle(dev)
            out[h.device_key()] = str(h.device_signature().get("name"))
        except DnnTuneError:
            continue
    return out


def _exact_cache(path: Path, index: GraphIndex, out: Collected) -> int:
    key = path.stem
    graph = index.by_key().get(key[:32])
    if graph is None:
        out.notes.append(f"{path}: no graph file given for this ranking (graph key {key[:32]})")
        return 0
    device = _local_devices().get(key[32:])
    if device is None:
        out.notes.append(f"{path}: ranked on another machine (device key {key[32:]}); skipped")
        return 0
    try:  # each line decoded on its own: a byte that is not UTF-8 spoils only its line
        lines = read_lines_each(path) or []
        stamp = json.loads(lines[0]) if lines else None
    except (OSError, json.JSONDecodeError, RecursionError) as exc:
        out.notes.append(f"{path}: cannot read: {_json_error(exc)}")
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
    names = [record.engine_names.get(i, f"0x{i & 0xFFFFFFFFFFFFFFFF:016x}") for i in record.order]
    out.records.append(order_record(_problem(graph), device_class(device), names, str(path)))
    return 1


def _json_error(exc: Exception) -> str:
    """What was wrong with a file that did not parse (a RecursionError says it too vaguely)."""
    return "invalid JSON: nested too deeply" if isinstance(exc, RecursionError) else str(exc)


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
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            out.notes.append(f"{f}: not readable JSON ({_json_error(exc)}); skipped")
            continue
        if _is_graph_doc(doc):
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
        return _exact_cache(f, index, out)
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
            return _bench(doc, f, index, out)
        if "engine_overrides" in doc:
            return _override_file(f, out)
    if (
        isinstance(doc, list)
        and doc
        and all(isinstance(r, Mapping) and "winner" in r and "graph_key" in r for r in doc)
    ):
        return _tune_report(doc, f, index, out, device_name)
    out.notes.append(f"{f}: not a recognised tuning-history file; skipped")
    return 0
