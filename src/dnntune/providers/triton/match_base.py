"""What every Triton kernel match shares: the :class:`Match` base and the single-kind check.

The matchers of each kernel family (:mod:`.patterns`, :mod:`.pool_match`,
:mod:`.batchnorm_match`) build on this module, and :mod:`.patterns` dispatches to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind

__all__ = ["Match", "only_kinds", "only_node"]


class Match:
    """Base of the matches: ``kernel`` names the kernel module and the perf-db file."""

    kernel: str = ""

    def signature(self) -> dict[str, Any]:
        raise NotImplementedError


def only_kinds(graph: OpGraph, kinds: Sequence[OpKind], what: str) -> list[Node]:
    """The graph's nodes in order, or NotSupportedError naming the kinds that are not ``kinds``."""
    others = sorted({n.kind.value for n in graph.nodes if n.kind not in kinds})
    if others:
        raise NotSupportedError(f"graph is not {what}: it has {', '.join(others)} node(s)")
    return graph.topological_nodes()


def only_node(graph: OpGraph, kinds: Sequence[OpKind], what: str, noun: str) -> Node:
    """The graph's one node, of ``kinds``; NotSupportedError where it has other kinds (as
    :func:`only_kinds`) or more than one ("graph is not a single ``noun``")."""
    nodes = only_kinds(graph, kinds, what)
    if len(nodes) != 1:
        raise NotSupportedError(f"graph is not a single {noun}: it has {len(nodes)} nodes")
    return nodes[0]
