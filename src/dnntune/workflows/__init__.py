"""Workflows: what the CLI does with one graph, as library calls above the ``Graph`` facade.

- ``tuning``: :func:`tune_graph` / :func:`tune_graphs`, one graph (or a library) of
  ``dnntune tune``: autotune into an override file, then the heuristic plan and the winner
  re-timed side by side; :func:`heuristic_plan`, the out-of-the-box plan of a graph as a value
  beside its own plans; ``tune_report``: the :class:`GraphTuneReport` it returns.
- ``heuristic_run``: :func:`run_graph`, one graph of ``dnntune run``: the heuristic plan
  executed, checked against the reference and timed.
- ``plan_timing``: :func:`time_interleaved`, finished plans timed in interleaved rounds under
  the same conditions.

``bench/``, ``distributed/`` and ``torch/`` sit beside this package; ``cli/`` sits above it.
"""

from dnntune.workflows.heuristic_run import GraphRunReport, run_graph
from dnntune.workflows.plan_timing import time_interleaved
from dnntune.workflows.tune_report import GraphTuneReport
from dnntune.workflows.tuning import (
    TuneOptions,
    confirm_plans,
    heuristic_plan,
    tune_graph,
    tune_graphs,
)

__all__ = [
    "GraphRunReport",
    "GraphTuneReport",
    "TuneOptions",
    "confirm_plans",
    "heuristic_plan",
    "run_graph",
    "time_interleaved",
    "tune_graph",
    "tune_graphs",
]
