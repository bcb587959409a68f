"""Which of dnntune's own JSON files a document is, for the error of a reader given the wrong one.

dnntune writes six kinds of JSON file (graphs, override files, heuristics models, bench
results, tune reports and run results), and users give one where another goes: the results of
``run --json`` as ``bench -g``, an override file to ``heuristics show``. The reader's own
complaint ("a graph document must be a JSON object, got list", "not a dnntune-heuristics-model
file") says nothing of what the file is. Every reader names it with :func:`document_kind`, so
``validate``, ``run``, ``tune``, ``bench`` and ``heuristics show`` say it the same way.

At the bottom layer: the graph commands (``cli/``), ``bench/`` and the model reader
(``backend/learned``) all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BENCH_RESULTS",
    "GRAPH",
    "HEURISTICS_MODEL",
    "OVERRIDES",
    "RUN_RESULTS",
    "TUNE_REPORT",
    "FileKind",
    "document_kind",
]


@dataclass(frozen=True)
class FileKind:
    """One kind of dnntune JSON file: ``name`` for code, ``what`` and ``use`` for people."""

    name: str  #: graph, overrides, heuristics-model, bench-results, tune-report, run-results
    what: str  #: "an engine-override file (what `dnntune tune` writes)"
    use: str  #: what reads it, or where the file it stands for is: "`dnntune ... FILE` reads it"

    def not_a(self, expected: str) -> str:
        """``<what>, not <expected>; <use>``: the message for a reader that wanted ``expected``."""
        return f"{self.what}, not {expected}; {self.use}"


GRAPH = FileKind("graph", "a graph file", "`dnntune validate FILE` checks it")
OVERRIDES = FileKind(
    "overrides",
    "an engine-override file (what `dnntune tune` writes)",
    "`dnntune overrides show FILE` checks it",
)
HEURISTICS_MODEL = FileKind(
    "heuristics-model",
    "a learned heuristics model (`dnntune heuristics train`)",
    "`dnntune heuristics show FILE` reads it",
)
BENCH_RESULTS = FileKind(
    "bench-results",
    "a `dnntune bench` results file",
    "`dnntune bench compare A B` reads it",
)
TUNE_REPORT = FileKind(
    "tune-report",
    "a `dnntune tune --report` file",
    "its `source` fields name the graphs it tuned",
)
RUN_RESULTS = FileKind(
    "run-results",
    "a `dnntune run --json` results file",
    "its `source` fields name the graphs it ran",
)


def document_kind(doc: Any) -> FileKind | None:
    """The kind of dnntune file the parsed JSON ``doc`` is, or None when it is none of them.

    Judged by the top-level keys each writer always writes, so a damaged file of a kind is
    still named (a graph with a bad node is still a graph file).
    """
    if isinstance(doc, list):  # the per-graph lists tune --report and run --json write
        return _list_kind(doc)
    if not isinstance(doc, Mapping):
        return None
    if "nodes" in doc or "tensors" in doc:
        return GRAPH
    if "engine_overrides" in doc:
        return OVERRIDES
    if doc.get("format") == "dnntune-heuristics-model":
        return HEURISTICS_MODEL
    if "schema_version" in doc:
        return BENCH_RESULTS
    return None


def _list_kind(doc: list[Any]) -> FileKind | None:
    if not doc or not all(isinstance(r, Mapping) and "graph" in r for r in doc):
        return None
    if all("winner" in r for r in doc):
        return TUNE_REPORT
    if all({"plan", "policy"} <= r.keys() for r in doc):
        return RUN_RESULTS
    return None
