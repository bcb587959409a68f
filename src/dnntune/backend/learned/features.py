"""The feature vector of a problem and the distance between two of them.

Features are named, so a model file says what it compares:

* ``op`` and ``dtype``: categorical (a mismatch costs the feature's weight);
* ``log2_<dim>``: log2 of each named size (a 2x difference in one size costs 1);
* each flag (``channels_last``, ``b_transposed``, ``causal``, ...): 0 or 1;
* ``epilogue``: nodes besides the core op, 0..4;
* ``fused`` (feature version 2): 1 when the graph has an epilogue at all, else 0 (None when
  unknown). A categorical fact, weighted like ``op``: with a fused bias/activation chain an
  engine that runs the epilogue as separate kernels (TORCH_ENGINE) is a different problem from
  the plain op (on the H200, TORCH_ENGINE is the fastest engine of 10 of 13 plain GEMMs and
  3 % to 2.1x behind the fastest on all seven fused fp16/bf16 ones), whatever the sizes.

The distance is a weighted Euclidean distance over the union of both vectors' names. A feature
one side cannot tell (None, or absent: an override entry has no data type) costs
:data:`UNKNOWN_PENALTY` of its weight, so partial knowledge is neither a free match nor a full
mismatch. The default ``op`` weight (4) exceeds the default model radius (3): problems of a
different op kind are never neighbours there. Training may choose a weight of 1 instead (by
inner K-fold, :data:`dnntune.learning.evaluation.OP_WEIGHTS`; the model file stores it), so
that kinds of one op class (layernorm and rmsnorm) can learn from each other; the ``fused``
weight follows the ``op`` weight chosen (:func:`tied_weights`).

A model stores the feature version it was trained under; one trained under version 1 (no
``fused``) is still read and compared on version 1's features (:func:`features` with
``version=1``), so its predictions do not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dnntune.backend.learned.problem import Problem

__all__ = [
    "DEFAULT_WEIGHTS",
    "FEATURE_VERSION",
    "READABLE_FEATURE_VERSIONS",
    "UNKNOWN_PENALTY",
    "FeatureValue",
    "distance",
    "features",
    "tied_weights",
]

#: bumped whenever :func:`features` changes meaning; a model trained under a version not in
#: :data:`READABLE_FEATURE_VERSIONS` is refused (retrain it)
FEATURE_VERSION = 2
#: the feature versions a model may have been trained under: 1 (no ``fused``) and 2
READABLE_FEATURE_VERSIONS = (1, 2)
UNKNOWN_PENALTY = 0.5
DEFAULT_WEIGHTS: dict[str, float] = {"op": 4.0, "fused": 4.0, "dtype": 1.0, "epilogue": 1.0}

FeatureValue = float | str | None


def features(problem: Problem, version: int = FEATURE_VERSION) -> dict[str, FeatureValue]:
    """The named feature vector of ``problem`` under feature ``version`` (see the module
    docstring; version 1 has no ``fused``)."""
    out: dict[str, FeatureValue] = {"op": problem.op, "dtype": problem.dtype}
    for name, value in problem.dims.items():
        out[f"log2_{name}"] = round(math.log2(max(value, 1)), 6)
    for name, flag in problem.flags.items():
        out[name] = float(flag)
    out["epilogue"] = None if problem.epilogue is None else float(problem.epilogue)
    if version >= 2:
        out["fused"] = None if problem.epilogue is None else float(problem.epilogue > 0)
    return out


def tied_weights(weights: Mapping[str, float], op_weight: float) -> dict[str, float]:
    """``weights`` with the ``op`` weight, and the ``fused`` weight with it, set to
    ``op_weight`` (both tell apart problems that sizes alone do not)."""
    return {**weights, "op": op_weight, "fused": op_weight}


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
