"""Predict an engine ranking for a problem: a k-nearest-neighbour vote over trained problems.

For a problem on a device:

1. the model's group for (device class, op class); none: declined;
2. the trained problems of that group by feature distance (with the op class's own weights,
   where the model has them); the nearest farther than the model's ``radius``: declined (the
   problem is outside what the model has seen), unless the model has a ``far_gain`` (format
   version 3), the nearest is within :data:`FAR_REACH` radii, every neighbour voting there
   found the same engine fastest, it is not the static order's first, and its predicted
   speedup over that engine is at least ``far_gain`` (a 5x gap one neighbour away is not
   noise, where a radius chosen on the other classes would hide it);
3. the ``k`` nearest within the radius vote (only the trained problems at distance 0 when
   there are any: a problem the model was trained on follows its own measurements), each
   weighted ``1 / (1 + distance)``: an engine's
   score is the weighted geometric mean of its slowdown against the fastest engine over the
   neighbours that measured it (1.0: it was the fastest everywhere);
4. the candidates are ordered by score; the static order's first engine stays first unless the
   best score beats its score by more than ``margin`` (a few % is measurement noise), or at
   least ``consensus`` neighbours vote (format version 3; 0: off) and every one found the
   best-scored engine fastest (a gap every neighbour agrees on is not noise); candidates no
   neighbour measured follow, in the static order;
5. confidence = the weight share of neighbours whose own fastest candidate is the predicted
   first engine, times ``1 - d / (2 radius)`` for the nearest distance ``d``; below the
   model's ``min_confidence``: declined.

A declined prediction is a :class:`Decline` with the reason; the heuristics chain then falls
through to the static order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.backend.learned.features import distance, features
from dnntune.backend.learned.model import Point, RankingModel
from dnntune.backend.learned.problem import Problem

#: beyond the radius (up to this many radii) a unanimous, large predicted gain still answers
FAR_REACH = 2.0

__all__ = ["Decline", "FAR_REACH", "Neighbour", "Prediction", "predict"]


@dataclass
class Neighbour:
    """A trained problem that voted: its description, distance and weight."""

    label: str
    distance: float
    weight: float
    best: str | None


@dataclass
class Prediction:
    """The candidates in predicted order, with what the order rests on."""

    engines: list[str]
    #: predicted slowdown against the fastest engine (1.0 = fastest), engines with data only
    scores: dict[str, float]
    confidence: float
    neighbours: list[Neighbour]
    #: knob settings for an engine when every voting neighbour that tuned it agrees
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: True when the static order's first engine was kept first within ``margin``
    kept_static: bool = False

    @property
    def reason(self) -> str:
        near = self.neighbours[0]
        return (
            f"learned ranking: {self.engines[0]} first (confidence {self.confidence:.2f}, "
            f"{len(self.neighbours)} neighbour(s), nearest {near.label!r} at "
            f"{near.distance:.2f})"
        )


@dataclass
class Decline:
    """No prediction, and why (shown in logs and by ``dnntune heuristics``)."""

    reason: str


def _votes(
    model: RankingModel, points: Sequence[Point], problem: Problem, weights: Mapping[str, float]
) -> list[tuple[float, Point]]:
    version = model.feature_version  # a model is compared on the features it was trained on
    q = features(problem, version)
    ranked = sorted(
        ((distance(q, p.features_for(version), weights), i, p) for i, p in enumerate(points)),
        key=lambda item: (item[0], item[1]),
    )
    return [(d, p) for d, _, p in ranked]


def _agreed_knobs(engine: str, voters: Sequence[Point]) -> dict[str, Any] | None:
    tuned = [p.configs.get(engine) for p in voters if engine in p.ratios]
    if not tuned or any(c is None for c in tuned):
        return None
    knobs = [c["knobs"] for c in tuned if c is not None]
    first = knobs[0]
    return dict(first) if first and all(k == first for k in knobs) else None


def predict(
    model: RankingModel,
    problem: Problem,
    device_class: str,
    candidates: Sequence[str],
) -> Prediction | Decline:
    """Order ``candidates`` (engine names, in the static order) for ``problem``.

    Returns a :class:`Prediction`, or a :class:`Decline` saying why not (see the module
    docstring for the rules).
    """
    if not candidates:
        return Decline("no candidates")
    group = model.group(device_class, problem.op_class)
    if group is None or not group.points:
        return Decline(f"the model has no {problem.op_class} problems for device {device_class}")
    params = model.params.for_class(problem.op_class)
    ranked = _votes(model, group.points, problem, params.weights)
    nearest = ranked[0][0]
    reach = params.radius
    far = nearest > params.radius
    if far:
        outside = Decline(
            f"outside the trained data: nearest {problem.op_class} problem "
            f"{ranked[0][1].problem.label()!r} is {nearest:.2f} away (radius {params.radius:g})"
        )
        if params.far_gain is None or nearest > FAR_REACH * params.radius:
            return outside
        reach = FAR_REACH * params.radius
    voters = [(d, p) for d, p in ranked[: params.k] if d <= reach]
    if nearest == 0.0:
        # the problem itself was trained: its own measurements decide, not its neighbours'
        # (the shipped model followed four cuDNN neighbours on a layernorm whose own three
        # sessions all had Triton 1.16x faster). A held-out problem is never at distance 0
        voters = [(d, p) for d, p in ranked if d == 0.0]
    wanted = set(candidates)
    sums: dict[str, tuple[float, float]] = {}
    for d, p in voters:
        w = 1.0 / (1.0 + d)
        for engine, ratio in p.ratios.items():
            if engine in wanted:
                s, ws = sums.get(engine, (0.0, 0.0))
                sums[engine] = (s + w * math.log(max(ratio, 1e-9)), ws + w)
    if not sums:
        return Decline(f"no neighbour measured any of the candidates ({', '.join(candidates)})")
    scores = {e: math.exp(s / ws) for e, (s, ws) in sums.items()}
    static_first = candidates[0]
    known = sorted(scores, key=lambda e: (scores[e], candidates.index(e)))
    kept = False
    within_margin = (
        static_first in scores
        and known[0] != static_first
        and scores[static_first] <= scores[known[0]] * (1.0 + params.margin)
    )
    if within_margin and params.consensus >= 1:
        # every voting neighbour found the challenger fastest: a consistent gap, not noise
        bests = [p.best(wanted) for _, p in voters]
        within_margin = not (len(bests) >= params.consensus and all(b == known[0] for b in bests))
    if within_margin:
        known.remove(static_first)
        known.insert(0, static_first)
        kept = True
    order = [*known, *(e for e in candidates if e not in scores)]
    top = order[0]
    neighbours = []
    agree = total = 0.0
    for d, p in voters:
        w = 1.0 / (1.0 + d)
        best = p.best(wanted)
        neighbours.append(Neighbour(p.problem.label(), round(d, 4), round(w, 4), best))
        total += w
        agree += w if best == top else 0.0
    if far:
        gain = scores.get(candidates[0], 0.0) / scores[top] if top in scores else 0.0
        if (
            any(n.best != top for n in neighbours)
            or top == candidates[0]
            or params.far_gain is None
            or gain < params.far_gain
        ):
            return outside
    # radius 0 takes exact matches only (nearest is then 0): full confidence in distance, not a
    # division by zero (new-user audit, session 56: ``--radius 0`` made predict raise)
    closeness = max(0.0, 1.0 - nearest / (2.0 * reach)) if reach > 0 else 1.0
    confidence = (agree / total) * closeness
    if confidence < params.min_confidence:
        return Decline(
            f"neighbours disagree: confidence {confidence:.2f} < {params.min_confidence:g} "
            f"for {top} first"
        )
    knobs = {}
    agreed = _agreed_knobs(top, [p for _, p in voters])
    if agreed:
        knobs[top] = agreed
    return Prediction(
        order,
        {e: round(s, 4) for e, s in scores.items()},
        round(confidence, 3),
        neighbours,
        knobs,
        kept,
    )
