"""The kernels ``dnntune.torch`` has built in this process (one per call signature, policy and
settings) and its counters (:data:`runtime_stats`, ``dnntune.torch.runtime_stats``)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

from dnntune.backend.knobs import KnobSetting
from dnntune.torch._memo import native_memo
from dnntune.torch.kernel import Kernel

__all__ = ["KernelCache", "counting", "runtime_stats", "tally"]


@dataclass
class _Stats:
    autotune_calls: int = 0
    plans_built: int = 0
    tuning_time_ms: float = 0.0
    decisions: dict[str, str] = field(default_factory=dict)
    #: tuned layers whose best other plan did not beat the heuristic plan beyond noise, so the
    #: heuristic plan was kept (autotune()'s confirmation, ``dnntune.autotune.confirm``)
    kept_heuristic: int = 0
    #: heuristic plans that failed verification on their first call (PyTorch's op runs them)
    heuristic_rejected: int = 0
    #: override-file plans that failed verification here on their first call (decided again)
    stored_rejected: int = 0
    #: signatures "tune" did not tune because a :func:`tuning_budget` was spent
    budget_skipped: int = 0
    #: of those, the ones where the heuristic plan beat PyTorch's op in the short race
    budget_heuristic: int = 0
    #: new signatures "tune" did not tune: an optimized model's shapes kept changing
    #: (:mod:`dnntune.torch._changing_shapes`)
    changing_untuned: int = 0
    #: wall ms of first sights of signatures (choosing, building and checking their plans;
    #: the searches of ``tuning_time_ms`` and the races of ``race_time_ms`` included)
    build_time_ms: float = 0.0
    #: wall ms of the budget's short races (:func:`dnntune.torch._budget.race`)
    race_time_ms: float = 0.0


runtime_stats = _Stats()

#: the counts of the :func:`counting` block running in this thread (None: none)
_counts: contextvars.ContextVar[_Stats | None] = contextvars.ContextVar(
    "dnntune_torch_counts", default=None
)


def tally(name: str, amount: float = 1) -> None:
    """Add ``amount`` to the counter ``name`` of :data:`runtime_stats` and of the
    :func:`counting` block running in this thread, if any (first sights only: never a hot
    path)."""
    setattr(runtime_stats, name, getattr(runtime_stats, name) + amount)
    own = _counts.get()
    if own is not None:
        setattr(own, name, getattr(own, name) + amount)


@contextlib.contextmanager
def counting() -> Iterator[_Stats]:
    """Counters of what this thread builds, tunes and races inside the block, beside the
    process's :data:`runtime_stats` (``optimize``'s report: read as the difference of the
    process's counters, it counted what another thread built meanwhile, another ``optimize``
    or a model being served; concurrency audit)."""
    own = _Stats()
    token = _counts.set(own)
    try:
        yield own
    finally:
        _counts.reset(token)


class KernelCache:
    """A bounded LRU of kernels, safe for concurrent callers (one build per key)."""

    def __init__(self) -> None:
        self._items: OrderedDict[Hashable, Kernel] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}
        #: tuned decisions of this process: (graph key, device key, config.tuning_key) ->
        #: (engine id, knobs)
        self.decisions: dict[tuple[str, str, Hashable], tuple[int, tuple[KnobSetting, ...]]] = {}
        if hasattr(os, "register_at_fork"):
            own = weakref.ref(self)

            def after_fork_in_child() -> None:
                cache = own()
                if cache is not None:
                    cache.reset_after_fork()

            os.register_at_fork(after_in_child=after_fork_in_child)

    def reset_after_fork(self) -> None:
        """In a child process just forked (a DataLoader worker, ``multiprocessing``'s fork):
        the locks taken by the parent's other threads are copied held, and those threads are
        not in the child, so nothing would release them. A kernel another thread was building
        at the fork (its key's lock held for the whole build: a tune takes seconds) hung every
        call of that signature in the child for good (concurrency audit). The child starts
        with fresh locks and builds such a kernel itself; the kernels already built are kept."""
        self._lock = threading.Lock()
        self._building = {}

    def get(self, key: Hashable, capacity: int, build: Callable[[], Kernel]) -> Kernel:
        # Hot path without the lock: OrderedDict's get and move_to_end run under the GIL; a
        # concurrent eviction between the two only costs this call its LRU refresh.
        kernel = self._items.get(key)
        if kernel is not None:
            with contextlib.suppress(KeyError):
                self._items.move_to_end(key)
            return kernel
        with self._lock:
            kernel = self._items.get(key)
            if kernel is not None:
                self._items.move_to_end(key)
                return kernel
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                kernel = self._items.get(key)
            if kernel is None:
                start = time.perf_counter()
                try:
                    kernel = build()
                finally:
                    tally("build_time_ms", (time.perf_counter() - start) * 1e3)
            with self._lock:
                self._items[key] = kernel
                self._items.move_to_end(key)
                while len(self._items) > capacity:
                    self._items.popitem(last=False)
                self._building.pop(key, None)
        return kernel

    def snapshot(self) -> list[tuple[Hashable, Kernel]]:
        """The kernels held now, with their keys, least recently used first."""
        with self._lock:
            return list(self._items.items())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.decisions.clear()
        native_memo.clear()

    def __len__(self) -> int:
        return len(self._items)
