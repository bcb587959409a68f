"""Timing finished plans side by side, under the same conditions (seed 003's oracle discipline).

``autotune()`` ranks candidates inside its own loop; this module answers the question a user
asks afterwards: *is the tuned plan faster than what I would have got without tuning?* Both
plans are timed here, in interleaved rounds (A, B, A, B, ...) on the same buffers, with the
same warmup, the same strategy and the same cache mode, so neither is measured on a hotter
device than the other. A sample is one ``execute`` call on an idle device, host submit
included (the call latency that ``AutotuneConfig.ranking_metric="latency"`` ranks on). The
rounds, the steady-state samples and the statistics are :mod:`dnntune.measure`'s; this module
maps an :class:`~dnntune.rfc.AutotuneConfig` onto them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from dnntune.measure import (
    Rounds,
    SampleStats,
    cold_flush,
    interleaved_rounds,
    latency_sampler,
    steady_sample,
)
from dnntune.measure.stats import coefficient_of_variation
from dnntune.rfc import AutotuneConfig, AutotuneStrategy

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle

__all__ = ["time_interleaved"]

_log = logging.getLogger(__name__)


def time_interleaved(
    handle: Handle,
    runs: Mapping[str, Callable[[], object]],
    config: AutotuneConfig | None = None,
) -> dict[str, SampleStats]:
    """Time each callable in ``runs`` with ``config``'s warmup, strategy and cache mode.

    Each sample is preceded by untimed runs of the same callable, so it shows that plan's
    steady state; rounds alternate between the callables so that drift (clocks, thermals,
    other load) hits all of them alike. ``FIXED_AVERAGE`` takes ``timed_iterations`` samples
    of each; ``RUN_UNTIL_STABLE`` stops once every callable's last ``window_size`` samples have a
    coefficient of variation under ``stability_threshold``, or at ``max_iterations``.

    Args:
        handle: the handle whose timer (and device) the callables run on.
        runs: label -> a callable that executes one plan once.
        config: the AutotuneConfig the candidates were tuned with (default: its defaults).

    Returns:
        label -> the samples' statistics (min, median, mean, stddev, CoV), in milliseconds.
    """
    cfg = config or AutotuneConfig()
    flush = cold_flush(handle.device, cfg.cache_mode)
    timer = handle.timer

    def sample(fn: Callable[[], object]) -> Callable[[], float]:
        return latency_sampler(timer, fn, flush)

    def settled(fn: Callable[[], object]) -> Callable[[], float]:
        # Untimed runs of the same plan first, as autotune's re-check does: alternating single
        # samples lets one plan's leftovers (caches, allocator, library state) bias the other.
        timed = sample(fn)
        return lambda: steady_sample(timed, fn)

    # warmup rounds: samples taken the same way but without settling, and dropped
    interleaved_rounds({label: sample(fn) for label, fn in runs.items()}, cfg.warmup_iterations)
    if cfg.strategy is AutotuneStrategy.FIXED_AVERAGE:
        rounds, window, threshold = max(cfg.timed_iterations, 1), 0, 0.0
    else:
        rounds, window, threshold = (
            max(cfg.max_iterations, 1),
            max(cfg.window_size, 2),
            cfg.stability_threshold,
        )

    def stable(r: Rounds[str]) -> bool:
        return (
            bool(window)
            and r.rounds >= window
            and all(
                coefficient_of_variation(s[-window:]) < threshold for s in r.samples_ms.values()
            )
        )

    timed = interleaved_rounds(
        {label: settled(fn) for label, fn in runs.items()}, rounds, done=stable
    )
    stats = {label: SampleStats.of(s) for label, s in timed.samples_ms.items()}
    for label, st in stats.items():
        _log.debug(
            "timing %s: min %.4f ms, median %.4f ms over %d samples",
            label,
            st.min_ms,
            st.median_ms,
            st.count,
        )
    return stats
