"""``fake_engines()``: register the fake engines and the fake timer for one block.

``isolate=True`` tunes in a worker process, which does not see engines registered in this
process. :meth:`FakeEngines.worker_config` returns the two AutotuneConfig fields that make the
worker install the same fakes (same names, timing script, noise seed and the clock's
``busy_share`` as it is when the config is made)::

    with testing.fake_engines(names=[testing.FAKE_ENGINE_CRASHES, testing.FAKE_ENGINE_C]) as f:
        config = dt.AutotuneConfig(isolate=True, **f.worker_config())
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.engine import engine_id
from dnntune.backend.handle import Handle, timer_override
from dnntune.backend.registry import get_registry
from dnntune.testing.engines import ALL_FAKE_ENGINES, FakeEngine, make_fake_engines
from dnntune.testing.timing import FakeClock, FakeCounters, FakeTimer, FakeTimings, Timing

__all__ = ["WORKER_SETUP", "FakeEngines", "fake_engines", "install_fake_engines"]

#: the ``AutotuneConfig.worker_setup`` hook that installs fakes in an isolate worker
WORKER_SETUP = "dnntune.testing:install_fake_engines"


@dataclass
class FakeEngines:
    """What ``fake_engines()`` yields: the engines, their clock, timing script and counters."""

    engines: dict[str, FakeEngine]
    clock: FakeClock
    timings: FakeTimings
    counters: FakeCounters
    exclusive: bool = True
    #: set when the block ends: FAKE_ENGINE_HANGS stops sleeping (abandoned threads finish)
    release: threading.Event = field(default_factory=threading.Event)

    def __getitem__(self, name: str) -> FakeEngine:
        return self.engines[name]

    def id(self, name: str) -> int:
        """The engine id of a fake engine (64-bit FNV-1a of its name)."""
        return engine_id(name)

    @property
    def ids(self) -> dict[str, int]:
        return {name: engine_id(name) for name in self.engines}

    def timer(self) -> FakeTimer:
        """A timer on this block's fake clock (handles created in the block already have one)."""
        return FakeTimer(self.clock, self.counters)

    def executions(self) -> list[str]:
        """Engine names in execution order (from the clock's event log)."""
        return [name for kind, name in self.clock.events if kind == "execute"]

    def worker_config(self) -> dict[str, Any]:
        """``worker_setup`` and ``worker_setup_args`` for ``AutotuneConfig(isolate=True)``,
        so the isolate worker registers these fakes too."""
        return {
            "worker_setup": WORKER_SETUP,
            "worker_setup_args": {
                "names": list(self.engines),
                "timings": self.timings.to_dict(),
                "exclusive": self.exclusive,
                "busy_share": self.clock.busy_share,
            },
        }


@contextlib.contextmanager
def fake_engines(
    exclusive: bool = True,
    timings: FakeTimings | Mapping[str, Timing] | None = None,
    *,
    names: Sequence[str] = ALL_FAKE_ENGINES,
    noise: float = 0.0,
    seed: int = 0,
) -> Iterator[FakeEngines]:
    """Register the fake engines for the block; handles created inside get a FakeTimer.

    Args:
        exclusive: hide every other engine (the default), so results are deterministic.
        timings: a :class:`FakeTimings`, or ``{engine name: ms}`` overriding the defaults.
        names: which fake engines to register (:data:`ALL_FAKE_ENGINES` by default; the
            opt-in failure engines, ``OPT_IN_FAKE_ENGINES``, only when named here).
        noise: relative Gaussian noise on every timing (when ``timings`` is not a FakeTimings).
        seed: seed of that noise.

    Example::

        with dnntune.testing.fake_engines() as fakes:
            handle = dnntune.create_handle("cpu")      # its timer reads the fake clock
            ...
            assert fakes.counters.executes["FAKE_ENGINE_A"] > 0
    """
    if not isinstance(timings, FakeTimings):
        timings = FakeTimings(timings, noise=noise, seed=seed)
    clock = FakeClock()
    counters = FakeCounters()
    release = threading.Event()
    all_engines = make_fake_engines(clock, timings, counters, release)
    unknown = [n for n in names if n not in all_engines]
    if unknown:
        raise ValueError(f"unknown fake engine(s) {unknown}; choose from {sorted(all_engines)}")
    engines = {n: all_engines[n] for n in names}
    fakes = FakeEngines(engines, clock, timings, counters, exclusive, release)

    def factory(handle: Handle) -> FakeTimer:
        return FakeTimer(clock, counters)

    try:
        with (
            get_registry().extra_engines(list(engines.values()), exclusive=exclusive),
            timer_override(factory),
        ):
            yield fakes
    finally:
        release.set()


_INSTALLED = contextlib.ExitStack()


def install_fake_engines(
    names: Sequence[str],
    timings: Mapping[str, Any],
    exclusive: bool = True,
    busy_share: float = 0.0,
) -> FakeEngines:
    """Register fakes for the rest of this process (the isolate worker's setup hook).

    Args:
        names: the fake engines to register.
        timings: a timing script as :meth:`FakeTimings.to_dict` writes it.
        exclusive: hide every other engine.
        busy_share: the fake clock's ``busy_share`` (a busy CPU, scripted, in the worker too).
    """
    fakes = _INSTALLED.enter_context(
        fake_engines(exclusive, FakeTimings.from_dict(timings), names=names)
    )
    fakes.clock.busy_share = busy_share
    return fakes
