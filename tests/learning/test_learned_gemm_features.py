"""Feature version 3: the GEMM-derived features (arithmetic intensity, N*K, flops, alignment to
64), off unless a model's weights name them, chosen by the inner folds; files of feature
versions 1 and 2 keep their distances, and a file that names them under an older feature
version is refused."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from learning_helpers import H200, F, layernorm, matmul, named, rec

import dnntune as dt
from dnntune.backend.heuristics import STATIC_POLICY, HeuristicMode, order_engines
from dnntune.backend.learned import (
    ModelParams,
    Prediction,
    Problem,
    load_model,
    predict,
    problem_of,
)
from dnntune.backend.learned.features import (
    DEFAULT_WEIGHTS,
    FEATURE_VERSION,
    GEMM_FEATURES,
    READABLE_FEATURE_VERSIONS,
    distance,
    features,
)
from dnntune.cli.heuristics_cmd import _fold_params
from dnntune.errors import ConfigFileError
from dnntune.learning import Record, merge, save_model, train
from dnntune.learning import evaluation as ev

PAIR = ["CUDNN_ENGINE", "TORCH_ENGINE"]


def test_gemm_features_of_version_3() -> None:
    assert FEATURE_VERSION == 3 and READABLE_FEATURE_VERSIONS == (1, 2, 3)
    f = features(problem_of(matmul(8, 4096, 11008)))
    mnk = 8 * 11008 * 4096
    assert f["log2_ai"] == pytest.approx(
        math.log2(mnk / (8 * 4096 + 4096 * 11008 + 8 * 11008)), abs=1e-6
    )
    assert f["log2_nk"] == pytest.approx(math.log2(4096 * 11008), abs=1e-6)
    assert f["log2_flops"] == pytest.approx(math.log2(mnk), abs=1e-6)
    assert f["aligned64"] == 0.0  # M = 8
    assert features(problem_of(matmul(64, 1024, 1024)))["aligned64"] == 1.0
    # version 2 (and 1) have none of them; other op classes never do
    assert not set(GEMM_FEATURES) & set(features(problem_of(matmul(8, 64, 64)), version=2))
    assert not set(GEMM_FEATURES) & set(features(problem_of(layernorm(8192, 1024))))
    # a GEMM whose sizes are unknown (an override entry without tensors): unknown, not absent
    unknown = features(Problem("matmul", "half"))
    assert all(unknown[n] is None for n in GEMM_FEATURES)


def test_gemm_features_are_off_unless_the_weights_name_them() -> None:
    a, b = problem_of(matmul(8, 4096, 4096)), problem_of(matmul(64, 1024, 1024))
    v2 = distance(features(a, version=2), features(b, version=2))
    assert distance(features(a), features(b)) == pytest.approx(v2)
    assert distance(features(a), features(b), DEFAULT_WEIGHTS) == pytest.approx(v2)
    on = distance(features(a), features(b), {**DEFAULT_WEIGHTS, "aligned64": 2.0})
    assert on == pytest.approx(math.sqrt(v2**2 + 2.0**2))


def _alignment_matters() -> list[Record]:
    """GEMMs whose M is a multiple of 64 (TORCH_ENGINE 1.3x faster than cuDNN, A's first) or
    one more (cuDNN 1.3x faster): by size alone each problem's nearest is of the other kind."""
    out = []
    for i in range(1, 7):
        m = 64 + 128 * i
        out.append(rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.3}))
        out.append(rec(matmul(m + 1, 1024, 1024), {"CUDNN_ENGINE": 1.0, "TORCH_ENGINE": 1.3}))
    return out


def test_the_inner_folds_choose_a_gemm_feature_where_it_helps() -> None:
    assert ev.FEATURE_PROFILES[0] == {}
    assert all(set(p) <= set(GEMM_FEATURES) for p in ev.FEATURE_PROFILES)
    base = ModelParams(min_confidence=0.0)
    merged = merge(_alignment_matters())
    chosen = ev.select_params(merged, base, ((1, 3.0),), k=4, rules=())
    assert chosen.for_class("matmul").weights.get("aligned64") == 1.0
    assert ev._params_json(chosen)["features"] == {"aligned64": 1.0}
    assert "+aligned64" in _fold_params(ev._params_json(chosen))
    # no profile to choose from: the base's weights are kept (no GEMM feature)
    plain = ev.select_params(merged, base, ((1, 3.0),), k=4, rules=(), profiles=())
    assert not any(plain.weights.get(n) for n in GEMM_FEATURES)
    assert "features" not in ev._params_json(plain)
    # nested: B follows the alignment on held-out GEMMs
    nested = ev.evaluate(_alignment_matters(), ModelParams(k=1, radius=3.0), k=4)
    assert nested.summary()["B"]["top1"] < 0.5  # by size alone: the other kind's answer


def test_where_no_feature_helps_the_tie_goes_to_none() -> None:
    same = [
        rec(matmul(m, 1024, 1024), {"CUDNN_ENGINE": 1.0, "TORCH_ENGINE": 1.3})
        for m in (8, 16, 32, 64, 128, 256)
    ]
    chosen = ev.select_params(merge(same), ModelParams(), ((1, 3.0),), k=3, rules=())
    assert not any(chosen.weights.get(n) for n in GEMM_FEATURES)
    assert not chosen.class_weights


def _gemm_model_params() -> ModelParams:
    return ModelParams(
        k=1,
        radius=3.0,
        weights={**DEFAULT_WEIGHTS, "log2_ai": 1.0},
        per_class={"matmul": (1, 3.0)},
        class_weights={"matmul": {**DEFAULT_WEIGHTS, "aligned64": 1.0}},
        min_confidence=0.0,
    )


def test_a_model_with_gemm_features_round_trips(tmp_path: Path) -> None:
    model = train(_alignment_matters(), _gemm_model_params())
    path = save_model(model, tmp_path / "model.json")
    doc = json.loads(path.read_text())
    assert doc["feature_version"] == 3
    assert doc["params"]["weights"]["log2_ai"] == 1.0
    assert doc["params"]["per_class"]["matmul"]["weights"]["aligned64"] == 1.0
    loaded = load_model(path)
    assert loaded.params.weights == model.params.weights
    assert loaded.params.class_weights == model.params.class_weights
    query = problem_of(matmul(960, 1024, 1024))  # a multiple of 64, nearest by size: M = 833
    got = predict(loaded, query, H200, PAIR)
    assert got == predict(model, query, H200, PAIR)
    assert isinstance(got, Prediction) and got.engines[0] == "TORCH_ENGINE"


def test_a_feature_version_2_file_keeps_its_distances(tmp_path: Path) -> None:
    model = train(_alignment_matters(), ModelParams(k=1, radius=3.0, min_confidence=0.0))
    path = save_model(model, tmp_path / "model.json")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "feature_version": 2}))
    loaded = load_model(path)
    assert loaded.feature_version == 2
    query = problem_of(matmul(960, 1024, 1024))
    got = predict(loaded, query, H200, PAIR)
    assert isinstance(got, Prediction)
    want = distance(features(query, version=2), features(problem_of(matmul(833, 1024, 1024)), 2))
    assert got.neighbours[0].distance == pytest.approx(want, abs=1e-4)
    assert got.engines[0] == "CUDNN_ENGINE"  # by size alone: M = 833's cuDNN


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"weights": {"op": 4.0, "log2_ai": 1.0}}, r"params\.weights\.log2_ai: needs feature_v"),
        (
            {"per_class": {"matmul": {"k": 1, "radius": 3, "weights": {"aligned64": 2}}}},
            r"params\.per_class\.matmul\.weights\.aligned64: needs feature_version 3",
        ),
    ],
)
@pytest.mark.parametrize("feature_version", [1, 2])
def test_gemm_weights_in_an_older_feature_version_are_refused(
    tmp_path: Path, params: dict, match: str, feature_version: int
) -> None:
    doc = train(_alignment_matters()).to_json()
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**doc, "format_version": 3, "feature_version": feature_version}))
    load_model(path)  # without the weights it loads
    path.write_text(
        json.dumps(
            {**doc, "format_version": 3, "feature_version": feature_version, "params": params}
        )
    )
    with pytest.raises(ConfigFileError, match=match) as info:
        load_model(path)
    assert str(path) in str(info.value) and "DNNTUNE_HEUR_MODEL_PATH" in str(info.value)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({"log2_ai": -1}, r"params\.weights\.log2_ai: expected >= 0"),
        ({"aligned64": "on"}, r"params\.weights\.aligned64: expected a finite number"),
        ({"log2_nk": True}, r"params\.weights\.log2_nk: expected a finite number"),
    ],
)
def test_malformed_gemm_weights_name_the_field(tmp_path: Path, weights: dict, match: str) -> None:
    doc = train(_alignment_matters()).to_json()
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**doc, "params": {"weights": weights}}))
    with pytest.raises(ConfigFileError, match=match):
        load_model(path)


def test_a_mismatched_gemm_model_falls_back_to_the_static_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    handle = dt.create_handle("cpu")
    doc = train(_alignment_matters()).to_json()
    bad = tmp_path / "model.json"
    params = {"weights": {"op": 4.0, "log2_flops": 1.0}}
    bad.write_text(json.dumps({**doc, "feature_version": 2, "params": params}))
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", str(bad))
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    with caplog.at_level(logging.WARNING, logger="dnntune.backend.heuristics"):
        decision = order_engines(matmul(8, 64, 64, F), handle, cands, HeuristicMode.B)
    assert decision.policy == STATIC_POLICY
    assert any("log2_flops: needs feature_version 3" in r.getMessage() for r in caplog.records)
