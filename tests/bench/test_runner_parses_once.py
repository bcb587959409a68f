"""A bench run hands the graph it parsed and validated to the rows' context: one parse of each
graph document per run, however many engine rows and oracle tunes it has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune import testing
from dnntune.bench import rows as bench_rows
from dnntune.bench import runner as bench_runner
from dnntune.bench.config import BenchConfig
from dnntune.bench.rows import RowContext
from dnntune.bench.runner import BenchRunner
from dnntune.bench.timing import PlanTiming, TimingOptions, time_callable
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_dict

NAMES = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]


def test_the_runner_parses_each_document_once_and_shares_its_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = testing.small_matmul_graph()
    g.name = "mm"
    path = tmp_path / "mm.json"
    g.save(path)
    parsed: list[OpGraph] = []
    contexts: list[RowContext] = []

    def counting(doc: Any, graph_cls: type[OpGraph], **kwargs: Any) -> OpGraph:
        parsed.append(graph_from_dict(doc, graph_cls, **kwargs))
        return parsed[-1]

    def spy(*args: Any, **kwargs: Any) -> RowContext:
        contexts.append(RowContext(*args, **kwargs))
        return contexts[-1]

    # the runner builds the graph, and a context not handed one would build its own
    monkeypatch.setattr(bench_runner, "graph_from_dict", counting)
    monkeypatch.setattr(bench_rows, "graph_from_dict", counting)
    monkeypatch.setattr(bench_runner, "RowContext", spy)
    with testing.fake_engines(names=NAMES):
        handle = dt.create_handle("cpu")

        def measure(label: str, run: Callable[[], None]) -> PlanTiming:
            return time_callable(run, handle, TimingOptions(warmup=1, iters=3))

        cfg = BenchConfig(graphs=(str(path),), warmup=1, iters=3, oracle=True)
        result = BenchRunner(cfg, handle, [path], measure=measure).run()
    rows = result.graphs[0]["results"]
    assert [r["status"] for r in rows] == ["success", "success"]
    assert len(parsed) == 1 and len(contexts) == 1
    assert contexts[0].op_graph is parsed[0]
