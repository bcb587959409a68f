"""measure.clocks (which clock, launches per sample, the host clock), measure.flush and the
SampleStats file format that bench results keep."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest
import torch

from dnntune.measure import (
    SampleStats,
    cold_flush,
    device_clock,
    device_sample,
    host_ms,
    latency_sample,
    repeats_for,
    summarize,
    throughput_sample,
)


class _Timer:
    kind = "fake"

    def __init__(self, log: list[str], device: bool = False) -> None:
        self.log = log
        if device:
            self.device_time_ms = self._device

    def synchronize(self) -> None:
        self.log.append("sync")

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        for _ in range(repeats):
            fn()
        self.log.append(f"time x{repeats}")
        return 2.0

    def _device(self, fn: Callable[[], object], repeats: int = 1) -> float:
        for _ in range(repeats):
            fn()
        self.log.append(f"device x{repeats}")
        return 1.0


def test_samples_flush_then_synchronize_outside_the_span() -> None:
    log: list[str] = []
    timer = _Timer(log, device=True)
    flush = lambda: log.append("flush")  # noqa: E731
    assert latency_sample(timer, lambda: None, flush) == 2.0
    assert device_sample(timer, lambda: None, 4, flush) == 1.0
    assert throughput_sample(timer, lambda: None, 8) == 2.0
    assert log == ["flush", "sync", "time x1", "flush", "sync", "device x4", "sync", "time x8"]


def test_device_clock_falls_back_to_the_call_clock() -> None:
    log: list[str] = []
    assert device_clock(_Timer(log))(lambda: None, 1) == 2.0
    assert device_clock(_Timer(log, device=True))(lambda: None, 1) == 1.0


def test_host_ms_is_the_mean_per_call() -> None:
    assert host_ms(lambda: time.sleep(0.002), 3) >= 2.0


@pytest.mark.parametrize(
    ("probe", "span", "lo", "hi", "want"),
    [(0.3, 1.0, 1, 1000, 4), (2.0, 1.0, 1, 1000, 1), (2.0, 0.5, 8, 99, 8), (1e-9, 1.0, 1, 50, 50)],
)
def test_repeats_for(probe: float, span: float, lo: int, hi: int, want: int) -> None:
    assert repeats_for(probe, span, lo=lo, hi=hi) == want


@pytest.mark.parametrize("probe", [0.0, -1.0, math.nan, math.inf])
def test_repeats_for_an_unreadable_probe_is_the_most(probe: float) -> None:
    assert repeats_for(probe, 1.0, hi=7) == 7


def test_cold_flush_only_in_cold_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []

    class Flusher:
        def __init__(self, device: object) -> None:
            made.append(device)

        def flush(self) -> None:
            return None

    monkeypatch.setattr("dnntune.backend.cache_flush.CacheFlusher", Flusher)
    assert cold_flush(torch.device("cpu"), "warm") is None
    assert cold_flush(torch.device("cpu"), "cold") is not None
    assert made == [torch.device("cpu")]


def test_stats_keep_the_bench_results_keys() -> None:
    s = summarize([float(i) for i in range(1, 21)])
    d = s.to_dict()
    assert list(d) == [
        "n",
        "mean_ms",
        "median_ms",
        "std_ms",
        "cov",
        "min_ms",
        "p25_ms",
        "p75_ms",
        "p95_ms",
        "max_ms",
        "iqr_ms",
    ]
    assert (d["n"], d["std_ms"]) == (s.count, s.stddev_ms) == (s.n, s.std_ms)
    back = SampleStats.from_dict(d)
    assert back.to_dict() == d and back.robust_mean_ms == 0.0
    assert s.robust_mean_ms == pytest.approx(10.5)
    assert s.iqr_pct == pytest.approx(100.0 * s.iqr_ms / s.median_ms)


@pytest.mark.parametrize("probe", [5e-324, 1e-310, 1e-300])
def test_repeats_for_a_tiny_probe_is_the_most_not_an_overflow(probe: float) -> None:
    # span / probe overflowed to inf and math.ceil(inf) raised OverflowError
    assert repeats_for(probe, 0.25, hi=8) == 8
    assert repeats_for(probe, 0.5, lo=8, hi=1000) == 1000
