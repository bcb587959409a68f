"""What a tuning job takes (graph sources) and returns (one LibraryReport), in either mode."""

from __future__ import annotations

from dataclasses import dataclass, field

from dnntune.frontend import Graph
from dnntune.workflows.tuning import GraphTuneReport

__all__ = ["GraphSource", "LibraryReport"]

#: ``(source, Graph or the error loading it)``, as every rank is given the library
GraphSource = tuple[str, "Graph | Exception"]


@dataclass
class LibraryReport:
    """What the job did: one report per graph (in input order) and the ranks' agreement."""

    reports: list[GraphTuneReport] = field(default_factory=list)
    world_size: int = 1
    shard: str = "graphs"
    wall_time_s: float = 0.0
    #: candidate mode: per graph, the plan name each rank built (all equal when ranks agree;
    #: "" for a rank that built none: no winner, or its failure is the graph's ``error``)
    decisions: list[list[str]] = field(default_factory=list)

    @property
    def ranks_agree(self) -> bool:
        """No two ranks built different plans for a graph (a rank that built none is a
        failure of that graph, reported in its ``error``, not a disagreement)."""
        return all(len(set(names) - {""}) <= 1 for names in self.decisions)
