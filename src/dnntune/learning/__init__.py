"""Learning an engine ranking from tuning history (``HeuristicMode.B``, issue 25 item 3).

* :mod:`~dnntune.learning.sources` -- training records from the files tuning leaves behind:
  finds the files and hands each to its reader, :mod:`~dnntune.learning.bench_results`,
  :mod:`~dnntune.learning.tune_reports`, :mod:`~dnntune.learning.override_history` (override
  files and the exact-match cache) or a records file; graphs through
  :mod:`~dnntune.learning.graph_index`, shared field checks in
  :mod:`~dnntune.learning.source_fields`;
* :mod:`~dnntune.learning.records` -- the record, merging repeated measurements, the records
  file;
* :mod:`~dnntune.learning.training` -- records to a model (:mod:`dnntune.backend.learned`);
* :mod:`~dnntune.learning.evaluation` -- grouped K-fold against the static order.

``dnntune heuristics train`` and ``dnntune heuristics show`` are the command line for it.
"""

from __future__ import annotations

from dnntune.learning.evaluation import Case, Evaluation, evaluate, grouped_folds
from dnntune.learning.records import (
    MergedProblem,
    Record,
    merge,
    order_record,
    read_records_file,
    write_records_file,
)
from dnntune.learning.sources import Collected, collect, default_paths
from dnntune.learning.training import save_model, train

__all__ = [
    "Case",
    "Collected",
    "Evaluation",
    "MergedProblem",
    "Record",
    "collect",
    "default_paths",
    "evaluate",
    "grouped_folds",
    "merge",
    "order_record",
    "read_records_file",
    "save_model",
    "train",
    "write_records_file",
]
