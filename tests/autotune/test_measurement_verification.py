"""Issue 8, bullet 1: a wrong answer never wins, whatever the measurement settings."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from autotune_helpers import Pack, by_name, tune

import dnntune as dt
from dnntune import testing
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_WRONG, FakeEngines


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"cache_mode": "cold"},
        {"ranking_metric": "device"},
        {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 5},
        {"candidate_timeout_s": 30.0},
        {"recheck_within": 0.5},
    ],
    ids=["default", "cold", "device", "fixed", "watchdog", "wide-recheck"],
)
def test_wrong_but_fastest_never_wins(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # cold mode without allocating a real flush buffer
    monkeypatch.setattr("dnntune.backend.cache_flush.CacheFlusher", _NoFlush)
    for seed in range(5):
        with testing.fake_engines(
            names=[FAKE_ENGINE_WRONG, FAKE_ENGINE_A, FAKE_ENGINE_C], noise=0.05, seed=seed
        ):
            h = dt.create_handle("cpu")
            g = testing.small_pointwise_graph()
            g.build_operation_graph(h)
            g.add_all_engines()
            results = tune(g, h, testing.make_pack(g), **config)
            wrong = by_name(results)[FAKE_ENGINE_WRONG]
            assert results[0].engine_name == FAKE_ENGINE_A
            assert not wrong.succeeded and wrong.verified is False
            assert "failed verification" in wrong.error_message
            assert wrong.failure_kind == "verification"
            assert wrong.max_abs_error == pytest.approx(1.0)


def test_exhaustive_sweep_never_keeps_the_wrong_engine(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    results, _ = graph.autotune_exhaustive_sweep(handle, pack)
    assert results[0].engine_name != FAKE_ENGINE_WRONG
    assert not by_name(results)[FAKE_ENGINE_WRONG].succeeded


def test_reference_runs_once_per_autotune_call(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune import reference

    real = reference.run
    callers: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        callers.append(inspect.stack()[1].function)
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "run", spy)
    graph.add_all_engines()
    tune(graph, handle, pack)
    # the fakes compute their outputs with reference.run too (from FakeEngine.run)
    assert callers.count("_reference") == 1


def test_every_candidate_writes_fresh_outputs(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    y = graph.output_tensors()[0]
    assert y.uid is not None
    seen: list[int] = []
    real = fakes[FAKE_ENGINE_C].run

    def record(plan: Any, p: Any, workspace: Any) -> None:
        seen.append(p[y.uid].data_ptr())
        real(plan, p, workspace)

    fakes[FAKE_ENGINE_C].run = record  # type: ignore[method-assign,assignment]
    graph.add_engines([FAKE_ENGINE_C])
    tune(graph, handle, pack)
    # the verification run wrote into its own buffer, the timed runs into the caller's
    assert seen[0] != pack[y.uid].data_ptr()
    assert all(ptr == pack[y.uid].data_ptr() for ptr in seen[1:])


class _NoFlush:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def flush(self) -> None:
        return None
