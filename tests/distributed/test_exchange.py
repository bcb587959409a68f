"""Graph mode's collectives run beside the tuning: a rank tunes its next graph while the
gather of the previous round still waits for a slower peer (no per-round lock step)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dnntune.distributed import library
from dnntune.distributed.env import DistContext
from dnntune.distributed.payload import report_to_payload
from dnntune.distributed.writer import Writer
from dnntune.workflows.tuning import GraphTuneReport, TuneOptions


class _SlowPeer(DistContext):
    """Rank 0 of 2 whose peer answers round 0 only once rank 0 has started round 1's graph."""

    def __init__(self, started_next: threading.Event, fail_at: int | None = None) -> None:
        super().__init__(0, 2, 0, "cpu", "gloo", 5.0)
        self.started_next, self.fail_at, self.rounds = started_next, fail_at, 0
        self.waited_ok: list[bool] = []

    def all_gather(self, payload: Any) -> list[Any]:
        if self.rounds == 0:
            self.waited_ok.append(self.started_next.wait(5.0))
        if self.rounds == self.fail_at:
            raise RuntimeError("Connection closed by peer")
        index = payload["index"] + 1 if payload is not None else None
        self.rounds += 1
        peer = None
        if index is not None:
            peer = report_to_payload(
                index, GraphTuneReport(graph_name=f"g{index}", source=f"g{index}.json")
            )
        return [payload, peer]

    def broadcast(self, payload: Any, src: int = 0) -> Any:
        return payload  # rank 0's write outcomes, as every rank receives them


def _sources(n: int) -> list[tuple[str, Any]]:
    return [(f"g{i}.json", ValueError(f"graph {i}")) for i in range(n)]


def _tune(started_next: threading.Event) -> Any:
    def tune_one(source: str, item: Any, handle: Any, options: TuneOptions) -> GraphTuneReport:
        if source == "g2.json":
            started_next.set()
        return GraphTuneReport(graph_name=Path(source).stem, source=source, error="x")

    return tune_one


def test_next_graph_is_tuned_while_the_gather_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    started_next = threading.Event()
    monkeypatch.setattr(library, "_tune_one", _tune(started_next))
    ctx = _SlowPeer(started_next)
    seen: list[str] = []
    out = library._tune_graph_sharded(
        _sources(6),
        ctx,
        None,
        TuneOptions(),
        Writer(None, False),
        lambda r: seen.append(r.graph_name),
    )
    assert ctx.waited_ok == [True]  # rank 0 tuned g2 before round 0's gather returned
    assert seen == [f"g{i}" for i in range(6)]  # reports still arrive in the graphs' order
    assert [r.graph_name for r in out.reports] == seen


def test_failed_gather_stops_the_rank_with_the_collective_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started_next = threading.Event()
    monkeypatch.setattr(library, "_tune_one", _tune(started_next))
    ctx = _SlowPeer(started_next, fail_at=1)
    with pytest.raises(library.DistributedTuneError, match=r"graphs 2\.\.3"):
        library._tune_graph_sharded(
            _sources(6), ctx, None, TuneOptions(), Writer(None, False), lambda r: None
        )
