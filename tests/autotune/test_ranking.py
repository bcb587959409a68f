"""Ranking (RFC 6.3, 10.2): by min_time_ms, failed last, custom and misbehaving ranking_fn."""

from __future__ import annotations

import logging

import pytest

from dnntune.autotune.ranking import by_robust_time, rank_and_say, rank_results
from dnntune.rfc import AutotuneResult


def _r(name: str, ms: float, ok: bool = True, ws: int = 0) -> AutotuneResult:
    return AutotuneResult(
        engine_name=name,
        min_time_ms=ms,
        succeeded=ok,
        workspace_size=ws,
        robust_time_ms=ms * 2 if name == "b" else ms,
    )


def _names(results: list[AutotuneResult]) -> list[str]:
    return [r.engine_name for r in results]


def test_default_sorts_by_min_time_and_puts_failed_last() -> None:
    results = [
        _r("slow", 3.0),
        _r("bad1", 0.1, ok=False),
        _r("fast", 1.0),
        _r("bad2", 0.0, ok=False),
    ]
    ranked = rank_results(results)
    assert _names(ranked) == ["fast", "slow", "bad1", "bad2"]
    assert [r.rank for r in ranked] == [0, 1, -1, -1]
    assert len(ranked) == len(results)


def test_ties_keep_benchmark_order() -> None:
    ranked = rank_results([_r("x", 1.0), _r("y", 1.0), _r("z", 0.5)])
    assert _names(ranked) == ["z", "x", "y"]


def test_custom_key() -> None:
    ranked = rank_results([_r("a", 1.0), _r("b", 0.9)], key=by_robust_time)
    assert _names(ranked) == ["a", "b"]  # b's robust time is 1.8


def test_custom_ranking_fn_by_workspace_then_speed() -> None:
    def by_workspace(results: list[AutotuneResult]) -> None:
        results.sort(key=lambda r: (r.workspace_size, r.min_time_ms))

    results = [_r("fast_big", 1.0, ws=4096), _r("slow_small", 2.0, ws=0), _r("x", 0.1, ok=False)]
    ranked = rank_results(results, by_workspace)
    assert _names(ranked) == ["slow_small", "fast_big", "x"]
    assert [r.rank for r in ranked] == [0, 1, -1]


def test_ranking_fn_receives_only_succeeded() -> None:
    seen: list[list[str]] = []
    rank_results([_r("a", 1.0), _r("f", 1.0, ok=False)], lambda rs: seen.append(_names(rs)))
    assert seen == [["a"]]


def test_throwing_ranking_fn_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    def boom(results: list[AutotuneResult]) -> None:
        results.reverse()
        raise RuntimeError("nope")

    with caplog.at_level(logging.WARNING):
        ranked = rank_results([_r("slow", 2.0), _r("fast", 1.0)], boom)
    assert _names(ranked) == ["fast", "slow"]
    assert "autotune: ranking_fn raised RuntimeError" in caplog.text


@pytest.mark.parametrize(
    "violation",
    [
        lambda rs: rs.pop(),
        lambda rs: rs.append(AutotuneResult(engine_name="intruder", succeeded=True)),
        lambda rs: rs.__setitem__(0, AutotuneResult(engine_name="copy", succeeded=True)),
        lambda rs: setattr(rs[0], "min_time_ms", 0.0),
    ],
    ids=["remove", "add", "replace", "modify"],
)
def test_contract_violation_falls_back(violation, caplog: pytest.LogCaptureFixture) -> None:
    results = [_r("slow", 2.0), _r("fast", 1.0)]
    with caplog.at_level(logging.WARNING):
        ranked = rank_results(results, violation)
    assert _names(ranked) == ["fast", "slow"]
    assert [r.min_time_ms for r in ranked] == [1.0, 2.0]  # edits undone
    assert "broke the contract" in caplog.text


def test_ranks_are_reassigned_after_callback() -> None:
    def lie(results: list[AutotuneResult]) -> None:
        results.reverse()

    ranked = rank_results([_r("a", 1.0), _r("b", 2.0)], lie)
    assert [(r.engine_name, r.rank) for r in ranked] == [("b", 0), ("a", 1)]


def test_rank_and_say_tells_whose_order_it_is() -> None:
    def boom(results: list[AutotuneResult]) -> None:
        raise RuntimeError("nope")

    assert rank_and_say([_r("a", 1.0)])[1] is False
    assert rank_and_say([_r("a", 1.0)], lambda rs: None)[1] is True
    assert rank_and_say([_r("a", 1.0)], boom)[1] is False


def test_a_ranking_fn_that_raises_leaves_a_confirmed_decision_by_the_default_ranking() -> None:
    """The fallback ranked by the decision time but logged "by min_time_ms", and the winner
    was never confirmed (``not_checked``, as if the caller had ranked)."""
    import torch

    import dnntune as dt
    from dnntune import testing as T

    def buggy(results: list[AutotuneResult]) -> None:
        raise RuntimeError("bug in the caller's comparator")

    # FAKE_ENGINE_C is the default; B's first timed sample is 0.5 ms, the others 5 ms
    timings = {T.FAKE_ENGINE_B: [5.0, 5.0, 0.5] + [5.0] * 40}
    with T.fake_engines(timings=timings, names=[T.FAKE_ENGINE_C, T.FAKE_ENGINE_A, T.FAKE_ENGINE_B]):
        handle = dt.create_handle("cpu")
        g = T.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        ws = torch.empty(T.ESTIMATED_WORKSPACE_BYTES, dtype=torch.uint8)
        config = dt.AutotuneConfig(
            ranking_fn=buggy, strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=5
        )
        results = g.autotune(handle, T.make_pack(g), ws, T.ESTIMATED_WORKSPACE_BYTES, config)
    by_name = {r.engine_name: r for r in results}
    assert by_name[T.FAKE_ENGINE_B].rank == 2  # its one lucky sample does not rank it first
    assert results[0].confirmation not in ("", "not_checked")
