"""CUDNN_ENGINE's search timing on a fake clock (no GPU): the screening round's warm-up, cut-off
and median, and the interleaved final round of the fastest few plus cuDNN's first choice."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from dnntune.providers.cudnn import search, selection


class _Clock:
    """Plan ``i`` takes ``ms[i]`` per run; records runs, synchronizes and timed spans."""

    kind = "fake"

    def __init__(self, ms: dict[int, float]) -> None:
        self.ms = ms
        self.log: list[tuple[str, int]] = []
        self.last = -1

    def synchronize(self) -> None:
        self.log.append(("sync", self.last))

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        for _ in range(repeats):
            fn()
        self.log.append(("timed", self.last))
        return self.ms[self.last]


def _setup(ms: dict[int, float]) -> tuple[_Clock, Any, Any, Callable[[int], Callable[[], None]]]:
    clock = _Clock(ms)
    handle = types.SimpleNamespace(timer=clock, synchronize=clock.synchronize)
    problem = types.SimpleNamespace(name_at=lambda i: f"eng{i}")

    def runner(index: int) -> Callable[[], None]:
        def run() -> None:
            clock.last = index
            clock.log.append(("run", index))

        return run

    return clock, handle, problem, runner


def test_screen_warms_up_samples_and_cuts_off_far_slower_plans() -> None:
    clock, handle, problem, runner = _setup({0: 1.0, 1: 10.0, 2: 0.9})
    timings = search._screen([(0, 0), (1, 0), (2, 0)], problem, handle, runner)
    assert [len(t.samples_ms) for t in timings] == [search.SAMPLES, 1, search.SAMPLES]
    assert [t.median_ms for t in timings] == [1.0, 10.0, 0.9]
    # untimed warm runs before the first timed span; more before the first plan (clocks up)
    warm_0 = search.WARMUP_RUNS + search.CLOCK_WARMUP_RUNS
    assert clock.log[:warm_0] == [("run", 0)] * warm_0 and clock.log[warm_0] == ("sync", 0)


def test_screen_records_a_failing_plan_and_goes_on() -> None:
    _clock, handle, problem, runner = _setup({0: 1.0})

    def breaking(index: int) -> Callable[[], None]:
        if index == 1:

            def boom() -> None:
                raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")

            return boom
        return runner(index)

    timings = search._screen([(0, 0), (1, 0)], problem, handle, breaking)
    assert timings[0].ok and not timings[1].ok and "EXECUTION_FAILED" in timings[1].error


def test_final_round_interleaves_the_fastest_and_cudnns_first_choice() -> None:
    ms = {i: 1.0 + 0.1 * i for i in range(6)}
    ms[0] = 2.0  # cuDNN's first choice, slowest: still in the final
    clock, handle, problem, runner = _setup(ms)
    timings = search._screen([(i, 0) for i in range(6)], problem, handle, runner)
    clock.log.clear()
    search._final_round(timings, handle, runner)
    timed = [i for kind, i in clock.log if kind == "timed"]
    assert timed == [1, 2, 3, 4, 0] * search.FINAL_SAMPLES
    assert [t.round for t in timings] == [2, 2, 2, 2, 2, 1]
    assert all(len(t.samples_ms) == search.FINAL_SAMPLES for t in timings if t.round == 2)


class _GatedClock(_Clock):
    """A timer with a device clock: plan ``i`` runs ``ms[i]`` on the device, but a call span
    of back-to-back runs measures the host's launch cost ``host[i]`` when that is longer (a
    kernel shorter than its launch)."""

    def __init__(self, device: dict[int, float], host: dict[int, float]) -> None:
        super().__init__(device)
        self.host = host
        self.clocks: list[str] = []

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        for _ in range(repeats):
            fn()
        self.clocks.append("call")
        return max(self.ms[self.last], self.host[self.last])

    def device_time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        for _ in range(repeats):
            fn()
        self.clocks.append("device")
        return self.ms[self.last]


def test_the_search_ranks_plans_on_the_device_clock_where_the_timer_has_one() -> None:
    """cuDNN's first choice (plan 0) is the faster kernel, 14 against 27 us, but costs more to
    launch (35 us): timed on the call clock the search took plan 1 (as on the H200 in session
    23, 1x1 convs); on the device clock it keeps plan 0."""
    clock = _GatedClock({0: 0.014, 1: 0.027}, host={0: 0.035, 1: 0.025})
    handle = types.SimpleNamespace(timer=clock, synchronize=clock.synchronize)
    problem = types.SimpleNamespace(name_at=lambda i: f"eng{i}")

    def runner(index: int) -> Callable[[], None]:
        def run() -> None:
            clock.last = index

        return run

    timings = search._screen([(0, 0), (1, 0)], problem, handle, runner)
    search._final_round(timings, handle, runner)
    assert selection._winner([t for t in timings if t.ok]).index == 0
    assert clock.clocks and set(clock.clocks) == {"device"}
