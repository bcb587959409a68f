"""The bench table's title shows the graph id whatever its first hex digit (Rich read an id
such as ``[b4d170fc0a62]`` as a style tag and dropped it; docs audit, session 15)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dnntune.bench.report import graph_table


@pytest.mark.parametrize(
    ("name", "graph_id"),
    [("layernorm", "b4d170fc0a62"), ("rmsnorm", "461a244b7e3f"), ("odd[name]", "deadbeef0123")],
)
def test_the_title_keeps_the_graph_id_and_name(name: str, graph_id: str) -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(graph_table({"graph_name": name, "graph_id": graph_id, "results": []}, False))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"{name}  [{graph_id}]" in text
