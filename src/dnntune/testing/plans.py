"""Run one engine's plan of a graph and compare every output with ``dnntune.reference``."""

from __future__ import annotations

from collections.abc import Mapping

from dnntune import reference
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import KnobValue
from dnntune.frontend import Graph
from dnntune.graph.node import OpKind

__all__ = ["check_plan"]


def check_plan(
    graph: Graph,
    handle: Handle,
    engine: str,
    knobs: Mapping[str, KnobValue] | None = None,
    kind: OpKind = OpKind.MATMUL,
    seed: int = 0,
) -> None:
    """Build ``engine``'s plan of ``graph`` with ``knobs``, run it on reference inputs and
    assert that every output matches the reference within :func:`dnntune.reference.check_outputs`'s
    tolerance (``tolerance_for``, the policy autotune, run and bench use). ``kind`` is kept for
    callers that pass it; the graph's own nodes choose the tolerance.

    Raises:
        AssertionError: naming the output that differs and by how much.
    """

    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext(engine, dict(knobs or {}))
    graph.check_support()
    graph.build_plans()
    pack = reference.make_inputs(graph, handle.device, seed=seed)
    expected = reference.run(graph, pack)
    graph.execute(handle, pack)
    for o in reference.check_outputs(graph, pack, expected).outputs:
        assert o.comparison.ok, (
            f"{graph.name} on {engine} {dict(knobs or {})}: {o.comparison.message}"
        )
