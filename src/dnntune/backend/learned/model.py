"""The learned engine-ranking model: a versioned JSON file, never pickle.

A model holds, per (device class, op class), the problems it was trained on, each with the
measured slowdown of every engine against the fastest one (``ratios``, the fastest is 1.0) and
the best known knob setting of an engine where a tuned variant was measured (``configs``).
Prediction (:mod:`dnntune.backend.learned.predict`) is a k-nearest-neighbour vote over those
points, so the file is the whole model: readable, diffable, and explainable by the problems it
holds. The format::

    {"format": "dnntune-heuristics-model", "format_version": 2, "feature_version": 2,
     "created": "...", "dnntune_version": "...",
     "params": {"k": 3, "radius": 3.0, "margin": 0.03, "min_confidence": 0.5, "weights": {},
                "per_class": {"norm": {"k": 5, "radius": 8.0}}},
     "training": {...}, "evaluation": {...} | null,
     "groups": [{"device_class": "nvidia-h200", "op_class": "norm",
                 "points": [{"problem": {...}, "ratios": {"CUDNN_ENGINE": 1.0, ...},
                             "configs": {"TORCH_ENGINE": {"knobs": {...}, "ratio": 0.98}},
                             "order_only": false, "records": 2, "sources": [...]}]}]}

Which file is used: ``DNNTUNE_HEUR_MODEL_PATH`` if set, else the model shipped with dnntune
(:data:`DEFAULT_MODEL`), if any. Loads are cached per (path, size, mtime) and thread-safe;
the writer (:func:`dnntune.learning.save_model`) replaces the file atomically, so a reader
sees the old model or the new one. Version 1 files (no ``per_class``) still load, and so do
files trained under feature version 1 (no ``fused`` feature): they are compared on version 1's
features, as they were trained.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dnntune import settings
from dnntune._file_kinds import document_kind
from dnntune._json_keys import DuplicateKeyError, loads
from dnntune._version import __version__
from dnntune.backend.learned.features import (
    DEFAULT_WEIGHTS,
    FEATURE_VERSION,
    READABLE_FEATURE_VERSIONS,
    FeatureValue,
    features,
)
from dnntune.backend.learned.problem import OP_CLASSES, Problem
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.graph.json_numbers import finite_float, short_repr

__all__ = [
    "DEFAULT_MODEL",
    "FORMAT",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "Group",
    "ModelParams",
    "Point",
    "RankingModel",
    "cached_model",
    "load_model",
    "model_path",
]

FORMAT = "dnntune-heuristics-model"
FORMAT_VERSION = 3
#: the versions :func:`load_model` reads: 1 (one k and radius for every op class), 2
#: (``params.per_class`` may give an op class its own) and 3 (``per_class`` may give a class
#: its own ``weights``; ``consensus`` and ``far_gain``)
READABLE_VERSIONS = (1, 2, 3)
#: the model shipped with dnntune (trained on the H200 suite; see docs/heuristics.md)
DEFAULT_MODEL = Path(__file__).with_name("default_model.json")
_RETRAIN = (
    "train a model (`dnntune heuristics train ... -o heuristics_model.json`) and point "
    "DNNTUNE_HEUR_MODEL_PATH at it, or unset it to use the shipped one; HeuristicMode.B falls "
    "back to the static order meanwhile"
)


@dataclass
class ModelParams:
    """How prediction uses the points (stored in the file, shown by ``heuristics show``).

    Attributes:
        k: neighbours that vote.
        radius: a problem whose nearest trained problem is farther than this (feature units:
            1 = a 2x difference in one size) is outside what the model has seen: declined.
        margin: the static order's first engine stays first unless the predicted best is
            faster than it by more than this fraction (measurements of a few % are noise).
        min_confidence: below this the prediction is declined (neighbours disagree).
        weights: feature weights (defaults: :data:`~dnntune.backend.learned.features.
            DEFAULT_WEIGHTS`; others 1).
        per_class: op class -> ``(k, radius)`` where that class has its own (chosen per
            class by the inner K-fold); other classes use ``k`` and ``radius``.
        class_weights: op class -> its own feature weights (format version 3: the op and
            ``fused`` weight chosen for that class by the inner K-fold, where it differs from
            the overall choice); other classes use ``weights``.
        consensus: format version 3; 0 = off. When at least this many neighbours vote and
            every one of them found the same engine fastest, that engine goes first even
            within ``margin`` of the static order's first (a gap every neighbour agrees on is
            not noise).
        far_gain: format version 3; None = off. Beyond ``radius`` (up to
            :data:`~dnntune.backend.learned.predict.FAR_REACH` radii) the model still answers
            when every neighbour there found the same engine fastest and its predicted
            speedup over the static order's first is at least this factor (3.0: 3x).
    """

    k: int = 3
    radius: float = 3.0
    margin: float = 0.03
    min_confidence: float = 0.5
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    per_class: dict[str, tuple[int, float]] = field(default_factory=dict)
    class_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    consensus: int = 0
    far_gain: float | None = None

    def for_class(self, op_class: str) -> ModelParams:
        """The parameters a problem of ``op_class`` is predicted with."""
        own = self.per_class.get(op_class)
        weights = self.class_weights.get(op_class)
        if own is None and weights is None:
            if not self.per_class and not self.class_weights:
                return self
            return replace(self, per_class={}, class_weights={})
        k, radius = own if own is not None else (self.k, self.radius)
        return replace(
            self,
            k=k,
            radius=radius,
            weights=self.weights if weights is None else weights,
            per_class={},
            class_weights={},
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "k": self.k,
            "radius": self.radius,
            "margin": self.margin,
            "min_confidence": self.min_confidence,
            "weights": dict(sorted(self.weights.items())),
        }
        own: dict[str, Any] = {}
        for c, k, r, weights in self.own_classes():
            own[c] = {"k": k, "radius": r}
            if weights is not None:
                own[c]["weights"] = dict(sorted(weights.items()))
        if own:
            out["per_class"] = own
        if self.consensus:
            out["consensus"] = self.consensus
        if self.far_gain is not None:
            out["far_gain"] = self.far_gain
        return out

    def own_classes(self) -> list[tuple[str, int, float, dict[str, float] | None]]:
        """(op class, k, radius, its own weights or None) of each op class with parameters of
        its own, sorted by class."""
        return [
            (c, *self.per_class.get(c, (self.k, self.radius)), self.class_weights.get(c))
            for c in sorted(set(self.per_class) | set(self.class_weights))
        ]

    @property
    def needs_version(self) -> int:
        """The oldest format version that can hold these parameters."""
        if self.class_weights or self.consensus or self.far_gain is not None:
            return 3
        return 2 if self.per_class else 1


@dataclass
class Point:
    """One trained problem: engine slowdowns against the fastest, best known configs."""

    problem: Problem
    ratios: dict[str, float]
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the ratios are nominal (a winner or an order without times: override files, exact cache)
    order_only: bool = False
    records: int = 1
    sources: list[str] = field(default_factory=list)
    _features: dict[int, dict[str, FeatureValue]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def features(self) -> dict[str, FeatureValue]:
        """The feature vector under the current feature version."""
        return self.features_for(FEATURE_VERSION)

    def features_for(self, version: int) -> dict[str, FeatureValue]:
        """The feature vector under feature ``version`` (a model's own), cached."""
        got = self._features.get(version)
        if got is None:
            got = self._features[version] = features(self.problem, version)
        return got

    def best(self, among: set[str] | None = None) -> str | None:
        """The fastest engine of this point (among ``among`` if given); ties by name."""
        items = [(r, e) for e, r in self.ratios.items() if among is None or e in among]
        return min(items)[1] if items else None

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem.to_json(),
            "ratios": {e: round(r, 6) for e, r in sorted(self.ratios.items())},
            "configs": {e: self.configs[e] for e in sorted(self.configs)},
            "order_only": self.order_only,
            "records": self.records,
            "sources": list(self.sources),
        }


@dataclass
class Group:
    """The points of one (device class, op class)."""

    device_class: str
    op_class: str
    points: list[Point] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "device_class": self.device_class,
            "op_class": self.op_class,
            "points": [p.to_json() for p in self.points],
        }


@dataclass
class RankingModel:
    """A trained model (see the module docstring)."""

    params: ModelParams = field(default_factory=ModelParams)
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None
    created: str = ""
    dnntune_version: str = __version__
    feature_version: int = FEATURE_VERSION
    #: the file it was loaded from ("" when built in memory)
    path: str = ""

    def group(self, device_class: str, op_class: str) -> Group | None:
        return self.groups.get((device_class, op_class))

    @property
    def point_count(self) -> int:
        return sum(len(g.points) for g in self.groups.values())

    def to_json(self) -> dict[str, Any]:
        created = self.created or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "format": FORMAT,
            "format_version": max(2, self.params.needs_version),
            "feature_version": self.feature_version,
            "created": created,
            "dnntune_version": self.dnntune_version,
            "params": self.params.to_json(),
            "training": self.training,
            "evaluation": self.evaluation,
            "groups": [self.groups[k].to_json() for k in sorted(self.groups)],
        }

    @classmethod
    def from_json(cls, doc: Any, path: str = "<model>") -> RankingModel:
        """Parse a model document; raises ConfigFileError naming the file, field and a fix."""
        return _parse(doc, path)


# ---- parsing -----------------------------------------------------------------------------------
class _Bad(Exception):
    """A malformed field: ``where`` is its JSON path."""

    def __init__(self, where: str, problem: str = "") -> None:
        super().__init__(f"{where}: {problem}" if problem else where)


def _number(value: Any, where: str, minimum: float = 0.0) -> float:
    number = finite_float(value)
    if number is None:
        raise _Bad(where, f"expected a finite number, got {short_repr(value)}")
    if number < minimum:
        raise _Bad(where, f"expected >= {minimum:g}, got {value!r}")
    return number


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(where, f"expected an object, got {type(value).__name__}")
    return value


def _k(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Bad(where, f"expected an int >= 1, got {value!r}")
    return value


def _weights(obj: Any, where: str) -> dict[str, float]:
    weights = {str(n): _number(v, f"{where}.{n}") for n, v in _obj(obj, where).items()}
    if weights and "fused" not in weights:  # training ties it to the op weight
        weights["fused"] = weights.get("op", DEFAULT_WEIGHTS["op"])
    return weights


def _params(obj: Any, version: int = FORMAT_VERSION) -> ModelParams:
    o = _obj(obj, "params")
    weights = _weights(o.get("weights", {}), "params.weights")
    per_class: dict[str, tuple[int, float]] = {}
    class_weights: dict[str, dict[str, float]] = {}
    for c, v in _obj(o.get("per_class", {}), "params.per_class").items():
        where = f"params.per_class.{c}"
        if c not in OP_CLASSES:
            raise _Bad(where, f"expected an op class of {OP_CLASSES}")
        v = _obj(v, where)
        per_class[str(c)] = (_k(v.get("k"), f"{where}.k"), _number(v.get("radius"), where))
        if "weights" in v:
            if version < 3:
                raise _Bad(f"{where}.weights", "needs format_version 3")
            class_weights[str(c)] = _weights(v["weights"], f"{where}.weights")
    for name in ("consensus", "far_gain"):
        if name in o and version < 3:
            raise _Bad(f"params.{name}", "needs format_version 3")
    consensus = o.get("consensus", 0)
    if isinstance(consensus, bool) or not isinstance(consensus, int) or consensus < 0:
        raise _Bad("params.consensus", f"expected an int >= 0, got {consensus!r}")
    far_gain = o.get("far_gain")
    if far_gain is not None:
        far_gain = _number(far_gain, "params.far_gain", 1.0)
    return ModelParams(
        k=_k(o.get("k", 3), "params.k"),
        radius=_number(o.get("radius", 3.0), "params.radius"),
        margin=_number(o.get("margin", 0.03), "params.margin"),
        min_confidence=_number(o.get("min_confidence", 0.5), "params.min_confidence"),
        weights=weights or dict(DEFAULT_WEIGHTS),
        per_class=per_class,
        class_weights=class_weights,
        consensus=consensus,
        far_gain=far_gain,
    )


def _point(obj: Any, where: str) -> Point:
    o = _obj(obj, where)
    try:
        problem = Problem.from_json(o.get("problem"), f"{where}.problem")
    except InvalidValueError as exc:  # its message names the field's full path
        raise _Bad(str(exc)) from None
    ratios = {
        str(e): _number(r, f"{where}.ratios.{e}", 0.0)
        for e, r in _obj(o.get("ratios"), f"{where}.ratios").items()
    }
    if not ratios:
        raise _Bad(f"{where}.ratios", "no engine")
    configs: dict[str, dict[str, Any]] = {}
    for e, c in _obj(o.get("configs", {}), f"{where}.configs").items():
        c = _obj(c, f"{where}.configs.{e}")
        knobs = dict(_obj(c.get("knobs", {}), f"{where}.configs.{e}.knobs"))
        configs[str(e)] = {"knobs": knobs, "ratio": _number(c.get("ratio"), f"{where}.configs.{e}")}
    sources = o.get("sources", [])
    if not isinstance(sources, list):
        raise _Bad(f"{where}.sources", "expected a list")
    records = o.get("records", 1)
    if isinstance(records, bool) or not isinstance(records, int) or records < 1:
        raise _Bad(f"{where}.records", f"expected an int >= 1, got {records!r}")
    return Point(
        problem,
        ratios,
        configs,
        bool(o.get("order_only", False)),
        records,
        [str(s) for s in sources],
    )


def _parse(doc: Any, path: str) -> RankingModel:
    fix = _RETRAIN
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        # an override file given to `heuristics show` (or as DNNTUNE_HEUR_MODEL_PATH) said only
        # that it is no model: say what it is, and what reads it
        kind = document_kind(doc)
        if kind is not None:
            raise ConfigFileError(f"{path}: {kind.not_a(f'a {FORMAT} file')}; {fix}")
        raise ConfigFileError(f'{path}: not a {FORMAT} file (no "format": "{FORMAT}"); {fix}')
    version = doc.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ConfigFileError(
            f"{path}: format_version {version!r} is not supported (this dnntune {__version__} "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))}); {fix}"
        )
    feature_version = doc.get("feature_version")
    if isinstance(feature_version, bool) or feature_version not in READABLE_FEATURE_VERSIONS:
        raise ConfigFileError(
            f"{path}: trained on feature_version {feature_version!r}, this dnntune reads "
            f"feature versions {', '.join(map(str, READABLE_FEATURE_VERSIONS))} (it computes "
            f"{FEATURE_VERSION}); {fix}"
        )
    try:
        params = _params(doc.get("params", {}), int(version))
        if version == 1 and params.per_class:
            raise _Bad("params.per_class", "needs format_version 2")
        groups: dict[tuple[str, str], Group] = {}
        raw_groups = doc.get("groups")
        if not isinstance(raw_groups, list):
            raise _Bad("groups", "expected a list")
        for i, g in enumerate(raw_groups):
            o = _obj(g, f"groups[{i}]")
            dc, oc = o.get("device_class"), o.get("op_class")
            if not isinstance(dc, str) or not dc:
                raise _Bad(f"groups[{i}].device_class", f"expected a name, got {dc!r}")
            if oc not in OP_CLASSES:
                raise _Bad(f"groups[{i}].op_class", f"expected one of {OP_CLASSES}, got {oc!r}")
            raw_points = o.get("points")
            if not isinstance(raw_points, list):
                raise _Bad(f"groups[{i}].points", "expected a list")
            points = [_point(p, f"groups[{i}].points[{j}]") for j, p in enumerate(raw_points)]
            if (dc, oc) in groups:
                raise _Bad(f"groups[{i}]", f"a second group for ({dc}, {oc})")
            groups[(dc, str(oc))] = Group(dc, str(oc), points)
        evaluation = doc.get("evaluation")
        training = doc.get("training", {})
        return RankingModel(
            params=params,
            groups=groups,
            training=dict(_obj(training, "training")),
            evaluation=None if evaluation is None else dict(_obj(evaluation, "evaluation")),
            created=str(doc.get("created", "")),
            dnntune_version=str(doc.get("dnntune_version", "")),
            feature_version=int(feature_version),
            path=path,
        )
    except _Bad as exc:
        raise ConfigFileError(f"{path}: {exc}; {fix}") from None


# ---- files -------------------------------------------------------------------------------------
def load_model(path: str | Path) -> RankingModel:
    """Read and check a model file.

    Raises:
        ConfigFileError: the file cannot be read, is not JSON (or nested too deeply to parse,
            or an object names a key twice), or is not a model of this format and feature
            version (the message names the file, the field and what to try).
    """
    p = Path(path)
    fix = _RETRAIN
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigFileError(f"{p}: cannot read the heuristics model: {reason}; {fix}") from None
    try:
        doc = loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {fix}"
        ) from None
    except RecursionError:  # nested deeper than the decoder can go (no model is)
        raise ConfigFileError(f"{p}: not valid JSON (nested too deeply); {fix}") from None
    except DuplicateKeyError as exc:  # json kept the last value (a hand edit), silently
        raise ConfigFileError(f"{p}: {exc}; {fix}") from None
    return _parse(doc, str(p))


def model_path() -> Path | None:
    """``DNNTUNE_HEUR_MODEL_PATH`` if set, else the shipped model if present, else None."""
    configured = settings.heur_model_path()
    if configured is not None:
        return configured
    return DEFAULT_MODEL if DEFAULT_MODEL.is_file() else None


_CACHE: dict[str, tuple[tuple[int, int], RankingModel]] = {}
_CACHE_LOCK = threading.Lock()


def cached_model(path: str | Path) -> RankingModel:
    """:func:`load_model`, cached while the file's size and mtime stay the same."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        fix = _RETRAIN
        reason = exc.strerror or str(exc)
        raise ConfigFileError(f"{p}: cannot read the heuristics model: {reason}; {fix}") from None
    stamp = (st.st_size, st.st_mtime_ns)
    key = str(p.resolve())
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    model = load_model(p)  # outside the lock: a slow read never blocks other files
    with _CACHE_LOCK:
        _CACHE[key] = (stamp, model)
    return model
