"""The learned engine ranking behind ``HeuristicMode.B``: problem features, model file, predict.

* :mod:`~dnntune.backend.learned.problem` -- what the model knows of a graph (op, data type,
  layout, key sizes, epilogue) and the device class;
* :mod:`~dnntune.backend.learned.features` -- the named feature vector and its distance;
* :mod:`~dnntune.backend.learned.model` -- the versioned JSON model file (never pickle),
  loading, caching, where it is found (``DNNTUNE_HEUR_MODEL_PATH`` or the shipped model);
* :mod:`~dnntune.backend.learned.predict` -- the k-nearest-neighbour ranking, or a decline.

It lives in ``backend/`` beside static ordering because the policy chain asks it at plan time;
training it from tuning history is :mod:`dnntune.learning` (a layer above ``overrides/``, whose
files it reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnntune.backend.learned.model import (
    DEFAULT_MODEL,
    FORMAT,
    Group,
    ModelParams,
    Point,
    RankingModel,
    cached_model,
    load_model,
    model_path,
)
from dnntune.backend.learned.predict import Decline, Neighbour, Prediction, predict
from dnntune.backend.learned.problem import (
    Problem,
    TensorInfo,
    device_class,
    op_class_of,
    problem_from_tensors,
    problem_of,
)

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph

__all__ = [
    "DEFAULT_MODEL",
    "FORMAT",
    "Decline",
    "Group",
    "ModelParams",
    "Neighbour",
    "Point",
    "Prediction",
    "Problem",
    "RankingModel",
    "TensorInfo",
    "cached_model",
    "device_class",
    "load_model",
    "model_path",
    "op_class_of",
    "predict",
    "problem_from_tensors",
    "problem_of",
    "rank_engines",
]


def rank_engines(
    graph: OpGraph,
    device_signature: Mapping[str, Any],
    candidates: Sequence[str],
    path: str | Path | None = None,
) -> tuple[Prediction | Decline, Path | None]:
    """Rank ``candidates`` (engine names in the static order) for ``graph`` on a device.

    ``path`` None: :func:`model_path`. Returns the prediction (or the decline) and the model
    file used (None: no model configured or shipped).

    Raises:
        ConfigFileError: the model file is unreadable, corrupt or of another version.
    """
    p = Path(path) if path is not None else model_path()
    if p is None:
        return Decline("no model: DNNTUNE_HEUR_MODEL_PATH is unset and none is shipped"), None
    model = cached_model(p)
    name = str(device_signature.get("name") or device_signature.get("type") or "unknown")
    return predict(model, problem_of(graph), device_class(name), candidates), p
