"""A fake clock, a Timer that reads it, and scripted per-engine timings.

The fake plans advance the clock by their scripted milliseconds each time they execute; the
:class:`FakeTimer` (the :class:`~dnntune.backend.timer.Timer` protocol) reports how far the
clock moved per call. So a test decides exactly how fast each engine and knob setting is, and
autotune() measures it through the same code path it uses for real GPUs.
"""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.knobs import KnobValue

__all__ = [
    "DEFAULT_TIMINGS_MS",
    "FakeClock",
    "FakeCounters",
    "FakeTimer",
    "FakeTimings",
]

#: scripted milliseconds per fake engine at its default knobs
DEFAULT_TIMINGS_MS: dict[str, float] = {
    "FAKE_ENGINE_A": 1.0,
    "FAKE_ENGINE_B": 3.0,
    "FAKE_ENGINE_C": 2.0,
    "FAKE_ENGINE_FAILS": 0.5,
    "FAKE_ENGINE_PRIMING_FAILS": 1.1,
    "FAKE_ENGINE_WORKSPACE_GROWS": 1.2,
    "FAKE_ENGINE_WRONG": 0.1,
    # the opt-in failure engines would win if their failure went unnoticed
    "FAKE_ENGINE_HANGS": 0.05,
    "FAKE_ENGINE_OOM": 0.05,
    "FAKE_ENGINE_CRASHES": 0.05,
}

#: knob-specific defaults: (engine, knobs that must match, ms)
_DEFAULT_RULES: tuple[tuple[str, dict[str, KnobValue], float], ...] = (
    ("FAKE_ENGINE_A", {"fake.variant": 1}, 0.7),
    ("FAKE_ENGINE_A", {"fake.variant": 2}, 1.3),
    ("FAKE_ENGINE_A", {"fake.variant": 3}, 1.6),
    ("FAKE_ENGINE_B", {"fake.algorithm": "winograd"}, 1.5),
    ("FAKE_ENGINE_B", {"fake.algorithm": "fft"}, 2.0),
)

Timing = float | Sequence[float]


class FakeTimings:
    """Scripted execution time per engine and knob setting, optionally with seeded noise.

    A timing is a number of milliseconds or a sequence that is cycled, one value per execute
    (e.g. ``[10, 20]`` never stabilizes). Rules added later win over earlier ones; a rule
    matches when every knob it names has that value in the plan's resolved settings.

    Args:
        base: milliseconds per engine name at any knob setting (overrides the defaults).
        noise: relative standard deviation of multiplicative Gaussian noise (0 = exact).
        seed: seed of the noise generator (runs are reproducible).
        default_ms: time of an engine that has no entry.
    """

    def __init__(
        self,
        base: Mapping[str, Timing] | None = None,
        *,
        noise: float = 0.0,
        seed: int = 0,
        default_ms: float = 1.0,
    ) -> None:
        self._base: dict[str, Timing] = dict(DEFAULT_TIMINGS_MS)
        self._rules: list[tuple[str, dict[str, KnobValue], Timing]] = [
            (e, dict(k), ms) for e, k, ms in _DEFAULT_RULES
        ]
        self.noise = float(noise)
        self.default_ms = float(default_ms)
        self._seed = seed
        self._rng = random.Random(seed)
        self._cycles: dict[tuple[object, ...], itertools.cycle[float]] = {}
        #: milliseconds the fake clock advances per compile, by engine name (default 0)
        self.compile_ms: dict[str, float] = {}
        if base:
            for name, ms in base.items():
                self.set(name, ms)

    def set(
        self, engine: str, ms: Timing, knobs: Mapping[str, KnobValue] | None = None
    ) -> FakeTimings:
        """Script ``engine`` (at ``knobs``, or at every setting) to take ``ms``; chainable."""
        if knobs:
            self._rules.append((engine, dict(knobs), ms))
        else:
            self._base[engine] = ms
            # a new base replaces the engine's knob rules too: callers script it whole
            self._rules = [r for r in self._rules if r[0] != engine]
        self._cycles.clear()
        return self

    def set_compile(self, engine: str, ms: float) -> FakeTimings:
        """Script every compile of ``engine`` to take ``ms`` on the fake clock; chainable."""
        self.compile_ms[engine] = float(ms)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The script as plain data (for an isolate worker: :meth:`from_dict` rebuilds it with
        the noise generator at its seed)."""
        return {
            "base": {name: _plain(ms) for name, ms in self._base.items()},
            "rules": [[e, dict(k), _plain(ms)] for e, k, ms in self._rules],
            "noise": self.noise,
            "seed": self._seed,
            "default_ms": self.default_ms,
            "compile_ms": dict(self.compile_ms),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FakeTimings:
        timings = cls(noise=data["noise"], seed=data["seed"], default_ms=data["default_ms"])
        timings._base = dict(data["base"])
        timings._rules = [(e, dict(k), ms) for e, k, ms in data["rules"]]
        timings.compile_ms = dict(data.get("compile_ms", {}))
        return timings

    def lookup(self, engine: str, knobs: Mapping[str, KnobValue]) -> Timing:
        for name, wanted, ms in reversed(self._rules):
            if name == engine and all(knobs.get(k) == v for k, v in wanted.items()):
                return ms
        return self._base.get(engine, self.default_ms)

    def ms_for(self, engine: str, knobs: Mapping[str, KnobValue]) -> float:
        """The next execution time of ``engine`` with resolved ``knobs`` (noise applied)."""
        timing = self.lookup(engine, knobs)
        if isinstance(timing, int | float):
            ms = float(timing)
        else:
            key = (engine, tuple(sorted((k, str(v)) for k, v in knobs.items())))
            if key not in self._cycles:
                self._cycles[key] = itertools.cycle([float(v) for v in timing])
            ms = next(self._cycles[key])
        if self.noise:
            ms *= max(0.0, 1.0 + self._rng.gauss(0.0, self.noise))
        return ms


def _plain(ms: Timing) -> Timing:
    return float(ms) if isinstance(ms, int | float) else [float(v) for v in ms]


@dataclass
class FakeCounters:
    """How often each fake engine compiled and executed (priming plans counted separately too)."""

    compiles: collections.Counter[str] = field(default_factory=collections.Counter)
    executes: collections.Counter[str] = field(default_factory=collections.Counter)
    priming_compiles: collections.Counter[str] = field(default_factory=collections.Counter)
    priming_executes: collections.Counter[str] = field(default_factory=collections.Counter)
    syncs: int = 0

    def reset(self) -> None:
        self.compiles.clear()
        self.executes.clear()
        self.priming_compiles.clear()
        self.priming_executes.clear()
        self.syncs = 0


@dataclass
class FakeClock:
    """Fake time, and a log of what happened: ("execute", name) / ("sync", "").

    Time is kept in integer nanoseconds so that differences are exact: an engine scripted at
    0.2 ms measures exactly 0.2, however long the clock has been running.
    """

    now_ns: int = 0
    events: list[tuple[str, str]] = field(default_factory=list)
    #: keep at most this many events (tests read the tail)
    max_events: int = 100_000
    #: run-queue wait so far (``FakeTimer.cpu_wait_s``): a busy CPU, scripted
    cpu_wait_ns: int = 0
    #: the share of every advance that is also counted as waiting for a core (0: idle CPU)
    busy_share: float = 0.0

    @property
    def now_ms(self) -> float:
        return self.now_ns / 1e6

    def advance(self, ms: float) -> None:
        step = round(ms * 1e6)
        self.now_ns += step
        if self.busy_share:
            self.cpu_wait_ns += round(step * self.busy_share)

    def record(self, kind: str, name: str = "") -> None:
        if len(self.events) < self.max_events:
            self.events.append((kind, name))


class FakeTimer:
    """The Timer protocol over a :class:`FakeClock` (``kind`` "fake")."""

    kind = "fake"

    def __init__(self, clock: FakeClock, counters: FakeCounters | None = None) -> None:
        self.clock = clock
        self.counters = counters

    def synchronize(self) -> None:
        self.clock.record("sync")
        if self.counters is not None:
            self.counters.syncs += 1

    def wall_s(self) -> float:
        """The fake clock in seconds: what a tuning budget (``time_budget_s``) is charged
        against under fake engines, so budget tests are exact."""
        return self.clock.now_ns / 1e9

    def cpu_wait_s(self) -> float:
        """The fake clock's run-queue wait in seconds (``FakeClock.cpu_wait_ns``): what the
        confirmation's busy-CPU check reads under fake engines (0 unless a test sets it)."""
        return self.clock.cpu_wait_ns / 1e9

    def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        start = self.clock.now_ns
        for _ in range(repeats):
            fn()
        return (self.clock.now_ns - start) / 1e6 / max(repeats, 1)
