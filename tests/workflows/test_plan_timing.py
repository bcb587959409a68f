"""workflows.plan_timing: interleaved timing with the autotune config's warmup and strategy."""

from __future__ import annotations

from collections.abc import Callable

import dnntune as dt
from dnntune.workflows.plan_timing import time_interleaved


class ScriptedTimer:
    """Calls the function and returns the next scripted time for it (per label)."""

    kind = "scripted"

    def __init__(self, script: dict[str, list[float]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.order: list[str] = []

    def synchronize(self) -> None:
        return None

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        label = str(fn())
        self.order.append(label)
        values = self.script[label]
        return values.pop(0) if len(values) > 1 else values[0]


def handle_with(timer: ScriptedTimer) -> dt.Handle:
    return dt.create_handle("cpu").set_timer(timer)


def test_fixed_average_interleaves_after_warmup() -> None:
    timer = ScriptedTimer({"a": [9.0, 9.0, 3.0, 2.0, 4.0], "b": [9.0, 9.0, 1.0, 1.5, 1.2]})
    config = dt.AutotuneConfig(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE, warmup_iterations=2, timed_iterations=3
    )
    stats = time_interleaved(handle_with(timer), {"a": lambda: "a", "b": lambda: "b"}, config)
    assert timer.order == ["a", "b"] * 5
    assert stats["a"].count == 3 and stats["a"].min_ms == 2.0 and stats["a"].median_ms == 3.0
    assert stats["b"].min_ms == 1.0


def test_run_until_stable_stops_when_every_label_is_stable() -> None:
    timer = ScriptedTimer({"a": [5.0, 1.0, 1.0, 1.0], "b": [1.0]})
    config = dt.AutotuneConfig(
        strategy=dt.AutotuneStrategy.RUN_UNTIL_STABLE,
        warmup_iterations=0,
        window_size=3,
        max_iterations=50,
        stability_threshold=0.05,
    )
    stats = time_interleaved(handle_with(timer), {"a": lambda: "a", "b": lambda: "b"}, config)
    assert stats["a"].count == 4  # 5, 1, 1, 1: the last three are stable
    assert stats["b"].count == 4


def test_run_until_stable_caps_at_max_iterations() -> None:
    timer = ScriptedTimer({"a": [1.0, 2.0] * 50})
    config = dt.AutotuneConfig(warmup_iterations=0, window_size=2, max_iterations=7)
    stats = time_interleaved(handle_with(timer), {"a": lambda: "a"}, config)
    assert stats["a"].count == 7


def test_cold_cache_mode_flushes_each_sample(monkeypatch) -> None:
    flushes: list[int] = []

    class CountingFlusher:
        def __init__(self, device: object) -> None:
            pass

        def flush(self) -> None:
            flushes.append(1)

    monkeypatch.setattr("dnntune.backend.cache_flush.CacheFlusher", CountingFlusher)
    timer = ScriptedTimer({"a": [1.0]})
    config = dt.AutotuneConfig(
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        warmup_iterations=1,
        timed_iterations=2,
        cache_mode="cold",
    )
    time_interleaved(handle_with(timer), {"a": lambda: "a"}, config)
    assert len(flushes) == 3
