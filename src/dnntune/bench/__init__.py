"""``dnntune bench``: OOTB rows per graph and engine, the ``--oracle`` comparison, results.

Public here (the package's exports): the runner and its configuration and results, and the
bench row's timing record (:func:`time_callable` with :class:`TimingOptions`, giving a
:class:`PlanTiming` of device time and host submit time) and a graph's roofline metrics
(:func:`graph_metrics`), for suites of one's own (``benchmarks/run.py``).
"""

from dnntune.bench.config import BenchConfig, BenchConfigError, load_toml
from dnntune.bench.metrics import GraphMetrics, graph_metrics
from dnntune.bench.results import SCHEMA_VERSION, SuiteResult
from dnntune.bench.runner import BenchRunner
from dnntune.bench.timing import PlanTiming, TimingOptions, time_callable

__all__ = [
    "SCHEMA_VERSION",
    "BenchConfig",
    "BenchConfigError",
    "BenchRunner",
    "GraphMetrics",
    "PlanTiming",
    "SuiteResult",
    "TimingOptions",
    "graph_metrics",
    "load_toml",
    "time_callable",
]
