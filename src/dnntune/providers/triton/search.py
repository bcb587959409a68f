"""The config search of a TRITON_ENGINE build: time the candidates, keep the fastest.

Memory-bound kernels (norms, reductions, pointwise) run for tens of microseconds. One event
pair around a launch or two then measures launch latency, clock ramp-up and noise more than
the kernel, and a short budget of such samples picks slow configs. So:

* every sample is a burst of back-to-back launches covering at least :data:`MIN_SAMPLE_MS`
  (:func:`sample_repeats` sizes it from a probe of :data:`PROBE_REPEATS` launches);
* the timer's device clock is used when it has one (``device_time_ms``: host gaps kept out of
  the span), its call clock otherwise;
* after an untimed warm-up (GPU clocks up), samples are taken in interleaved rounds, every
  live candidate once per round, so clock or temperature drift hits them all alike; the
  median of :data:`SAMPLES` decides;
* after the first round, candidates slower than :data:`CUTOFF_RATIO` times the best are not
  sampled further (a matmul search has forty);
* within :data:`TIE_RATIO` of the fastest, the candidate listed first wins (the solver lists
  its prior first: a tie is noise, and the prior the better bet).

Configs that fail to compile or run score infinity, as in Triton's autotuner. Pure Python over
a :class:`~dnntune.backend.timer.Timer` and one runner per config, so it is tested on any
machine with a fake clock. The clock, the sample sizing, the interleaved rounds and the median
are :mod:`dnntune.measure`'s; this module adds the search's own rules (probe, cut-off, tie).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.timer import Timer
from dnntune.measure import Rounds, device_clock, interleaved_rounds, median, repeats_for

__all__ = [
    "CLOCK_WARMUP_SAMPLES",
    "CUTOFF_RATIO",
    "MAX_REPEATS",
    "MIN_SAMPLE_MS",
    "PROBE_REPEATS",
    "SAMPLES",
    "TIE_RATIO",
    "Outcome",
    "run_search",
    "sample_repeats",
]

_log = logging.getLogger(__name__)

#: samples per candidate (medians of a few long samples beat many short ones)
SAMPLES = 5
#: shortest timed span of one sample
MIN_SAMPLE_MS = 1.0
#: most launches in one sample (a 1 us kernel still gets a 1 ms span)
MAX_REPEATS = 1000
#: launches of the probe that sizes the samples
PROBE_REPEATS = 3
#: untimed samples' worth of launches before the first round, so the clocks are up
CLOCK_WARMUP_SAMPLES = 3
#: after the first round, drop candidates this many times slower than the best
CUTOFF_RATIO = 1.5
#: medians within this ratio of the fastest count as equally fast
TIE_RATIO = 1.01

Config = dict[str, int]
Runner = Callable[[], object]


def sample_repeats(
    probe_ms: float, min_sample_ms: float = MIN_SAMPLE_MS, max_repeats: int = MAX_REPEATS
) -> int:
    """Launches per sample so that one sample spans at least ``min_sample_ms``.

    ``probe_ms`` is the per-launch time of a short probe; a probe too short to read (0, or not
    finite) gets the most launches allowed.
    """
    return repeats_for(probe_ms, min_sample_ms, hi=max_repeats)


@dataclass
class _Candidate:
    index: int
    config: Config
    runner: Runner | None = None
    repeats: int = 1
    samples_ms: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def median_ms(self) -> float:
        if self.error or not self.samples_ms:
            return math.inf
        return median(self.samples_ms)


@dataclass
class Outcome:
    """What a search found: the winner, its median, and every candidate's median."""

    config: Config
    median_ms: float
    #: candidates that were timed (compiled and ran)
    timed: int
    #: (config, median ms or inf, samples taken) per candidate, in the order given
    results: list[tuple[Config, float, int]]


def run_search(
    candidates: Sequence[Config],
    runner_for: Callable[[Config], Runner],
    timer: Timer,
    stream_context: Callable[[], AbstractContextManager[Any]],
    *,
    samples: int = SAMPLES,
    min_sample_ms: float = MIN_SAMPLE_MS,
) -> Outcome:
    """Time ``candidates`` (best guesses first) and return the fastest.

    Args:
        candidates: configs to time; the first is preferred on a tie.
        runner_for: a zero-argument launch of a config (compiles it when first called).
        timer: the handle's timer (``device_time_ms`` is used when present).
        stream_context: enters the handle's stream for the untimed warm launch.
        samples: samples per candidate.
        min_sample_ms: shortest span of one sample.

    Raises:
        RuntimeError: every candidate failed (the caller reports it).
    """
    clock = device_clock(timer)
    pool = [_Candidate(i, c) for i, c in enumerate(candidates)]
    for c in pool:  # warm (compile, first-touch) and probe each candidate
        try:
            runner = runner_for(c.config)
            with stream_context():
                runner()
            timer.synchronize()
            probe_ms = clock(runner, PROBE_REPEATS)
            c.runner, c.repeats = runner, sample_repeats(probe_ms, min_sample_ms)
        except Exception as exc:  # an expected failure of one config, as Triton scores it
            c.error = f"{type(exc).__name__}: {exc}"
            _log.info("triton search: config %s failed: %s", c.config, c.error)
    live = [c for c in pool if not c.error]
    if live:  # clocks up before the first timed sample (the first candidate is the prior)
        first = live[0]
        assert first.runner is not None
        with stream_context():
            for _ in range(CLOCK_WARMUP_SAMPLES * first.repeats):
                first.runner()
        timer.synchronize()

    def sampler(c: _Candidate) -> Callable[[], float]:
        runner = c.runner
        assert runner is not None
        return lambda: clock(runner, c.repeats)

    def cut_off(r: Rounds[int]) -> list[int]:
        """After the first round: drop the candidates far behind the best first sample."""
        if r.rounds > 1:
            return r.live
        best_first = min(r.samples_ms[i][0] for i in r.live)
        return [i for i in r.live if r.samples_ms[i][0] <= best_first * CUTOFF_RATIO]

    rounds = interleaved_rounds(
        {c.index: sampler(c) for c in live}, samples, catch=True, keep=cut_off
    )
    for c in live:
        c.samples_ms = rounds.samples_ms[c.index]
        failure = rounds.errors.get(c.index)
        if failure is not None:
            c.error = f"{type(failure).__name__}: {failure}"
            _log.info("triton search: config %s failed: %s", c.config, c.error)
    live = [c for c in live if c.index in rounds.live]
    for c in pool:
        _log.debug(
            "triton search: %s %.5f ms (%d x %d launches)",
            c.config,
            c.median_ms,
            len(c.samples_ms),
            c.repeats,
        )
    # the candidates that took every round (the cut-off ones have one sample each)
    finalists = [c for c in live if math.isfinite(c.median_ms)]
    if not finalists:
        errors = "; ".join(f"{c.config}: {c.error}" for c in pool if c.error)
        raise RuntimeError(f"every one of the {len(pool)} configs failed ({errors[:600]})")
    fastest = min(c.median_ms for c in finalists)
    winner = next(c for c in finalists if c.median_ms <= fastest * TIE_RATIO)
    return Outcome(
        config=winner.config,
        median_ms=winner.median_ms,
        timed=sum(1 for c in pool if c.samples_ms),
        results=[(c.config, c.median_ms, len(c.samples_ms)) for c in pool],
    )
