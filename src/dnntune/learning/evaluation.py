"""Grouped K-fold evaluation of the learned ranking against the static order (HeuristicMode.A).

Problems are grouped by shape (:meth:`~dnntune.backend.learned.Problem.shape_key`: op class and
sizes, with no data type, layout or epilogue), and every group lands in exactly one fold, so
no shape of a test fold is seen in training in any type or layout. Groups are dealt to folds
round-robin within each op class, in an order fixed by a hash of the shape and the seed, so
every fold holds a mix of op classes and the split is the same on every run.

For each test problem (measured, two or more engines) the model trained on the other folds
orders the measured engines as ``HeuristicMode.B`` would (candidates handed over in A's
order; a decline falls back to A's pick, as the policy chain does). Scored against the
fastest measured engine:

* top-1: the pick is the fastest engine;
* within 2 %: the pick is at most 2 % slower than the fastest;
* regret: ``t(pick) / t(best) - 1``; geomean (of the ratios, minus 1), mean, p95, max;
* coverage: the share of test problems where the model answered instead of declining;
* top-1 over the clear problems (``top1_clear`` of ``n_clear``): those whose best two
  measured engines differ by at least 2 % (closer ones are near-ties, within noise).

Model parameters (``k``, ``radius`` and the op-kind weight) are either given, or chosen per
outer fold by an inner grouped K-fold over that fold's training problems only
(:func:`select_params`, over :data:`OP_WEIGHTS` x :data:`PARAM_GRID`): nested
cross-validation, so the score of a test fold never steered the parameters it is scored with.
The inner K-fold also gives an op class its own (k, radius) where one scores strictly better
on that class's inner cases than the overall choice (``ModelParams.per_class``). The shipped
model's parameters are chosen the same way on all the data.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dnntune.backend.learned import Decline, ModelParams, RankingModel, predict
from dnntune.backend.learned.features import DEFAULT_WEIGHTS, tied_weights
from dnntune.learning.records import MergedProblem, Record, merge
from dnntune.learning.training import model_of, static_order_names, static_pick, train

__all__ = [
    "CONSENSUS",
    "EVALUATION_FORMAT",
    "FAR_GAIN",
    "OP_WEIGHTS",
    "PARAM_GRID",
    "VOTE_RULES",
    "Case",
    "Evaluation",
    "evaluate",
    "grouped_folds",
    "regret_summary",
    "select_params",
    "train_and_evaluate",
    "training_params",
]

#: the ``format`` of ``heuristics train --json``'s file (:meth:`Evaluation.to_json`)
EVALUATION_FORMAT = "dnntune-heuristics-evaluation"
#: a pick this close to the fastest counts as "within 2 %"
NEAR_BEST = 1.02
#: (k, radius) pairs :func:`select_params` tries; ties go to the earlier (more conservative)
PARAM_GRID: tuple[tuple[int, float], ...] = tuple(
    (k, r) for r in (3.0, 4.0, 6.0, 8.0, 12.0) for k in (1, 3, 5)
)
#: the ``op`` feature weights :func:`select_params` tries, the default first (ties go to it).
#: ``op`` tells kinds apart within an op class (conv fprop, dgrad and wgrad; layernorm and
#: rmsnorm): 4 (the default) keeps them apart, beyond the smallest radius; 1 lets a kind
#: learn from its sibling of similar sizes, as far off as a 2x difference in one size. The
#: ``fused`` weight (an epilogue or none) is set to the same value
OP_WEIGHTS: tuple[float, ...] = (DEFAULT_WEIGHTS["op"], 1.0)
#: the vote rules of format version 3 (the files of earlier versions leave both off): a
#: unanimous vote of at least ``CONSENSUS`` neighbours overrides the margin, and beyond the
#: radius (up to ``FAR_REACH`` radii) a unanimous predicted speedup of at least ``FAR_GAIN``x
#: over the static order's first engine still answers
CONSENSUS = 3
FAR_GAIN = 3.0
#: the (consensus, far_gain) pairs :func:`select_params` tries with every (op weight, k,
#: radius), both off first (ties go to it): the inner folds decide whether a model uses them,
#: as they decide k and the radius. (Their values were found by comparing variants on the
#: held-out results of the H200 records, session 30: docs/heuristics.md.)
VOTE_RULES: tuple[tuple[int, float | None], ...] = (
    (0, None),
    (CONSENSUS, None),
    (0, FAR_GAIN),
    (CONSENSUS, FAR_GAIN),
)


def training_params(**changes: Any) -> ModelParams:
    """Parameters with both vote rules on (``CONSENSUS``, ``FAR_GAIN``): what ``heuristics
    train --k/--radius`` trains with (fixed parameters, no inner folds)."""
    return replace(ModelParams(consensus=CONSENSUS, far_gain=FAR_GAIN), **changes)


def grouped_folds(problems: Sequence[MergedProblem], k: int, seed: int = 0) -> list[list[int]]:
    """Indices of ``problems`` per fold; a shape group never spans two folds."""
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(problems):
        groups.setdefault(m.problem.shape_key(), []).append(i)
    k = max(1, min(k, len(groups)))

    def order(shape: str) -> str:
        return hashlib.sha256(f"{seed}:{shape}".encode()).hexdigest()

    by_class: dict[str, list[str]] = {}
    for shape in groups:
        by_class.setdefault(shape.split(":", 1)[0], []).append(shape)
    folds: list[list[int]] = [[] for _ in range(k)]
    dealt = 0
    for op_class in sorted(by_class):
        for shape in sorted(by_class[op_class], key=order):
            folds[dealt % k].extend(groups[shape])
            dealt += 1
    return folds


@dataclass
class Case:
    """One test problem of the K-fold evaluation."""

    problem: str
    op_class: str
    fold: int
    best: str
    a_pick: str
    b_pick: str
    a_ratio: float
    b_ratio: float
    answered: bool
    reason: str
    #: the second-fastest measured engine's slowdown (how far apart the best two are)
    runner_up: float = math.inf
    #: the device class the problem was measured on (records of several devices: a test
    #: problem is scored with its own device's group, as the policy predicts)
    device_class: str = ""

    @property
    def clear(self) -> bool:
        """The best two engines differ by at least 2 % (closer ones are a near-tie: noise)."""
        return self.runner_up >= NEAR_BEST


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def regret_summary(
    ratios: Sequence[float], clear: Sequence[bool] | None = None
) -> dict[str, float | int]:
    """top-1, within 2 %, and regret (geomean, mean, p95, max) of picks' ``t / t_best``;
    with ``clear`` (per pick: the best two engines differ by >= 2 %), also top-1 over the
    clear ones (``top1_clear`` of ``n_clear``)."""
    if not ratios:
        return {"n": 0}
    regrets = [r - 1.0 for r in ratios]
    extra: dict[str, float | int] = {}
    if clear is not None:
        kept = [r for r, c in zip(ratios, clear, strict=True) if c]
        extra["n_clear"] = len(kept)
        if kept:
            extra["top1_clear"] = sum(1 for r in kept if r <= 1.0 + 1e-9) / len(kept)
    return {
        "n": len(ratios),
        **extra,
        "top1": sum(1 for r in ratios if r <= 1.0 + 1e-9) / len(ratios),
        "within_2pct": sum(1 for r in ratios if r <= NEAR_BEST) / len(ratios),
        "regret_geomean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)) - 1.0,
        "regret_mean": sum(regrets) / len(regrets),
        "regret_p95": _p95(regrets),
        "regret_max": max(regrets),
    }


@dataclass
class Evaluation:
    """The K-fold cases and their summary."""

    folds: int
    shape_groups: int
    cases: list[Case]
    #: the parameters each outer fold was scored with (chosen by inner K-fold unless given)
    fold_params: list[ModelParams]
    selected: bool

    def summary(self) -> dict[str, Any]:
        def scores(cs: Sequence[Case], pick: str) -> dict[str, float | int]:
            ratios = [c.a_ratio if pick == "A" else c.b_ratio for c in cs]
            return regret_summary(ratios, [c.clear for c in cs])

        def split(field: str) -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            for value in sorted({getattr(c, field) for c in self.cases}):
                cs = [c for c in self.cases if getattr(c, field) == value]
                out[value] = {
                    "A": scores(cs, "A"),
                    "B": scores(cs, "B"),
                    "answered": sum(c.answered for c in cs),
                }
            return out

        # records of several devices: each device's own scores too (one device: none, so a
        # single-device summary reads as before)
        devices = split("device_class")
        by_device = {"by_device": devices} if len(devices) > 1 else {}
        return {
            "method": "grouped K-fold by shape (op class + sizes)"
            + (
                ", vote rules, k, radius and op weight chosen by an inner grouped K-fold per fold"
                if self.selected
                else ""
            ),
            "folds": self.folds,
            "fold_params": [_params_json(p) for p in self.fold_params],
            "problems": len(self.cases),
            "shape_groups": self.shape_groups,
            "coverage": sum(c.answered for c in self.cases) / len(self.cases) if self.cases else 0,
            "changed_pick": sum(c.b_pick != c.a_pick for c in self.cases),
            "b_better": sum(c.b_ratio < c.a_ratio - 1e-9 for c in self.cases),
            "b_worse": sum(c.b_ratio > c.a_ratio + 1e-9 for c in self.cases),
            "A": scores(self.cases, "A"),
            "B": scores(self.cases, "B"),
            "by_op_class": split("op_class"),
            **by_device,
        }

    def to_json(self) -> dict[str, Any]:
        """The summary with every case, marked as an evaluation (``train --json``)."""
        cases = [_case_json(c) for c in self.cases]
        return {"format": EVALUATION_FORMAT, **self.summary(), "cases": cases}


def _case_json(case: Case) -> dict[str, Any]:
    out = asdict(case)
    out["runner_up"] = None if math.isinf(case.runner_up) else round(case.runner_up, 6)
    return out


def _params_json(p: ModelParams) -> dict[str, Any]:
    out: dict[str, Any] = {"k": p.k, "radius": p.radius, "op_weight": _op_weight(p)}
    if p.consensus:
        out["consensus"] = p.consensus
    if p.far_gain is not None:
        out["far_gain"] = p.far_gain
    own: dict[str, Any] = {}
    for c, k, r, weights in p.own_classes():
        own[c] = {"k": k, "radius": r}
        if weights is not None:
            own[c]["op_weight"] = weights.get("op", DEFAULT_WEIGHTS["op"])
    if own:
        out["per_class"] = own
    return out


def _op_weight(p: ModelParams) -> float:
    return p.weights.get("op", DEFAULT_WEIGHTS["op"])


def _cases(
    merged: Sequence[MergedProblem],
    folds: Sequence[Sequence[int]],
    params_for: Callable[[list[MergedProblem]], ModelParams],
) -> tuple[list[Case], list[ModelParams]]:
    fold_of = {i: f for f, members in enumerate(folds) for i in members}
    cases: list[Case] = []
    chosen: list[ModelParams] = []
    for members in folds:
        test = set(members)
        train = [m for i, m in enumerate(merged) if i not in test]
        params = params_for(train)
        chosen.append(params)
        model = model_of(train, params)
        for i in members:
            m = merged[i]
            if m.order_only or len(m.ratios) < 2:
                continue  # nothing to score a pick against
            candidates = static_order_names(m, list(m.ratios))
            a_pick = static_pick(m)
            result = predict(model, m.problem, m.device_class, candidates)
            answered = not isinstance(result, Decline)
            b_pick = a_pick if isinstance(result, Decline) else result.engines[0]
            reason = result.reason
            cases.append(
                Case(
                    m.problem.label(),
                    m.problem.op_class,
                    fold_of[i],
                    m.best,
                    a_pick,
                    b_pick,
                    round(m.ratios[a_pick], 6),
                    round(m.ratios[b_pick], 6),
                    answered,
                    reason,
                    sorted(m.ratios.values())[1],
                    m.device_class,
                )
            )
    return cases, chosen


def _fixed(params: ModelParams) -> Callable[[list[MergedProblem]], ModelParams]:
    return lambda _train: params


def _score(cases: Sequence[Case]) -> tuple[float, float]:
    b = regret_summary([c.b_ratio for c in cases])
    return (round(float(b.get("regret_geomean", 0.0)), 6), -float(b.get("top1", 0.0)))


def select_params(
    merged: Sequence[MergedProblem],
    base: ModelParams | None = None,
    grid: Sequence[tuple[int, float]] = PARAM_GRID,
    k: int = 5,
    seed: int = 0,
    per_class: bool = True,
    op_weights: Sequence[float] = OP_WEIGHTS,
    rules: Sequence[tuple[int, float | None]] = VOTE_RULES,
) -> ModelParams:
    """The (vote rules, op weight, k, radius) of ``rules`` x ``op_weights`` x ``grid`` with the
    lowest grouped K-fold regret geomean on ``merged`` (then the best top-1, then the
    earliest: the first rules, the first op weight, the earliest in the grid); ``base``
    otherwise. An empty ``op_weights`` keeps ``base``'s, an empty ``rules`` its
    ``consensus`` and ``far_gain``.

    ``per_class``: also choose a (k, radius) and op weight per op class the same way, under
    the vote rules chosen, scored on that class's cases only (:attr:`ModelParams.per_class`,
    and :attr:`ModelParams.class_weights` where the class's op weight differs from the overall
    one); a class keeps the overall choice unless another scores strictly better on it.
    """
    base = base or ModelParams()
    if len({m.problem.shape_key() for m in merged}) < 2:
        return base
    folds = grouped_folds(merged, k, seed)
    tried: list[tuple[ModelParams, list[Case]]] = []
    for consensus, far_gain in rules or [(base.consensus, base.far_gain)]:
        for weight in op_weights or [_op_weight(base)]:
            weights = tied_weights(base.weights, weight)  # the fused weight follows op's
            for n, radius in grid:
                params = replace(
                    base,
                    k=n,
                    radius=radius,
                    per_class={},
                    class_weights={},
                    weights=weights,
                    consensus=consensus,
                    far_gain=far_gain,
                )
                tried.append((params, _cases(merged, folds, _fixed(params))[0]))
    if not tried:
        return base

    def key(i: int, op_class: str | None) -> tuple[tuple[float, float], int]:
        return (_score([c for c in tried[i][1] if op_class in (None, c.op_class)]), i)

    first = min(range(len(tried)), key=lambda i: key(i, None))
    chosen = tried[first][0]
    if not per_class:
        return chosen
    own: dict[str, tuple[int, float]] = {}
    own_w: dict[str, dict[str, float]] = {}
    # a class's own (k, radius) and op weight, among the points tried under the vote rules
    # chosen (format version 3; version 2 chose a class's k and radius at the overall op
    # weight only)
    rule = (chosen.consensus, chosen.far_gain)
    same = [i for i, (p, _) in enumerate(tried) if (p.consensus, p.far_gain) == rule]
    for op_class in sorted({c.op_class for c in tried[0][1]}):
        i = min(same, key=lambda i: key(i, op_class))
        # a class keeps the overall choice unless another one scores strictly better on it
        if key(i, op_class)[0] < key(first, op_class)[0]:
            p = tried[i][0]
            own[op_class] = (p.k, p.radius)
            if p.weights != chosen.weights:
                own_w[op_class] = dict(p.weights)
    return replace(chosen, per_class=own, class_weights=own_w)


def evaluate(
    records: Sequence[Record],
    params: ModelParams | None = None,
    k: int = 5,
    seed: int = 0,
    grid: Sequence[tuple[int, float]] = PARAM_GRID,
    per_class: bool = True,
    op_weights: Sequence[float] = OP_WEIGHTS,
) -> Evaluation:
    """Grouped K-fold evaluation of ``records`` (see the module docstring).

    ``params`` None: nested -- each outer fold's vote rules, k, radius and op weight are
    chosen from :data:`VOTE_RULES`, ``grid`` and ``op_weights`` by an inner grouped K-fold over
    its training problems. Given: used as they are.
    """
    merged = merge(records)
    folds = grouped_folds(merged, k, seed)
    if params is not None:
        cases, chosen = _cases(merged, folds, _fixed(params))
    else:
        cases, chosen = _cases(
            merged,
            folds,
            lambda train: select_params(train, None, grid, k, seed, per_class, op_weights),
        )
    shapes = len({m.problem.shape_key() for m in merged})
    return Evaluation(len(folds), shapes, cases, chosen, params is None)


def train_and_evaluate(
    records: Sequence[Record],
    params: ModelParams | None = None,
    k: int = 5,
    seed: int = 0,
    sources: Sequence[str] = (),
    per_class: bool = True,
) -> tuple[RankingModel, Evaluation]:
    """Evaluate (nested unless ``params`` is given), then train on all the records with
    ``params`` or the parameters chosen on all of them; the model carries the evaluation."""
    evaluation = evaluate(records, params, k, seed, PARAM_GRID, per_class)
    final = (
        params
        if params is not None
        else select_params(merge(records), None, PARAM_GRID, k, seed, per_class)
    )
    model = train(records, final, sources, evaluation.summary())
    return model, evaluation
