"""Train the learned ranking: merged problems become the model's points, grouped by device
class and op class. There is nothing to fit beyond that (a k-nearest-neighbour model is its
data); the parameters (k, radius, margin, confidence floor, weights) are fixed in advance and
stored with the model, and :mod:`dnntune.learning.evaluation` measures what they give on
problems the model has not seen.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dnntune.backend.heuristics import HeuristicMode, problem_preference
from dnntune.backend.learned import Group, ModelParams, Point, RankingModel
from dnntune.learning.records import MergedProblem, Record, merge
from dnntune.overrides.store import atomic_write_text

__all__ = [
    "CUDA_ONLY_ENGINES",
    "is_cuda_device",
    "points_of",
    "save_model",
    "static_pick",
    "train",
]

#: engines that run only on CUDA: a problem measured with one of them was measured on a GPU
CUDA_ONLY_ENGINES = frozenset({"CUDNN_ENGINE", "TRITON_ENGINE"})


def is_cuda_device(device_class: str, engines: Sequence[str]) -> bool:
    """Whether a record's device is a GPU (for the static order it is compared with): an
    NVIDIA device name, or a CUDA-only engine among the measured ones."""
    return device_class.startswith("nvidia") or any(e in CUDA_ONLY_ENGINES for e in engines)


def static_order_names(problem: MergedProblem, candidates: Sequence[str]) -> list[str]:
    """``candidates`` in HeuristicMode.A's order for the problem (unknown engines last, by
    name), as ``create_execution_plans`` would order them."""
    cuda = is_cuda_device(problem.device_class, candidates)
    preferred = problem_preference(problem.problem, cuda, HeuristicMode.A)
    rank = {name: i for i, name in enumerate(preferred)}
    return sorted(candidates, key=lambda e: (rank.get(e, len(rank)), e))


def static_pick(problem: MergedProblem) -> str:
    """HeuristicMode.A's first engine among those measured for ``problem``."""
    return static_order_names(problem, list(problem.ratios))[0]


def points_of(merged: Sequence[MergedProblem]) -> list[MergedProblem]:
    """The merged problems that can teach a ranking: two or more engines measured, or an
    order-only winner (a tuner chose it among the candidates)."""
    return [m for m in merged if len(m.ratios) >= 2 or m.order_only]


def _build(merged: Sequence[MergedProblem], params: ModelParams) -> RankingModel:
    groups: dict[tuple[str, str], Group] = {}
    for m in points_of(merged):
        key = (m.device_class, m.problem.op_class)
        group = groups.setdefault(key, Group(*key))
        group.points.append(
            Point(m.problem, dict(m.ratios), dict(m.configs), m.order_only, m.records, m.sources)
        )
    return RankingModel(params=params, groups=groups)


def train(
    records: Sequence[Record],
    params: ModelParams | None = None,
    sources: Sequence[str] = (),
    evaluation: dict[str, Any] | None = None,
) -> RankingModel:
    """A model of ``records`` (merged per problem and device class first)."""
    merged = merge(records)
    model = _build(merged, params or ModelParams())
    used = points_of(merged)
    model.training = {
        "records": len(records),
        "problems": len(used),
        "measured_problems": sum(1 for m in used if not m.order_only),
        "order_only_problems": sum(1 for m in used if m.order_only),
        "dropped_single_engine": len(merged) - len(used),
        "by_group": {
            f"{d}/{o}": n
            for (d, o), n in sorted(
                Counter((m.device_class, m.problem.op_class) for m in used).items()
            )
        },
        "sources": sorted(set(sources)),
    }
    model.evaluation = evaluation
    model.created = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return model


def model_of(merged: Sequence[MergedProblem], params: ModelParams) -> RankingModel:
    """A model of already merged problems (what each K-fold split trains)."""
    return _build(merged, params)


def save_model(model: RankingModel, path: str | Path) -> Path:
    """Write ``model`` as JSON, atomically (a reader sees the old file or the new one).

    Raises:
        ConfigFileError: the file cannot be written.
    """
    p = Path(path)
    atomic_write_text(p, json.dumps(model.to_json(), indent=1, allow_nan=False) + "\n")
    return p
