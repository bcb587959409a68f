"""The suite runner behind ``dnntune bench``: every graph x engine, OOTB rows (+ oracle)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from dnntune import reference, settings
from dnntune._file_kinds import GRAPH, document_kind
from dnntune._version import __version__
from dnntune.backend.engine import Engine
from dnntune.backend.handle import Handle
from dnntune.backend.registry import get_registry
from dnntune.bench.config import BenchConfig, BenchConfigError
from dnntune.bench.metrics import graph_metrics
from dnntune.bench.oracle import run_oracle
from dnntune.bench.results import SuiteResult
from dnntune.bench.rows import RowContext, engine_row
from dnntune.bench.timing import PlanTiming, TimingOptions, time_callable
from dnntune.errors import DnnTuneError
from dnntune.frontend import Graph
from dnntune.graph.json_format import graph_from_dict, parse_graph_text, read_graph_text
from dnntune.graph.json_unknown import unknown_fields, unknown_fields_note
from dnntune.measure import cold_flush
from dnntune.rfc import TuneMode

__all__ = ["BenchRunner", "Event", "graph_id_of"]

_log = logging.getLogger(__name__)

#: progress callback: (event, payload) with events "graph_start", "row_done", "graph_done"
#: and "warning" (``message``: to show now; it is in ``run.warnings`` too)
Event = Callable[[str, dict[str, Any]], None]

#: results files are rewritten at most this often during a long run
REFRESH_S = 10.0


def graph_id_of(doc: Any) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _stored_tuning() -> set[str]:
    """Which of the caches that earlier tuning fills hold records now (folder names under
    ``DNNTUNE_CACHE_DIR``)."""
    root = settings.cache_dir()
    names = ("autotune-rankings", "cudnn-find-db", "triton-perf-db")
    return {n for n in names if (root / n).is_dir() and any((root / n).rglob("*.jsonl"))}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(handle: Handle) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "device": handle.device_signature(),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "cudnn_frontend": _version("nvidia-cudnn-frontend"),
        "selection_env": settings.selection_environment(),
    }
    return env


class BenchRunner:
    """Runs a bench configuration; the CLI renders what it returns (the library never prints)."""

    def __init__(
        self,
        config: BenchConfig,
        handle: Handle,
        paths: Sequence[Path],
        argv: Sequence[str] = (),
        on_event: Event | None = None,
        measure: Callable[[str, Callable[[], None]], PlanTiming] | None = None,
    ) -> None:
        self.config = config.check()
        self.handle = handle
        self.paths = list(paths)
        self.on_event = on_event or (lambda event, payload: None)
        self.flush = cold_flush(handle.device, config.cache_mode)
        self.options = TimingOptions(
            warmup=config.warmup,
            iters=config.iters,
            min_time_ms=config.min_time_ms,
            cache_mode=config.cache_mode,
            max_iters=config.max_iters,
        )
        self.measure = measure or self._measure
        self.warnings: list[str] = []
        self.result = SuiteResult(
            run={
                "started_at": _now(),
                "finished_at": None,
                "complete": False,
                "argv": list(argv),
                "config": {k: v for k, v in asdict(config).items() if k != "graphs"},
                "warnings": self.warnings,
            },
            environment=environment(handle),
            tool={"name": "dnntune bench", "version": __version__},
            oracle=config.oracle,
        )
        self._last_write = 0.0
        #: why the last write of ``--output`` failed (None: written, or nothing to write); a
        #: failed write costs neither the run nor the console report, and is retried
        self.write_error: str | None = None
        self._engine_filter = self._resolve_engines()
        if config.oracle:
            self._selection_warning()

    # ---- setup ----------------------------------------------------------------------------
    def _resolve_engines(self) -> list[int] | None:
        if not self.config.engines:
            return None
        registry = get_registry()
        ids = []
        for name in self.config.engines:
            engine = registry.find(name)
            if engine is None:
                known = ", ".join(e.name for e in registry.engines())
                raise BenchConfigError(f"--engine {name!r}: unknown engine; known: {known}")
            ids.append(engine.id)
        return ids

    def _selection_warning(self) -> None:
        env = settings.selection_environment()
        reasons = []
        if env.get("DNNTUNE_HEUR_CONFIG_PATH"):
            reasons.append("DNNTUNE_HEUR_CONFIG_PATH is set (an override file can reorder engines)")
        # the caches matter only when they hold something or this run can fill them (the
        # find/perf databases of CUDA engines): a first CPU run has nothing to warn of
        stored = _stored_tuning()
        if not settings.exact_engine_cache_disabled() and "autotune-rankings" in stored:
            reasons.append("the exact-match ranking cache is enabled and holds rankings")
        if not settings.cache_disabled() and (
            stored - {"autotune-rankings"} or self.handle.device.type == "cuda"
        ):
            reasons.append(
                "engine find/perf databases are enabled (a stored search can become "
                "the heuristic plan)"
            )
        if reasons:
            message = (
                "--oracle: the OOTB pick may come from earlier tuning: "
                + "; ".join(reasons)
                + ". For a cold baseline set DNNTUNE_DISABLE_EXACT_ENGINE_CACHE=1 and "
                "DNNTUNE_DISABLE_CACHE=1 (dnntune never changes them itself)."
            )
            self.warnings.append(message)
            _log.info("%s", message)  # the CLI shows run.warnings once

    def _unknown_fields_warning(self, path: Path, doc: Any) -> None:
        """One warning for the graph file's keys dnntune does not read: they are kept but
        ignored, so a misspelled one (``casual_mask``) benchmarks the default in its place.
        Shown as the graph starts and recorded in the results' ``run.warnings``."""
        unknown = unknown_fields(doc)
        if unknown:
            message = unknown_fields_note(path, unknown)
            self.warnings.append(message)
            self.on_event("warning", {"message": message})

    def _measure(self, label: str, run: Callable[[], None]) -> PlanTiming:
        return time_callable(run, self.handle, self.options, self.flush)

    # ---- running --------------------------------------------------------------------------
    def run(self) -> SuiteResult:
        """Benchmark every graph; on KeyboardInterrupt, write what exists and re-raise."""
        try:
            for index, path in enumerate(self.paths):
                self.on_event(
                    "graph_start", {"index": index, "total": len(self.paths), "path": str(path)}
                )
                entry = self._run_graph_guarded(path)
                self.result.graphs.append(entry)
                self.on_event("graph_done", {"index": index, "graph": entry})
                self._maybe_write(force=False)
            self.result.run["complete"] = True
        finally:
            self.result.run["finished_at"] = _now()
            self._maybe_write(force=True)
        return self.result

    def _run_graph_guarded(self, path: Path) -> dict[str, Any]:
        """:meth:`run_graph`, with any error but Ctrl-C turned into a failed graph entry.

        An error outside dnntune's own (a CUDA out-of-memory RuntimeError, a bug in an engine)
        costs that graph only: it is reported with its reason and the suite goes on.
        """
        try:
            return self.run_graph(path)
        except Exception as exc:
            _log.debug("bench: %s raised", path, exc_info=True)
            return {
                "graph_id": None,
                "graph_name": path.stem,
                "graph_path": str(path),
                "status": "error",
                "error": type(exc).__name__,
                "message": f"{type(exc).__name__}: {exc}",
                "results": [],
            }

    def _maybe_write(self, force: bool) -> None:
        if not self.config.output:
            return
        now = time.monotonic()
        if force or now - self._last_write >= REFRESH_S:
            # a full disk or a folder removed meanwhile ended the run with a traceback and no
            # table, the graphs left unrun (audit, session 19): remember it, go on, and let
            # the CLI say so and fail
            try:
                self.result.write(self.config.output)
            except DnnTuneError as exc:
                _log.debug("bench: writing %s failed: %s", self.config.output, exc)
                self.write_error = str(exc)
            else:
                self.write_error = None
            self._last_write = now

    def _engines_for(self, graph: Any) -> tuple[list[Engine], dict[str, str]]:
        registry = get_registry()
        applicable: list[Engine] = []
        reasons: dict[str, str] = {}
        for engine, why in registry.applicability(graph, self.handle):
            if self._engine_filter is not None and engine.id not in self._engine_filter:
                continue
            if why is None:
                applicable.append(engine)
            else:
                reasons[engine.name] = why
        if self._engine_filter is not None:
            order = {eid: i for i, eid in enumerate(self._engine_filter)}
            applicable.sort(key=lambda e: order[e.id])
        return applicable, reasons

    def run_graph(self, path: Path) -> dict[str, Any]:

        entry: dict[str, Any] = {
            "graph_id": None,
            "graph_name": path.stem,
            "graph_path": str(path),
            "status": "ok",
            "error": None,
            "message": None,
            "results": [],
        }
        doc: Any = None
        try:
            # "invalid JSON at line L column C: ...", and a key named twice, as validate, run
            # and tune say it; the decoder's own message did not say that the file is not JSON
            doc = parse_graph_text(read_graph_text(path))
            entry["graph_id"] = graph_id_of(doc)
            self._unknown_fields_warning(path, doc)
            graph = graph_from_dict(doc, Graph)  # its unknown keys were warned of just above
            graph.validate()
            entry["graph_name"] = graph.name or path.stem
        except DnnTuneError as exc:
            # the CLI names the file; keep one copy of it in the message where it leads or
            # trails (not inside: "cannot read graph file F: Permission denied" lost its colon)
            message = str(exc).removeprefix(f"{path}: ").replace(f" (in {path})", "")
            kind = document_kind(doc)
            if kind is not None and kind is not GRAPH:
                # a results file left in a graph folder by an earlier -o read "name: required
                # field missing", and a `run --json` file "a graph document must be a JSON
                # object, got list": say what the file is, in validate's, run's and tune's words
                message = f"{kind.not_a('a graph')}; give -g graph files or their folders"
            entry.update(status="error", error=type(exc).__name__, message=message)
            return entry
        try:
            pack = reference.make_inputs(
                graph,
                self.handle.device,
                seed=self.config.seed,
                max_bytes=self.config.max_input_bytes,
            )
            output_uids = [t.uid for t in graph.output_tensors() if t.uid is not None]
            expected = None
            if self.config.validate == "reference":
                expected = reference.run(graph, pack)
        except Exception as exc:
            entry.update(
                status="error", error=type(exc).__name__, message=f"inputs/reference: {exc}"
            )
            return entry
        ctx = RowContext(
            doc=doc,
            handle=self.handle,
            pack=pack,
            output_uids=output_uids,
            expected=expected,
            metrics=graph_metrics(graph),
            rtol=self.config.rtol,
            atol=self.config.atol,
            measure=self.measure,
            graph=graph,  # validated above: the document is parsed once per run
        )
        if self.config.backend == "pytorch":
            engine = get_registry().get("TORCH_ENGINE")
            row, _ = engine_row(ctx, engine, provider="pytorch", label="pytorch-eager")
            entry["results"].append(row)
            self.on_event("row_done", {"graph": entry["graph_name"], "row": row})
            return entry
        engines, reasons = self._engines_for(graph)
        if not engines:
            entry.update(
                status="no_engines",
                message="no engine applies: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
            )
            return entry
        budget = self.config.budget_s
        left_s, rows_left = budget, len(engines)  # the graph's budget, shared as it goes
        for engine in engines:
            row, runner = engine_row(ctx, engine)
            rows_left -= 1
            if self.config.oracle:
                if runner is None:
                    failed = row["verdict"] != "not_supported"
                    row.update(
                        oracle=None,
                        oracle_delta=None,
                        oracle_error="the OOTB plan failed; nothing to compare" if failed else None,
                    )
                else:
                    # this row's share of what is left: a row that tunes nothing (its plan
                    # failed) or underspends leaves its share to the rows after it
                    share = None if left_s is None else max(left_s, 0.0) / (rows_left + 1)
                    start = time.perf_counter()
                    run_oracle(
                        ctx,
                        engine,
                        runner,
                        row,
                        self.config.warmup,
                        share,
                        TuneMode(self.config.oracle_mode),
                    )
                    if left_s is not None:
                        # the budget is the graph's tuning: a row spends what its tuning took
                        # (plan specs and autotune, ``tuning_wall_ms``), not the baseline and
                        # tuned plan timed after it, which is measurement (counted, 100
                        # launches of each starved the rows after it of their share on a slow
                        # CPU); a tune that raised spent its wall time
                        oracle_info = row.get("oracle") or {}
                        spent_ms = oracle_info.get("tuning_wall_ms")
                        left_s -= (
                            time.perf_counter() - start if spent_ms is None else spent_ms / 1e3
                        )
            entry["results"].append(row)
            self.on_event("row_done", {"graph": entry["graph_name"], "row": row})
        return entry
