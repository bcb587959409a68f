"""The feature vector of a problem and the distance between two of them.

Features are named, so a model file says what it compares:

* ``op`` and ``dtype``: categorical (a mismatch costs the feature's weight);
* ``log2_<dim>``: log2 of each named size (a 2x difference in one size costs 1);
* each flag (``channels_last``, ``b_transposed``, ``causal``, ...): 0 or 1;
* ``epilogue``: nodes besides the core op, 0..4.

The distance is a weighted Euclidean distance over the union of both vectors' names. A feature
one side cannot tell (None, or absent: an override entry has no data type) costs
:data:`UNKNOWN_PENALTY` of its weight, so partial knowledge is neither a free match nor a full
mismatch. The default ``op`` weight (4) exceeds the default model radius (3): problems of a
different op kind are never neighbours there. Training may choose a weight of 1 instead (by
inner K-fold, :data:`dnntune.learning.evaluation.OP_WEIGHTS`; the model file stores it), so
that kinds of one op class (layernorm and rmsnorm) can learn from each other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dnntune.backend.learned.problem import Problem

__all__ = [
    "DEFAULT_WEIGHTS",
    "FEATURE_VERSION",
    "UNKNOWN_PENALTY",
    "FeatureValue",
    "distance",
    "features",
]

#: bumped whenever :func:`features` changes meaning; a model trained under another version is
#: refused (retrain it)
FEATURE_VERSION = 1
UNKNOWN_PENALTY = 0.5
DEFAULT_WEIGHTS: dict[str, float] = {"op": 4.0, "dtype": 1.0, "epilogue": 1.0}

FeatureValue = float | str | None


def features(problem: Problem) -> dict[str, FeatureValue]:
    """The named feature vector of ``problem`` (see the module docstring)."""
    out: dict[str, FeatureValue] = {"op": problem.op, "dtype": problem.dtype}
    for name, value in problem.dims.items():
        out[f"log2_{name}"] = round(math.log2(max(value, 1)), 6)
    for name, flag in problem.flags.items():
        out[name] = float(flag)
    out["epilogue"] = None if problem.epilogue is None else float(problem.epilogue)
    return out


def distance(
    a: Mapping[str, FeatureValue],
    b: Mapping[str, FeatureValue],
    weights: Mapping[str, float] | None = None,
) -> float:
    """Weighted Euclidean distance between two feature vectors (see the module docstring)."""
    w = DEFAULT_WEIGHTS if weights is None else weights
    total = 0.0
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name), b.get(name)
        weight = w.get(name, 1.0)
        if va is None or vb is None:
            if va is not None or vb is not None:
                total += (weight * UNKNOWN_PENALTY) ** 2
            continue
        if isinstance(va, str) or isinstance(vb, str):
            if va != vb:
                total += weight**2
            continue
        total += (weight * (float(va) - float(vb))) ** 2
    return math.sqrt(total)
