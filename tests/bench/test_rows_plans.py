"""bench rows and --oracle build their plans as values from the row context's one graph: no row
reads the graph document again, and no row changes the graph the next row plans from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt
from dnntune import reference, testing
from dnntune.backend.registry import get_registry
from dnntune.bench.config import BenchConfig
from dnntune.bench.metrics import graph_metrics
from dnntune.bench.oracle import run_oracle
from dnntune.bench.rows import RowContext, engine_row
from dnntune.bench.runner import BenchRunner
from dnntune.bench.timing import PlanTiming, TimingOptions, time_callable

NAMES = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]


def _measure(handle: dt.Handle) -> Callable[[str, Callable[[], None]], PlanTiming]:
    def measure(label: str, run: Callable[[], None]) -> PlanTiming:
        return time_callable(run, handle, TimingOptions(warmup=1, iters=3))

    return measure


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    original = dt.Graph.from_json  # bound to dt.Graph, the only class the bench loads

    def counting(cls: type, text: Any) -> dt.Graph:
        calls.append(text)
        return original(text)

    monkeypatch.setattr(dt.Graph, "from_json", classmethod(counting))
    return calls


def test_rows_and_oracle_plan_from_the_context_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    with testing.fake_engines(names=NAMES):
        handle = dt.create_handle("cpu")
        graph = testing.small_matmul_graph()
        graph.validate()
        doc = graph.to_dict()
        pack = reference.make_inputs(graph, handle.device, seed=0)
        outputs = [t.uid for t in graph.output_tensors() if t.uid is not None]
        ctx = RowContext(
            doc=doc,
            handle=handle,
            pack=pack,
            output_uids=outputs,
            expected=reference.run(graph, pack),
            metrics=graph_metrics(graph),
            rtol=None,
            atol=None,
            measure=_measure(handle),
            graph=graph,
        )
        parses = _count_parses(monkeypatch)
        rows = []
        for name in NAMES:
            row, runner = engine_row(ctx, get_registry().get(name))
            assert runner is not None and runner.graph is graph, row["message"]
            run_oracle(ctx, get_registry().get(name), runner, row, warmup=1)
            rows.append(row)
    assert parses == []  # every plan came from the context's graph
    assert [r["plan_name"] for r in rows] == NAMES
    assert all(r["verdict"] == "passed" for r in rows)
    assert rows[0]["oracle_error"] is None and rows[0]["oracle"]["status"] == "ok"
    assert rows[0]["oracle"]["candidates_total"] >= 4  # FAKE_ENGINE_A's knob variants
    assert graph.plan_set.specs is None and graph.active_plan is None  # only read


def test_a_bench_run_reads_each_graph_document_once_for_all_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = testing.small_matmul_graph()
    g.name = "mm"
    path = tmp_path / "mm.json"
    g.save(path)
    parses = _count_parses(monkeypatch)
    with testing.fake_engines(names=NAMES):
        handle = dt.create_handle("cpu")
        cfg = BenchConfig(graphs=(str(path),), warmup=1, iters=3, oracle=True)
        result = BenchRunner(cfg, handle, [path], measure=_measure(handle)).run()
    rows = result.graphs[0]["results"]
    assert [r["status"] for r in rows] == ["success", "success"]
    assert all(r["oracle_error"] is None for r in rows)
    # the runner's parse and the row context's (when the runner does not hand its graph over):
    # two engine rows with --oracle no longer read the document once per row and per oracle
    assert len(parses) <= 2
