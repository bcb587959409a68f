"""What tuning leaves behind for the next run, and the policy that reads it.

* :mod:`~dnntune.overrides.format` -- the engine-override config file (RFC 0013 section 6.5),
  v1 and v2, parse and serialize;
* :mod:`~dnntune.overrides.match` -- match keys and the reader's matching rules (-1 wildcards);
* :mod:`~dnntune.overrides.writer` -- ``write_autotune_winner`` (locked, atomic, recovering);
* :mod:`~dnntune.overrides.exact_cache` -- the exact-match ranking cache of exhaustive sweeps;
* :mod:`~dnntune.overrides.policy` -- ``SelectionHeuristic::Config``: cache, then file;
* :mod:`~dnntune.overrides.file_cache` -- override files parsed once per state of the file;
* :mod:`~dnntune.overrides.merge` -- merge and describe files (``dnntune overrides``);
* :mod:`~dnntune.overrides.batch` -- the batch dimension: generalized entries, batch-free keys;
* :mod:`~dnntune.overrides.plan_serialization` -- full restoration of a winning plan;
* :mod:`~dnntune.overrides.store` -- file locks and atomic replacement.
"""

from __future__ import annotations

from dnntune.overrides.format import OverrideEntry, OverrideFile, TensorPattern, load_file
from dnntune.overrides.merge import EntryRow, MergeConflict, MergeReport, describe_file, merge_files
from dnntune.overrides.plan_serialization import deserialize_plan, serialize_plan
from dnntune.overrides.policy import ConfigPolicy, match_override_file
from dnntune.overrides.writer import write_autotune_winner

__all__ = [
    "ConfigPolicy",
    "EntryRow",
    "MergeConflict",
    "MergeReport",
    "OverrideEntry",
    "OverrideFile",
    "TensorPattern",
    "describe_file",
    "deserialize_plan",
    "load_file",
    "match_override_file",
    "merge_files",
    "serialize_plan",
    "write_autotune_winner",
]
