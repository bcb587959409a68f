"""measure.sampling and measure.rounds: steady sampling and interleaved rounds over callables."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dnntune.measure import (
    RESAMPLE_WARM_RUNS,
    Rounds,
    interleaved_rounds,
    steady_sample,
    steady_samples,
)


def _counter(values: list[float], log: list[str], name: str) -> Callable[[], float]:
    it: Iterator[float] = iter(values)

    def sample() -> float:
        log.append(name)
        return next(it)

    return sample


# ---- steady_samples -------------------------------------------------------------------------
def test_warm_up_then_synchronize_then_count_samples() -> None:
    log: list[str] = []
    out = steady_samples(
        _counter([1.0, 2.0, 3.0], log, "sample"),
        3,
        warm=lambda: log.append("warm"),
        warm_runs=2,
        synchronize=lambda: log.append("sync"),
    )
    assert log == ["warm", "warm", "sync", "sample", "sample", "sample"]
    assert out.samples_ms == [1.0, 2.0, 3.0] and not out.capped


def test_samples_until_min_total_and_capped() -> None:
    out = steady_samples(lambda: 1.0, 2, min_total_ms=5.0, max_count=10)
    assert out.samples_ms == [1.0] * 5 and not out.capped
    capped = steady_samples(lambda: 1.0, 2, min_total_ms=50.0, max_count=4)
    assert capped.samples_ms == [1.0] * 4 and capped.capped
    # the cap never goes below the count
    assert len(steady_samples(lambda: 1.0, 6, max_count=2).samples_ms) == 6


def test_stop_ends_sampling_early() -> None:
    out = steady_samples(lambda: 9.0, 5, stop=lambda s: s[0] > 4.0)
    assert out.samples_ms == [9.0] and not out.capped


def test_steady_sample_settles_first() -> None:
    log: list[str] = []
    ms = steady_sample(_counter([7.0], log, "sample"), lambda: log.append("warm"))
    assert ms == 7.0 and log == ["warm"] * RESAMPLE_WARM_RUNS + ["sample"]


# ---- interleaved_rounds ---------------------------------------------------------------------
def test_rounds_interleave_and_rotate() -> None:
    log: list[str] = []
    samplers = {k: _counter([1.0] * 3, log, k) for k in "abc"}
    r = interleaved_rounds(samplers, 3)
    assert log == list("abc" * 3) and r.rounds == 3 and r.samples_ms["b"] == [1.0] * 3
    log.clear()
    interleaved_rounds({k: _counter([1.0] * 3, log, k) for k in "abc"}, 3, rotate=True)
    assert log == list("abcbcacab")


def test_keep_drops_candidates_and_done_stops() -> None:
    log: list[str] = []
    samplers = {"fast": _counter([1.0] * 5, log, "fast"), "slow": _counter([9.0] * 5, log, "slow")}

    def cut(r: Rounds[str]) -> list[str]:
        return [k for k in r.live if r.samples_ms[k][0] < 5.0]

    r = interleaved_rounds(samplers, 5, keep=cut, done=lambda r: r.rounds == 3)
    assert log == ["fast", "slow", "fast", "fast"]
    assert r.live == ["fast"] and r.rounds == 3 and r.samples_ms["slow"] == [9.0]


def test_catch_keeps_the_others_going_and_without_it_raises() -> None:
    def broken() -> float:
        raise RuntimeError("out of resources")

    r = interleaved_rounds({"ok": lambda: 1.0, "bad": broken}, 3, catch=True)
    assert r.samples_ms == {"ok": [1.0] * 3, "bad": []}
    assert isinstance(r.errors["bad"], RuntimeError) and r.live == ["ok"]
    with pytest.raises(RuntimeError, match="out of resources"):
        interleaved_rounds({"ok": lambda: 1.0, "bad": broken}, 3)


def test_no_rounds_and_no_live_candidates() -> None:
    assert interleaved_rounds({"a": lambda: 1.0}, 0).samples_ms == {"a": []}
    r = interleaved_rounds({"a": lambda: 1.0}, 9, keep=lambda r: [])
    assert r.rounds == 1 and r.live == []
