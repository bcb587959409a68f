"""The graph files that tuning-history records name (bench results' ``graph_path``, tune
reports' ``source``, exact-cache keys), found by path, file name or graph key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dnntune.errors import DnnTuneError
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict, parse_graph_text
from dnntune.graph.signature import graph_key

__all__ = ["GraphIndex", "is_graph_doc"]


def is_graph_doc(doc: Any) -> bool:
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
                # as every graph reader parses it: a key named twice is refused, not the last
                # value learned from (a graph whose shapes are in doubt is no training data)
                doc = parse_graph_text(path.read_text(encoding="utf-8"), str(path))
                self._loaded[path] = graph_from_dict(doc, OpGraph) if is_graph_doc(doc) else None
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
