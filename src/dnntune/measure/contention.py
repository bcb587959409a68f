"""How long a process's threads waited for a CPU core: the sign that timings are not to be trusted.

On a machine with more runnable threads than cores, a timed call waits for the scheduler as
well as for its own work, and the wait comes in time slices (4 ms at the common 250 Hz tick):
on a 2-core machine with two other busy processes, a 40 µs CPU pointwise op timed at 8 ms on
one plan and 16 ms on the other for seconds at a time, a "2.0x" that an unloaded re-time put
at 0.8x (issue 21, session 17). Interleaving does not help when the slow spell lasts the whole
comparison. Linux keeps, per thread, the time it spent runnable but not running
(``/proc/<pid>/task/<tid>/schedstat``, second field, ns); its sum over a process's threads,
against the wall time of a comparison, says how much of it was waiting.

Unmeasured (not Linux, ``schedstat`` off, no such process): None, and nothing is judged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

__all__ = [
    "BUSY_WAIT_SHARE",
    "TimingWait",
    "WaitMeter",
    "busy",
    "run_queue_wait_s",
    "timer_clock",
    "timer_wait_s",
    "wait_share",
]

#: the share of a comparison's wall time the process's threads spent waiting for a core (summed
#: over threads) from which its timings are not trusted: an idle machine measures 0-1 %, a
#: 2-thread op beside two busy processes on 2 cores about 100 %
BUSY_WAIT_SHARE = 0.25


def busy(share: float | None) -> bool:
    """A measured wait share (:func:`wait_share`) at which timings are not to be trusted."""
    return share is not None and share >= BUSY_WAIT_SHARE


#: seconds a process's threads have waited for a core so far (None: unknown)
WaitMeter = Callable[[], "float | None"]


#: where the kernel's per-process files are (a test points it elsewhere)
_PROC = Path("/proc")
#: per process directory: tid -> the last run-queue wait (ns) read for it, and the wait of
#: threads seen before that have since ended (key ``-1``)
_seen: dict[str, dict[int, int]] = {}
_seen_lock = threading.Lock()
_ENDED = -1


def run_queue_wait_s(pid: int | None = None) -> float | None:
    """Seconds the threads of process ``pid`` (default: this one) have spent runnable but
    waiting for a CPU, summed; None where the kernel does not say.

    A thread that ends takes its ``schedstat`` with it; the last wait read for it stays in the
    sum, so the total never goes back and the difference of two readings
    (:func:`wait_share`) is not lowered by a helper thread's lifetime wait when it ends in
    between. (A thread that both starts and ends between two readings is not seen.)
    """
    # plain strings and raw reads: this runs around every timed sample (a few per
    # confirmation round), where pathlib's joins and resolve() cost more than the reads
    key = f"{_PROC}/{pid if pid is not None else os.getpid()}/task"
    try:
        names = os.listdir(key)
    except OSError:
        return None
    now: dict[int, int] = {}
    for name in names:
        try:
            fd = os.open(f"{key}/{name}/schedstat", os.O_RDONLY)
        except OSError:  # the thread ended meanwhile
            continue
        try:
            fields = os.read(fd, 256).split()
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(fields) >= 2 and fields[1].isdigit() and name.isdigit():
            now[int(name)] = int(fields[1])
    if not now:
        return None
    with _seen_lock:
        before = _seen.setdefault(key, {_ENDED: 0})
        ended = before[_ENDED]
        for tid, last in before.items():
            # gone, or its id now names a new thread (a wait cannot shrink)
            if tid != _ENDED and (tid not in now or now[tid] < last):
                ended += last
        now[_ENDED] = ended
        _seen[key] = now
        return sum(now.values()) / 1e9


def timer_wait_s(timer: object, pid: int | None = None) -> float | None:
    """Run-queue wait of the process timing on ``timer`` (``pid``, default this one): the
    timer's own ``cpu_wait_s`` where it has one (the fake clock's), else the kernel's."""
    own = getattr(timer, "cpu_wait_s", None)
    if own is not None:
        return cast("float | None", own())
    return run_queue_wait_s(pid)


def timer_clock(timer: object) -> Callable[[], float]:
    """Seconds on ``timer``'s own wall clock where it has one (the fake clock's ``wall_s``),
    else ``time.perf_counter``: the clock a span measured beside :func:`timer_wait_s` is on."""
    clock = getattr(timer, "wall_s", None)
    return cast("Callable[[], float]", clock) if callable(clock) else time.perf_counter


class TimingWait:
    """Run-queue wait and wall time added up over the spans that time something, and only
    those: a candidate's compile or priming (torch.compile's Inductor threads, a compile pool)
    happens outside them, so neither its waits nor its wall time enter the share.

    Two kinds of span: :meth:`span` measures one block (a candidate's first timing, which
    compiles may precede under a budget); :meth:`begin` opens a span that stays open across
    back-to-back samples (the re-check's and the confirmation's rounds) until :meth:`close`,
    or a :meth:`span`, ends it. Reading the meter costs about 0.15 ms with 17 threads (every
    thread's ``schedstat``), more than a short sample: an open span reads it when it opens and
    when :meth:`wait_s` is asked, never between two samples.

    :meth:`wait_s` and :meth:`wall_s` only grow, so ``wait_share(t.wait_s, t.wall_s)`` is the
    share over the spans added since that call (None: none measured). A span whose wait was not
    measured adds nothing, wall time included.
    """

    def __init__(self) -> None:
        self._wait_s = 0.0
        self._wall_s = 0.0
        #: the open span: its meter, its clock and their readings when it opened or was last
        #: added up (None: none open)
        self._open: tuple[WaitMeter, Callable[[], float], float | None, float] | None = None

    def wait_s(self) -> float:
        """Seconds waited for a core in the spans so far (an open span's included)."""
        self._settle()
        return self._wait_s

    def wall_s(self) -> float:
        """Wall seconds of the measured spans, an open span's up to the last :meth:`wait_s`
        (the two then describe one instant: ``wait_share`` asks the wait, then the wall)."""
        return self._wall_s

    def add(self, wait_s: float | None, wall_s: float | None) -> None:
        """One span's wait and wall time (either None, or no wall time: nothing added)."""
        if wait_s is None or wall_s is None or wall_s <= 0.0:
            return
        self._wait_s += max(wait_s, 0.0)
        self._wall_s += wall_s

    def begin(self, meter: WaitMeter, clock: Callable[[], float]) -> None:
        """Open a span now unless one is open (a sample after a sample adds to it)."""
        if self._open is None:
            self._open = (meter, clock, meter(), clock())

    def close(self) -> None:
        """Add the open span up to now and close it (what follows is not timing)."""
        self._settle()
        self._open = None

    def _settle(self) -> None:
        if self._open is None:
            return
        meter, clock, wait0, wall0 = self._open
        wait1, wall1 = meter(), clock()
        self.add(None if wait0 is None or wait1 is None else wait1 - wait0, wall1 - wall0)
        self._open = (meter, clock, wait1, wall1)

    @contextlib.contextmanager
    def span(self, meter: WaitMeter, clock: Callable[[], float]) -> Iterator[None]:
        """Measure the block on ``meter`` and ``clock`` (seconds) and add it (an open span
        is closed first)."""
        self.close()
        wait0, wall0 = meter(), clock()
        try:
            yield
        finally:
            wait1 = meter()
            waited = None if wait0 is None or wait1 is None else wait1 - wait0
            self.add(waited, clock() - wall0)


def wait_share(meter: WaitMeter, clock: Callable[[], float]) -> Callable[[], float | None]:
    """Start measuring now; the returned call gives the share of wall time (``clock``,
    seconds) since then that the threads spent waiting for a core (None: unmeasured)."""
    wait0, wall0 = meter(), clock()

    def share() -> float | None:
        wait1, wall = meter(), clock() - wall0
        if wait0 is None or wait1 is None or wall <= 0.0:
            return None
        return max(wait1 - wait0, 0.0) / wall

    return share
