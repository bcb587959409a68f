"""One measurement core: how every timing in dnntune is taken and summarized.

Autotune's timed loop and re-checks, ``dnntune bench``'s rows, plan timing in ``workflows/``,
``dnntune.torch``'s end-to-end speed check and the internal searches of TRITON_ENGINE and
CUDNN_ENGINE all measure through this package; none of them keeps a timing loop of its own.
It sits above ``backend/`` (the handle's :class:`~dnntune.backend.timer.Timer` and the cache
flusher) and below ``providers/``, so an engine's own search uses it too. It knows nothing of
plans, engines or autotune: what it times is a zero-argument callable.

- ``clocks``: the samples a timer gives (call latency, device time behind the stall gate,
  back-to-back calls, the host clock) and how many launches one sample takes.
- ``sampling``: steady sampling (warm-up, synchronize, samples until enough) and one sample in
  a candidate's own steady state.
- ``rounds``: interleaved rounds over several candidates, with cut-offs and stopping rules.
- ``flush``: the cold-cache flush.
- ``stats``: :class:`SampleStats`, the one statistics type, and its helper functions.

docs/measurement.md states the rules these implement.
"""

from dnntune.measure.clocks import (
    device_clock,
    device_sample,
    host_ms,
    latency_calls_for,
    latency_sample,
    latency_sampler,
    launches_for,
    repeats_for,
    throughput_launches_for,
    throughput_sample,
)
from dnntune.measure.flush import cold_flush
from dnntune.measure.rounds import Rounds, interleaved_rounds
from dnntune.measure.sampling import RESAMPLE_WARM_RUNS, Samples, steady_sample, steady_samples
from dnntune.measure.stats import SampleStats, median, summarize

__all__ = [
    "RESAMPLE_WARM_RUNS",
    "Rounds",
    "SampleStats",
    "Samples",
    "cold_flush",
    "device_clock",
    "device_sample",
    "host_ms",
    "interleaved_rounds",
    "latency_calls_for",
    "latency_sample",
    "latency_sampler",
    "launches_for",
    "median",
    "repeats_for",
    "steady_sample",
    "steady_samples",
    "summarize",
    "throughput_launches_for",
    "throughput_sample",
]
